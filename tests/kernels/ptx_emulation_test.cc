// The warp-accurate emulation of kernels/cuda/ptx.cuh (cuda_emulation/kernels/cuda/ptx.cuh on
// warp_runtime.h), tested on its own before any kernel relies on it: matrix products through
// emulated fragments equal plain products, ldmatrix .trans gives the transpose, a shuffle
// reduction gives the sum, cp.async copies when its group is waited for, atomicAdd sums, the
// order threads are resumed in decides unsynchronised accesses only, and the runtime stops a
// divergent warp instead of hanging. The fragment layouts below are written from the PTX ISA
// tables independently of the emulation's own.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_runtime.h"  // the emulation (this target's include path puts it first)
#include "gtest/gtest.h"
#include "kernels/common/half.h"
#include "kernels/cuda/ptx.cuh"
#include "tests/kernels/cuda_emulation/warp_runtime.h"

namespace packsched::kernels::internal::cuda {
namespace {

namespace emu = ::packsched_cuda_emulation;

template <typename T>
std::vector<T> RandomMatrix(int rows, int cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<T> m(static_cast<size_t>(rows) * cols);
  for (T& x : m) x = FromAcc<T>(normal(rng));
  return m;
}

// a[m][k] (row-major M x K) times b[k][n] (row-major K x N) in double.
template <typename T>
std::vector<double> PlainProduct(const std::vector<T>& a, const std::vector<T>& b, int m, int n,
                                 int k) {
  std::vector<double> c(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      for (int x = 0; x < k; ++x) c[i * n + j] += ToAcc(a[i * k + x]) * double{ToAcc(b[x * n + j])};
    }
  }
  return c;
}

uint32_t Pack(uint16_t lo, uint16_t hi) { return lo | (static_cast<uint32_t>(hi) << 16); }

// How B reaches the fragments in a test: straight from the ISA table, by ldmatrix from a
// [n][k] copy (x2 or x4), or by ldmatrix .trans from the [k][n] original (x2 or x4).
enum class BPath { kTable, kLdmatrixX2, kLdmatrixX4, kTransX2, kTransX4 };

// C = A B for an M x K by K x N product (M % 16 == 0, N % 16 == 0, K % 16 == 0) computed by one
// warp with mma.sync tiles; A through ldmatrix x4 (or the table when b_path is kTable).
template <typename T>
void CheckProduct(int m, int n, int k, BPath b_path, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<T> a = RandomMatrix<T>(m, k, rng);
  const std::vector<T> b = RandomMatrix<T>(k, n, rng);
  std::vector<T> bt(static_cast<size_t>(n) * k);  // [n][k]
  for (int x = 0; x < k; ++x) {
    for (int j = 0; j < n; ++j) bt[j * k + x] = b[x * n + j];
  }
  std::vector<float> c(static_cast<size_t>(m) * n, std::nanf(""));
  const size_t a_bytes = a.size() * sizeof(T);
  const size_t b_bytes = b.size() * sizeof(T);
  emu::RunBlock(dim3(0), 32, a_bytes + 2 * b_bytes, [&] {
    unsigned char* smem = ptx::DynamicSmem();
    const int lane = threadIdx.x % 32;
    if (lane == 0) {
      std::memcpy(smem, a.data(), a_bytes);
      std::memcpy(smem + a_bytes, b.data(), b_bytes);
      std::memcpy(smem + a_bytes + b_bytes, bt.data(), b_bytes);
    }
    __syncthreads();
    const T* sa = reinterpret_cast<const T*>(smem);
    const T* sb = reinterpret_cast<const T*>(smem + a_bytes);             // [k][n]
    const T* sbt = reinterpret_cast<const T*>(smem + a_bytes + b_bytes);  // [n][k]
    const int g = lane / 4, t = lane % 4;
    for (int i0 = 0; i0 < m; i0 += 16) {
      for (int j0 = 0; j0 < n; j0 += 16) {  // two 8-column tiles per step
        float acc[2][4] = {};
        for (int x0 = 0; x0 < k; x0 += 16) {
          uint32_t fa[4];
          uint32_t fb[2][2];
          if (b_path == BPath::kTable) {
            // A: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8); B: b0 (k 2t, n g),
            // b1 (k 2t+8, n g).
            for (int r = 0; r < 4; ++r) {
              const int row = i0 + g + 8 * (r % 2), col = x0 + 2 * t + 8 * (r / 2);
              fa[r] = Pack(sa[row * k + col].bits, sa[row * k + col + 1].bits);
            }
            for (int nt = 0; nt < 2; ++nt) {
              for (int r = 0; r < 2; ++r) {
                const int row = x0 + 2 * t + 8 * r, col = j0 + 8 * nt + g;
                fb[nt][r] = Pack(sb[row * n + col].bits, sb[(row + 1) * n + col].bits);
              }
            }
          } else {
            // A x4: lane l gives row l % 16, columns 8 (l / 16).
            ptx::Ldmatrix(fa, sa + (i0 + lane % 16) * k + x0 + 8 * (lane / 16));
            switch (b_path) {
              case BPath::kLdmatrixX2:  // matrices (n 0-7, k 0-7), (n 0-7, k 8-15)
                for (int nt = 0; nt < 2; ++nt) {
                  ptx::Ldmatrix(fb[nt],
                                sbt + (j0 + 8 * nt + lane % 8) * k + x0 + 8 * (lane / 8 % 2));
                }
                break;
              case BPath::kLdmatrixX4: {  // + (n 8-15, k 0-7), (n 8-15, k 8-15)
                uint32_t r4[4];
                ptx::Ldmatrix(
                    r4, sbt + (j0 + lane % 8 + 8 * (lane / 16)) * k + x0 + 8 * (lane / 8 % 2));
                fb[0][0] = r4[0], fb[0][1] = r4[1], fb[1][0] = r4[2], fb[1][1] = r4[3];
                break;
              }
              case BPath::kTransX2:  // matrices (k 0-7, n 0-7), (k 8-15, n 0-7), transposed
                for (int nt = 0; nt < 2; ++nt) {
                  ptx::LdmatrixTrans(fb[nt],
                                     sb + (x0 + lane % 8 + 8 * (lane / 8 % 2)) * n + j0 + 8 * nt);
                }
                break;
              default: {  // kTransX4: + (k 0-7, n 8-15), (k 8-15, n 8-15)
                uint32_t r4[4];
                ptx::LdmatrixTrans(
                    r4, sb + (x0 + lane % 8 + 8 * (lane / 8 % 2)) * n + j0 + 8 * (lane / 16));
                fb[0][0] = r4[0], fb[0][1] = r4[1], fb[1][0] = r4[2], fb[1][1] = r4[3];
                break;
              }
            }
          }
          for (int nt = 0; nt < 2; ++nt) ptx::Mma<T>(acc[nt], fa, fb[nt]);
        }
        // C: c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
        for (int nt = 0; nt < 2; ++nt) {
          for (int i = 0; i < 4; ++i) {
            c[(i0 + g + 8 * (i / 2)) * n + j0 + 8 * nt + 2 * t + i % 2] = acc[nt][i];
          }
        }
      }
    }
  });
  const std::vector<double> ref = PlainProduct(a, b, m, n, k);
  for (int i = 0; i < m * n; ++i) {
    // Products of 16-bit inputs are exact in float; only the k-long float sum rounds.
    ASSERT_NEAR(c[i], ref[i], 1e-5 * k * (1 + std::abs(ref[i]))) << "element " << i;
  }
}

TEST(PtxEmulationTest, MmaThroughFragmentsEqualsPlainProduct) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dim(1, 4);
  for (int trial = 0; trial < 6; ++trial) {
    const int m = 16 * dim(rng), n = 16 * dim(rng), k = 16 * dim(rng);
    for (BPath path : {BPath::kTable, BPath::kLdmatrixX2, BPath::kLdmatrixX4, BPath::kTransX2,
                       BPath::kTransX4}) {
      SCOPED_TRACE(testing::Message()
                   << m << "x" << n << "x" << k << " path " << static_cast<int>(path));
      CheckProduct<Bf16>(m, n, k, path, 100 + trial);
      CheckProduct<Fp16>(m, n, k, path, 200 + trial);
    }
  }
}

