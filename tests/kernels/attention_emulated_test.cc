// The CUDA attention's device code (kernels/cuda/attention_device.cuh) run on the CPU under an
// emulation of the CUDA execution model (cuda_emulation/cuda_runtime.h: one std::thread per CUDA
// thread, __syncthreads as a barrier, one block at a time, the launchers' grids), checked against
// the float64 reference under the tolerance rule. It exercises the kernels' indexing, tiling,
// masking, shared-memory layout and barrier placement on machines without a GPU; it says nothing
// about the GPU toolchain or the hardware (kernels_attention_cuda_test does, given a device).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"  // the emulation (this target's include path puts it first)
#include "gtest/gtest.h"
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_traits.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/emulated_attention_args.h"
#include "tests/kernels/emulated_query_rows.h"
#include "tests/kernels/tree_forest.h"

namespace packsched::kernels::internal::cuda {

// The dynamic shared memory of the block being run (`extern __shared__ float smem[]` in the
// kernels resolves to this); large enough for every traits' kSharedBytes.
float smem[kMaxSharedBytes / sizeof(float)];

namespace {

using testing::AttentionTensors;
using testing::ExpectMatchesReference;
using testing::Inputs;
using testing::MakeProblem;
using testing::Problem;
using testing::RandomInputs;

// A NaN bit pattern for the shared memory past a kernel's layout (Tr::Smem): a kernel that read
// there would spoil its results, one that wrote there would change the pattern.
constexpr uint32_t kPastLayout = 0x7fc0deadu;

// Fills smem[floats, end) with kPastLayout (check = false), or counts the floats there that no
// longer hold it (check = true).
int64_t PastLayout(size_t floats, bool check) {
  int64_t changed = 0;
  for (size_t i = floats; i < std::size(smem); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &smem[i], sizeof(bits));
    if (!check) {
      std::memcpy(&smem[i], &kPastLayout, sizeof(bits));
    } else if (bits != kPastLayout) {
      ++changed;
    }
  }
  return changed;
}

// Runs `kernel` over the grid the launcher would use: (tiles over the span's longest segment,
// heads, the span's sequences: B, plus one for a tail). Fails the test if the kernel wrote past
// its shared-memory layout.
template <typename Tr>
void Launch(void (*kernel)(AttentionArgs), const AttentionArgs& a, int64_t longest, int tile,
            int64_t heads, bool keys) {
  static_assert(Tr::kSharedBytes == Tr::Smem::kFloats * sizeof(float));
  PastLayout(Tr::Smem::kFloats, /*check=*/false);
  const AttnLaunchSpan span = LaunchSpan(a, longest, keys);
  const int64_t tiles = std::max<int64_t>(1, (span.longest + tile - 1) / tile);
  for (int64_t z = 0; z < span.sequences; ++z) {
    for (int64_t y = 0; y < heads; ++y) {
      for (int64_t x = 0; x < tiles; ++x) {
        packsched_cuda_emulation::block_idx = dim3(x, y, z);
        std::barrier<> barrier(Tr::kThreads);
        packsched_cuda_emulation::block_barrier = &barrier;
        std::vector<std::thread> threads;
        threads.reserve(Tr::kThreads);
        for (int t = 0; t < Tr::kThreads; ++t) {
          threads.emplace_back([&, t] {
            packsched_cuda_emulation::thread_idx = dim3(t);
            kernel(a);
            barrier.arrive_and_drop();  // an exited thread no longer counts at the barrier
          });
        }
        for (std::thread& t : threads) t.join();
      }
    }
  }
  EXPECT_EQ(PastLayout(Tr::Smem::kFloats, /*check=*/true), 0)
      << "floats written past the shared-memory layout";
}

template <typename T, int kD>
void Forward(const AttentionArgs& a) {
  using Fwd = AttnTraits<kD, AttnKernel::kForward>;
  Launch<Fwd>(AttentionForwardKernel<T, Fwd>, a, a.max_seqlen_q, Fwd::kBr, a.heads, false);
}

template <typename T, int kD>
void Backward(const AttentionArgs& a) {
  using Dq = AttnTraits<kD, AttnKernel::kBackwardDq>;
  using DkDv = AttnTraits<kD, AttnKernel::kBackwardDkDv>;
  Launch<Dq>(AttentionBackwardDqKernel<T, Dq>, a, a.max_seqlen_q, Dq::kBr, a.heads, false);
  Launch<DkDv>(AttentionBackwardDkDvKernel<T, DkDv>, a, a.max_seqlen_k, DkDv::kBc, a.kv_heads,
               true);
}

template <typename T, int kD>
void ForwardAndBackward(const AttentionArgs& a) {
  Forward<T, kD>(a);
  Backward<T, kD>(a);
}

template <typename T>
void CheckEmulated(const Problem& p, uint32_t seed = 1) {
  const Inputs in = RandomInputs<T>(p, seed);
  AttentionTensors<T> t(p, in);
  const AttentionArgs a = testing::EmulatedArgs(p, t);
  if (p.head_dim <= 64) {
    ForwardAndBackward<T, 64>(a);
  } else if (p.head_dim <= 128) {
    ForwardAndBackward<T, 128>(a);
  } else {
    ForwardAndBackward<T, 256>(a);
  }
  ExpectMatchesReference<T>(p, in, t.Results());
}

TEST(AttentionEmulatedTest, Bucket64PaddedLayoutGqaWindowSoftcap) {
  Problem p = MakeProblem({97, 0, 40, 1}, {60, 13, 128, 0}, true);
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 8;  // padded up to 64
  p.pad_q = {3, 8, 0, 2};
  p.pad_k = {4, 3, 64, 1};
  p.options.window_left = 30;
  p.options.softcap = 3.0;
  CheckEmulated<Bf16>(p);
}

TEST(AttentionEmulatedTest, Bucket128WindowWithoutCausal) {
  Problem p = MakeProblem({70, 33}, {33, 130}, false);
  p.head_dim = 80;  // padded up to 128
  p.options.window_left = 16;
  p.options.window_right = 4;
  CheckEmulated<Fp16>(p);
}

// Windows near INT64_MAX (left unnormalised by a max_seqlen_k hint above them) see every key in
// the device code too: VisibleKeys must not overflow.
TEST(AttentionEmulatedTest, WindowsNearInt64MaxSeeEveryKey) {
  Problem p = MakeProblem({33, 5}, {20, 40}, false);
  p.max_seqlen_k = std::numeric_limits<int64_t>::max();
  p.options.window_left = std::numeric_limits<int64_t>::max() - 1;
  p.options.window_right = std::numeric_limits<int64_t>::max() - 1;
  CheckEmulated<float>(p);
}

TEST(AttentionEmulatedTest, Bucket256Causal) {
  Problem p = MakeProblem({40, 65}, {65, 40}, true);
  p.head_dim = 256;
  CheckEmulated<float>(p);
}

// The align_total_to tail: rows past cu[B] (longer than every segment here, so the grid must
// stretch to cover them) are never keys and get out 0, lse +inf and zero gradients.
TEST(AttentionEmulatedTest, TailRowsAfterThePaddedLayout) {
  Problem p = MakeProblem({3, 0, 5}, {4, 2, 5}, true);
  p.heads = 2;
  p.kv_heads = 1;
  p.head_dim = 8;
  p.pad_q = {1, 0, 3};
  p.pad_k = {0, 2, 3};
  p.tail_q = 70;  // more than one 64-row tile
  p.tail_k = 7;
  CheckEmulated<float>(p);
  Problem only_tail = MakeProblem({}, {});
  only_tail.head_dim = 8;
  only_tail.tail_q = 5;
  only_tail.tail_k = 5;
  CheckEmulated<float>(only_tail);
}

// Tree packing: the device code's mask predicate on random forests (nodes longer than a tile, so
// shared prefixes, sibling branches and their tiles cross tile boundaries), with GQA, a left
// window on the depths and softcap.
TEST(AttentionEmulatedTest, TreeMaskOnRandomForests) {
  const testing::PackedForest f = testing::RandomForest(4, 2, 8, 50);
  Problem p = testing::TreeProblem(f.cu, f.subtree_end, f.positions);
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  CheckEmulated<float>(p);
  p.options.window_left = 40;
  p.options.softcap = 2.0;
  CheckEmulated<Bf16>(p);
}

// The launchers' AttentionBlankRowsKernel, its blocks and threads one after another (it has no
// barrier).
void RunBlankRows(const AttentionArgs& a, void* rows, float* lse) {
  const dim3 grid = BlankRowsGrid(a);
  packsched_cuda_emulation::grid_dim = grid;
  for (unsigned x = 0; x < grid.x; ++x) {
    packsched_cuda_emulation::block_idx = dim3(x);
    for (int t = 0; t < kBlankRowsThreads; ++t) {
      packsched_cuda_emulation::thread_idx = dim3(t);
      AttentionBlankRowsKernel<uint16_t>(a, rows, lse);
    }
  }
}

// Runs f(std::integral_constant<int, bucket>) for the head-dim bucket of `a` (64, 128 or 256).
template <typename F>
void WithBucket(const AttentionArgs& a, F&& f) {
  if (a.head_dim <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (a.head_dim <= 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    f(std::integral_constant<int, 256>{});
  }
}

// The query-row map on the scalar kernels, per rank of a tree CP group of `cp` (head-tail rows):
// without the map on the inputs with dout 0 outside it, against the reference; with it (the
// launchers' sequence: forward, blank rows, backward, blank dq), the mapped rows bitwise the run
// without it and the others blank; the CPU backend's map against both.
template <typename T>
void CheckQueryRowMap(const Problem& p, int cp, uint32_t seed) {
  const Inputs in = RandomInputs<T>(p, seed);
  const int64_t tq = p.RowsQ();
  for (int rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "cp " << cp << " rank " << rank);
    const std::vector<int32_t> rows = testing::HeadTailRows(p.CuQ(), cp, rank, seed);
    const std::vector<bool> mapped = testing::MappedRows(rows, tq);
    const Inputs own = testing::WithDoutOnlyOn(p, in, mapped);
    AttentionTensors<T> all(p, own);
    const AttentionArgs plain = testing::EmulatedArgs(p, all);
    WithBucket(plain, [&](auto d) { ForwardAndBackward<T, decltype(d)::value>(plain); });
    const testing::Outputs want = all.Results();
    ExpectMatchesReference<T>(p, own, want);
    AttentionTensors<T> t(p, in);
    AttentionArgs a = testing::EmulatedArgs(p, t);
    const testing::QueryRuns runs(rows);
    runs.SetOn(a);
    WithBucket(a, [&](auto d) {
      Forward<T, decltype(d)::value>(a);
      RunBlankRows(a, a.out, static_cast<float*>(a.lse));
      Backward<T, decltype(d)::value>(a);
      RunBlankRows(a, a.dq, nullptr);
    });
    const testing::Outputs got = t.Results();
    testing::ExpectMappedRun(p, mapped, want, got, "scalar map");
    testing::ExpectCpuMapAgrees<T>(p, in, own, rows, mapped, want, got);
    // The backward reads nothing of the other rows: over the forward's out and lse without the
    // map, the same gradients (checked for the first rank).
    if (rank > 0) continue;
    AttentionTensors<T> over_all(p, in);
    AttentionArgs b = testing::EmulatedArgs(p, over_all);
    WithBucket(b, [&](auto d) {
      Forward<T, decltype(d)::value>(b);
      runs.SetOn(b);
      Backward<T, decltype(d)::value>(b);
      RunBlankRows(b, b.dq, nullptr);
    });
    const testing::Outputs again = over_all.Results();
    EXPECT_EQ(got.dq, again.dq) << "dq over the forward without the map";
    EXPECT_EQ(got.dk, again.dk) << "dk over the forward without the map";
    EXPECT_EQ(got.dv, again.dv) << "dv over the forward without the map";
  }
}

// Tree CP's head-tail maps at cp = 2 and 4 on random forests, with GQA; a left window on the
// depths and softcap in bf16.
TEST(AttentionEmulatedTest, QueryRowMapOfTreeCpRanks) {
  const testing::PackedForest f = testing::RandomForest(4, 2, 8, 50);
  Problem p = testing::TreeProblem(f.cu, f.subtree_end, f.positions);
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  CheckQueryRowMap<float>(p, 2, 31);
  p.options.window_left = 40;
  p.options.softcap = 2.0;
  CheckQueryRowMap<Bf16>(p, 4, 33);
}

TEST(AttentionEmulatedTest, LongQueriesFewKeys) {
  Problem p = MakeProblem({1025, 1}, {128, 97}, true);
  p.heads = 1;
  p.head_dim = 64;
  CheckEmulated<Bf16>(p);
}

}  // namespace
}  // namespace packsched::kernels::internal::cuda