// Four 8 x 8 matrices of distinct 16-bit values; x1/x2/x4 loads with and without .trans.
TEST(PtxEmulationTest, LdmatrixGivesRowsAndTransGivesTheTranspose) {
  std::vector<uint16_t> mats(4 * 64);
  for (size_t i = 0; i < mats.size(); ++i) mats[i] = static_cast<uint16_t>(1000 + 7 * i);
  uint32_t got[2][3][32][4] = {};  // [trans][x1, x2, x4][lane][register]
  emu::RunBlock(dim3(0), 32, mats.size() * 2, [&] {
    unsigned char* smem = ptx::DynamicSmem();
    const int lane = threadIdx.x % 32;
    if (lane == 0) std::memcpy(smem, mats.data(), mats.size() * 2);
    __syncthreads();
    // Lane l points at row l % 8 of matrix l / 8.
    const void* row = smem + 2 * (64 * (lane / 8) + 8 * (lane % 8));
    uint32_t r1, r2[2], r4[4];
    ptx::Ldmatrix(r1, row);
    ptx::Ldmatrix(r2, row);
    ptx::Ldmatrix(r4, row);
    got[0][0][lane][0] = r1;
    std::memcpy(got[0][1][lane], r2, sizeof(r2));
    std::memcpy(got[0][2][lane], r4, sizeof(r4));
    ptx::LdmatrixTrans(r1, row);
    ptx::LdmatrixTrans(r2, row);
    ptx::LdmatrixTrans(r4, row);
    got[1][0][lane][0] = r1;
    std::memcpy(got[1][1][lane], r2, sizeof(r2));
    std::memcpy(got[1][2][lane], r4, sizeof(r4));
  });
  auto at = [&](int m, int row, int col) { return mats[64 * m + 8 * row + col]; };
  for (int trans = 0; trans < 2; ++trans) {
    for (int x = 0; x < 3; ++x) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int m = 0; m < (1 << x); ++m) {
          const int r = lane / 4, c = 2 * (lane % 4);
          // Without .trans lane l holds row l / 4, columns c, c + 1; with it, the transpose's.
          const uint32_t want =
              trans ? Pack(at(m, c, r), at(m, c + 1, r)) : Pack(at(m, r, c), at(m, r, c + 1));
          EXPECT_EQ(got[trans][x][lane][m], want)
              << "trans " << trans << " x" << (1 << x) << " lane " << lane << " matrix " << m;
        }
      }
    }
  }
}

// Rows 128 bytes apart all start on bank 0: 8-way conflicts; XOR-swizzling the 16-byte chunk by
// the row (chunk ^ row % 8) spreads them over all banks.
TEST(PtxEmulationTest, LdmatrixCountsBankConflictsOfUnswizzledRows) {
  for (bool swizzled : {false, true}) {
    const uint64_t conflicts = emu::ldmatrix_bank_conflicts;
    const uint64_t phases = emu::ldmatrix_phases;
    emu::RunBlock(dim3(0), 32, 32 * 128, [&] {
      unsigned char* smem = ptx::DynamicSmem();
      const int lane = threadIdx.x % 32;
      const int row = lane % 8 + 8 * (lane / 8);  // rows 0..31 of a 64-column bf16 tile
      const int chunk = swizzled ? row % 8 : 0;
      uint32_t r[4];
      ptx::Ldmatrix(r, smem + 128 * row + 16 * chunk);
    });
    EXPECT_EQ(emu::ldmatrix_phases - phases, 4u);
    EXPECT_EQ(emu::ldmatrix_bank_conflicts - conflicts, swizzled ? 0u : 4u);
  }
}

TEST(PtxEmulationTest, ShuffleReductionEqualsTheSum) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> value(-1000, 1000);
  std::vector<int> in(64);
  for (int& x : in) x = value(rng);
  std::vector<int> sums(64), broadcast(64), rotated(64);
  emu::RunBlock(dim3(0), 64, 0, [&] {
    const int t = threadIdx.x;
    int v = in[t];
    for (int mask = 16; mask >= 1; mask /= 2) v += ptx::ShflXor(v, mask);
    sums[t] = v;
    broadcast[t] = ptx::Shfl(in[t], 5);
    rotated[t] = ptx::Shfl(in[t], (t + 1) % 32);
  });
  for (int w = 0; w < 2; ++w) {
    int sum = 0;
    for (int l = 0; l < 32; ++l) sum += in[32 * w + l];
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(sums[32 * w + l], sum) << "warp " << w << " lane " << l;
      EXPECT_EQ(broadcast[32 * w + l], in[32 * w + 5]);
      EXPECT_EQ(rotated[32 * w + l], in[32 * w + (l + 1) % 32]);
    }
  }
}

// The warp vote: true in every lane of a warp where some lane's predicate holds, per warp.
TEST(PtxEmulationTest, WarpAnyIsTheVoteOfItsOwnWarp) {
  std::vector<int> any(96);
  emu::RunBlock(dim3(0), 96, 0, [&] {
    const int t = threadIdx.x;
    // Warp 0: lane 7 alone; warp 1: none; warp 2: every lane.
    const bool p = t == 7 || t >= 64;
    any[t] = ptx::WarpAny(p) ? 1 : 0;
  });
  for (int t = 0; t < 96; ++t) EXPECT_EQ(any[t], t / 32 == 1 ? 0 : 1) << "thread " << t;
}

// The destination reads as poison (0xff) from the issue until the wait that retires the group.
TEST(PtxEmulationTest, CpAsyncCopiesWhenItsGroupIsWaitedFor) {
  alignas(16) static uint8_t src[3][16];
  for (int g = 0; g < 3; ++g) std::memset(src[g], 10 + g, 16);
  uint8_t seen[5][3];  // before the copies and after each wait: first byte of each destination
  emu::RunBlock(dim3(0), 32, 48, [&] {
    unsigned char* smem = ptx::DynamicSmem();
    auto record = [&](int step) {
      for (int g = 0; g < 3; ++g) seen[step][g] = smem[16 * g];
    };
    if (threadIdx.x == 0) {
      std::memset(smem, 0x55, 48);
      record(0);
      ptx::CpAsync16(smem, src[0], true);
      ptx::CpAsyncCommit();
      ptx::CpAsync16(smem + 16, src[1], true);
      ptx::CpAsync16(smem + 32, src[2], false);  // zero fill
      ptx::CpAsyncCommit();
      record(1);
      ptx::CpAsyncWait<2>();
      record(2);
      ptx::CpAsyncWait<1>();
      record(3);
      ptx::CpAsyncWait<0>();
      record(4);
    }
  });
  const uint8_t kPoison = 0xff;
  const uint8_t want[5][3] = {{0x55, 0x55, 0x55},
                              {kPoison, kPoison, kPoison},
                              {kPoison, kPoison, kPoison},
                              {10, kPoison, kPoison},
                              {10, 11, 0}};
  for (int s = 0; s < 5; ++s) {
    for (int g = 0; g < 3; ++g) EXPECT_EQ(seen[s][g], want[s][g]) << "step " << s << " dst " << g;
  }
}

// Threads of two warps hand a value through shared memory. Without a barrier between the write
// and the read, what the reader sees depends on the order the scheduler resumes the threads (the
// emulation's racecheck: a kernel whose results change with `emu::schedule` has a race); with one,
// every order gives the written value. The shuffled order reaches both outcomes over a few seeds.
// A warp collective between the write and the read hides the race from every order that resumes
// each thread once per sweep (the writer's warp reaches its collective in the first sweep, the
// reader passes its own in the second); running one warp as far as it gets shows it.
TEST(PtxEmulationTest, ScheduleOrderDecidesUnsynchronisedAccessesOnly) {
  struct Seen {
    int racy, synced, behind_collective;
  };
  auto run = [](emu::Schedule order) {
    const emu::Schedule saved = emu::schedule;
    emu::schedule = order;
    Seen seen{};
    emu::RunBlock(dim3(0), 64, 3 * sizeof(int), [&] {
      int* smem = reinterpret_cast<int*>(ptx::DynamicSmem());
      if (threadIdx.x == 0) smem[0] = smem[2] = 0;
      __syncthreads();
      if (threadIdx.x == 5) smem[0] = 7;           // warp 0
      if (threadIdx.x == 40) seen.racy = smem[0];  // warp 1, no barrier in between
      if (threadIdx.x == 5) smem[1] = 9;
      __syncthreads();
      if (threadIdx.x == 40) seen.synced = smem[1];
      __syncthreads();
      if (threadIdx.x == 40) smem[2] = 7;
      const int from_next_lane = ptx::ShflXor(static_cast<int>(threadIdx.x), 1);
      if (threadIdx.x == 5) seen.behind_collective = smem[2] + 100 * (from_next_lane != 4);
    });
    emu::schedule = saved;
    return seen;
  };
  const Seen up = run({emu::ThreadOrder::kAscending, 0});
  const Seen down = run({emu::ThreadOrder::kDescending, 0});
  EXPECT_EQ(up.racy, 7);
  EXPECT_EQ(down.racy, 0);
  EXPECT_EQ(up.synced, 9);
  EXPECT_EQ(down.synced, 9);
  EXPECT_EQ(up.behind_collective, 7);
  EXPECT_EQ(down.behind_collective, 7);
  bool ahead_saw[2] = {false, false};
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    const Seen ahead = run({emu::ThreadOrder::kWarpAhead, seed});
    EXPECT_EQ(ahead.synced, 9) << seed;
    ASSERT_TRUE(ahead.behind_collective == 0 || ahead.behind_collective == 7) << seed;
    ahead_saw[ahead.behind_collective == 7] = true;
  }
  EXPECT_TRUE(ahead_saw[0] && ahead_saw[1]);
  bool saw[2] = {false, false};
  for (uint32_t seed = 1; seed <= 16; ++seed) {
    const Seen shuffled = run({emu::ThreadOrder::kShuffled, seed});
    EXPECT_EQ(shuffled.synced, 9) << seed;
    ASSERT_TRUE(shuffled.racy == 0 || shuffled.racy == 7) << seed;
    saw[shuffled.racy == 7] = true;
  }
  EXPECT_TRUE(saw[0] && saw[1]);
}

// RunGrid runs every block once, in the grid's linear order (x fastest) under the ascending
// schedule, reversed under the descending one, and in another order when shuffled (and warp by
// warp).
TEST(PtxEmulationTest, ScheduleOrdersTheBlocksOfAGrid) {
  auto run = [](emu::Schedule order) {
    const emu::Schedule saved = emu::schedule;
    emu::schedule = order;
    std::vector<int> blocks;
    emu::RunGrid(dim3(3, 2, 2), 32, 0, [&] {
      if (threadIdx.x == 0) {
        EXPECT_EQ(gridDim.x * gridDim.y * gridDim.z, 12u);
        blocks.push_back(static_cast<int>(blockIdx.x + 3 * (blockIdx.y + 2 * blockIdx.z)));
      }
    });
    emu::schedule = saved;
    return blocks;
  };
  std::vector<int> linear(12);
  for (int i = 0; i < 12; ++i) linear[i] = i;
  EXPECT_EQ(run({emu::ThreadOrder::kAscending, 0}), linear);
  EXPECT_EQ(run({emu::ThreadOrder::kDescending, 0}),
            std::vector<int>(linear.rbegin(), linear.rend()));
  for (const emu::ThreadOrder order : {emu::ThreadOrder::kShuffled, emu::ThreadOrder::kWarpAhead}) {
    std::vector<int> shuffled = run({order, 3});
    EXPECT_NE(shuffled, linear);
    std::sort(shuffled.begin(), shuffled.end());
    EXPECT_EQ(shuffled, linear);
  }
}

// Every thread of a block adds into the same floats, before and after a barrier: each sum is
// exact (small integers) and every call is counted.
TEST(PtxEmulationTest, AtomicAddSumsEveryThreadsValue) {
  float sums[2] = {0.f, 0.f};
  const uint64_t before = emu::atomic_adds;
  emu::RunBlock(dim3(0), 128, 0, [&] {
    const float old = atomicAdd(&sums[0], static_cast<float>(threadIdx.x));
    EXPECT_GE(old, 0.f);
    __syncthreads();
    atomicAdd(&sums[1], sums[0]);
  });
  EXPECT_EQ(sums[0], 127.f * 128.f / 2.f);
  EXPECT_EQ(sums[1], 128.f * sums[0]);
  EXPECT_EQ(emu::atomic_adds - before, 256u);
}

// ex2.approx.ftz: 2^x where the result is a normal float, 0 for -inf and for every result under
// the smallest normal float (the kernels' masked scores and rows that saw no key rely on the
// first), and a subnormal input read as 0.
TEST(PtxEmulationTest, Ex2IsTwoToTheXWithSubnormalsFlushed) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> x(-126.f, 127.f);
  for (int i = 0; i < 1000; ++i) {
    const float v = x(rng);
    EXPECT_NEAR(ptx::Ex2(v), std::exp2(static_cast<double>(v)), 1e-6 * std::exp2(v)) << v;
  }
  EXPECT_EQ(ptx::Ex2(0.f), 1.f);
  EXPECT_EQ(ptx::Ex2(-INFINITY), 0.f);
  EXPECT_EQ(ptx::Ex2(-127.f), 0.f);  // 2^-127 is subnormal
  EXPECT_EQ(ptx::Ex2(-1000.f), 0.f);
  EXPECT_EQ(ptx::Ex2(std::ldexp(1.f, -140)), 1.f);  // a subnormal input counts as 0
  EXPECT_EQ(ptx::Ex2(INFINITY), INFINITY);
}

TEST(PtxEmulationDeathTest, AtomicAddNeedsAnAlignedFloat) {
  alignas(8) unsigned char bytes[8] = {};
  EXPECT_DEATH(atomicAdd(reinterpret_cast<float*>(bytes + 2), 1.f), "unaligned");
}

TEST(PtxEmulationDeathTest, LoadGlobal16ReadsAlignedBytesOnly) {
  alignas(16) uint8_t bytes[32];
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<uint8_t>(3 * i + 1);
  uint32_t r[4];
  ptx::LoadGlobal16(r, bytes + 16);
  EXPECT_EQ(std::memcmp(r, bytes + 16, 16), 0);
  EXPECT_DEATH(ptx::LoadGlobal16(r, bytes + 8), "unaligned");
}

TEST(PtxEmulationDeathTest, DivergentWarpAborts) {
  EXPECT_DEATH(emu::RunBlock(dim3(0), 32, 64,
                             [] {
                               uint32_t r;
                               if (threadIdx.x == 3) {
                                 ptx::Ldmatrix(r, ptx::DynamicSmem());
                               } else {
                                 ptx::ShflXor(1, 1);
                               }
                             }),
               "divergent warp collective");
}

TEST(PtxEmulationDeathTest, ALaneThatExitsBeforeACollectiveIsADeadlock) {
  EXPECT_DEATH(emu::RunBlock(dim3(0), 32, 0,
                             [] {
                               if (threadIdx.x == 0) return;
                               ptx::ShflXor(1, 1);
                             }),
               "deadlock");
}

}  // namespace
}  // namespace packsched::kernels::internal::cuda
