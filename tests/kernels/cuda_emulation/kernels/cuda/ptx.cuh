#ifndef PACKSCHED_KERNELS_CUDA_PTX_CUH_
#define PACKSCHED_KERNELS_CUDA_PTX_CUH_

// The CPU emulation of kernels/cuda/ptx.cuh (same include guard, same functions): a test target
// that puts tests/kernels/cuda_emulation first on its include path gets this file for
// "kernels/cuda/ptx.cuh", and the tensor-core kernels run on the CPU under warp_runtime.h.
//
// Each warp-level instruction is a warp collective (warp_runtime.h): the 32 lanes hand in their
// registers, and the outputs are computed from the PTX ISA's definitions:
//   - mma.sync m16n8k16 ("Matrix Fragments for mma.m16n8k16 with floating point type"): the
//     lanes' A, B and C fragments are assembled into 16 x 16, 16 x 8 and 16 x 8 matrices by the
//     fragment layout (FragmentA / FragmentB / FragmentC below), D = A B + C is computed with
//     exact products and float sums in k order, and D is handed back in C's layout;
//   - ldmatrix x1/x2/x4 (.trans) ("Warp-level matrix load instruction: ldmatrix"): lanes
//     8m..8m+7 give the row addresses of matrix m; each address must be 16-byte aligned and in
//     the block's shared memory (else the run aborts); bank conflicts among a matrix's 8 rows are
//     counted (ldmatrix_bank_conflicts);
//   - __shfl_sync / __shfl_xor_sync / __any_sync with the full mask.
// cp.async is a per-thread queue: the destination is poisoned (0xff bytes: NaN in every float
// type) when the copy is issued, and the data lands when a cp.async.wait_group retires its group.
// So a kernel that reads a tile before waiting for it, or issues a copy into a buffer another
// warp is still reading (a missing barrier), reads NaN.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/half.h"
#include "tests/kernels/cuda_emulation/warp_runtime.h"

template <typename V>
V __shfl_xor_sync(unsigned mask, V v, int lane_mask) {
  static_assert(sizeof(V) == 4);
  if (mask != 0xffffffffu) packsched_cuda_emulation::Fail("__shfl_xor_sync needs the full mask");
  struct In {
    V v;
    int lane_mask;
  };
  return packsched_cuda_emulation::WarpCollective<In, V>(
      "__shfl_xor_sync", In{v, lane_mask}, [](const In* in, V* out) {
        for (int l = 0; l < 32; ++l) {
          if (in[l].lane_mask != in[0].lane_mask) {
            packsched_cuda_emulation::Fail("__shfl_xor_sync lanes disagree on the lane mask");
          }
          out[l] = in[(l ^ in[l].lane_mask) & 31].v;
        }
      });
}

inline bool __any_sync(unsigned mask, bool p) {
  if (mask != 0xffffffffu) packsched_cuda_emulation::Fail("__any_sync needs the full mask");
  return packsched_cuda_emulation::WarpCollective<int, int>("__any_sync", p ? 1 : 0,
                                                            [](const int* in, int* out) {
                                                              int any = 0;
                                                              for (int l = 0; l < 32; ++l)
                                                                any |= in[l];
                                                              for (int l = 0; l < 32; ++l)
                                                                out[l] = any;
                                                            }) != 0;
}

template <typename V>
V __shfl_sync(unsigned mask, V v, int src_lane) {
  static_assert(sizeof(V) == 4);
  if (mask != 0xffffffffu) packsched_cuda_emulation::Fail("__shfl_sync needs the full mask");
  struct In {
    V v;
    int src;
  };
  return packsched_cuda_emulation::WarpCollective<In, V>("__shfl_sync", In{v, src_lane},
                                                         [](const In* in, V* out) {
                                                           for (int l = 0; l < 32; ++l)
                                                             out[l] = in[in[l].src & 31].v;
                                                         });
}

namespace packsched::kernels::internal::cuda::ptx {

inline unsigned char* DynamicSmem() { return packsched_cuda_emulation::CurrentBlock().smem.data(); }

// Element (row, col) of the fragments (PTX ISA table): lane, register and half (0 = low).
struct FragmentPos {
  int row, col;
};
inline FragmentPos FragmentA(int lane, int reg, int half) {
  return {lane / 4 + 8 * (reg & 1), 2 * (lane % 4) + half + 8 * (reg >> 1)};
}
inline FragmentPos FragmentB(int lane, int reg, int half) {  // row = k, col = n
  return {2 * (lane % 4) + half + 8 * reg, lane / 4};
}
inline FragmentPos FragmentC(int lane, int i) {
  return {lane / 4 + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)};
}

template <typename T>
float HalfValue(uint32_t reg, int half) {
  T x;
  x.bits = static_cast<uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16);
  return ToAcc(x);
}

template <typename T>
void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct In {
    uint32_t a[4], b[2];
    float c[4];
  };
  struct Out {
    float d[4];
  };
  In in;
  std::memcpy(in.a, a, sizeof(in.a));
  std::memcpy(in.b, b, sizeof(in.b));
  std::memcpy(in.c, d, sizeof(in.c));
  const Out out = packsched_cuda_emulation::WarpCollective<In, Out>(
      "mma.sync.m16n8k16", in, [](const In* lanes, Out* outs) {
        ++packsched_cuda_emulation::mma_calls;
        float ma[16][16], mb[16][8], mc[16][8];
        for (int l = 0; l < 32; ++l) {
          for (int r = 0; r < 4; ++r) {
            for (int h = 0; h < 2; ++h) {
              const FragmentPos p = FragmentA(l, r, h);
              ma[p.row][p.col] = HalfValue<T>(lanes[l].a[r], h);
            }
          }
          for (int r = 0; r < 2; ++r) {
            for (int h = 0; h < 2; ++h) {
              const FragmentPos p = FragmentB(l, r, h);
              mb[p.row][p.col] = HalfValue<T>(lanes[l].b[r], h);
            }
          }
          for (int i = 0; i < 4; ++i) {
            const FragmentPos p = FragmentC(l, i);
            mc[p.row][p.col] = lanes[l].c[i];
          }
        }
        for (int l = 0; l < 32; ++l) {
          for (int i = 0; i < 4; ++i) {
            const FragmentPos p = FragmentC(l, i);
            float acc = mc[p.row][p.col];
            for (int k = 0; k < 16; ++k) acc += ma[p.row][k] * mb[k][p.col];
            outs[l].d[i] = acc;
          }
        }
      });
  std::memcpy(d, out.d, sizeof(out.d));
}

// ldmatrix of kMatrices 8 x 8 matrices; returns register m of this lane in r[m].
template <int kMatrices, bool kTrans>
void LdmatrixN(uint32_t* r, const void* row) {
  struct In {
    const unsigned char* row;
  };
  struct Out {
    uint32_t r[4];
  };
  const auto* p = static_cast<const unsigned char*>(row);
  const Out out = packsched_cuda_emulation::WarpCollective<In, Out>(
      kTrans ? "ldmatrix.trans" : "ldmatrix", In{p}, [](const In* lanes, Out* outs) {
        for (int m = 0; m < kMatrices; ++m) {
          unsigned char seen[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 16-byte bank groups used
          bool conflict = false;
          for (int i = 0; i < 8; ++i) {
            const unsigned char* a = lanes[8 * m + i].row;
            if (reinterpret_cast<uintptr_t>(a) % 16 != 0 ||
                !packsched_cuda_emulation::InSmem(a, 16)) {
              packsched_cuda_emulation::Fail("ldmatrix row address unaligned or outside smem");
            }
            const size_t group =
                (a - packsched_cuda_emulation::CurrentBlock().smem.data()) / 16 % 8;
            bool same_row = false;  // the same address twice is a broadcast, no conflict
            for (int j = 0; j < i; ++j) same_row = same_row || lanes[8 * m + j].row == a;
            if (seen[group] && !same_row) conflict = true;
            seen[group] = 1;
          }
          ++packsched_cuda_emulation::ldmatrix_phases;
          if (conflict) ++packsched_cuda_emulation::ldmatrix_bank_conflicts;
          for (int l = 0; l < 32; ++l) {
            uint16_t lo, hi;
            if (kTrans) {  // column l / 4, rows 2(l % 4) and 2(l % 4) + 1
              std::memcpy(&lo, lanes[8 * m + 2 * (l % 4)].row + 2 * (l / 4), 2);
              std::memcpy(&hi, lanes[8 * m + 2 * (l % 4) + 1].row + 2 * (l / 4), 2);
            } else {  // row l / 4, columns 2(l % 4) and 2(l % 4) + 1
              std::memcpy(&lo, lanes[8 * m + l / 4].row + 4 * (l % 4), 2);
              std::memcpy(&hi, lanes[8 * m + l / 4].row + 4 * (l % 4) + 2, 2);
            }
            outs[l].r[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
          }
        }
      });
  for (int m = 0; m < kMatrices; ++m) r[m] = out.r[m];
}

inline void Ldmatrix(uint32_t& r, const void* row) { LdmatrixN<1, false>(&r, row); }
inline void Ldmatrix(uint32_t (&r)[2], const void* row) { LdmatrixN<2, false>(r, row); }
inline void Ldmatrix(uint32_t (&r)[4], const void* row) { LdmatrixN<4, false>(r, row); }
inline void LdmatrixTrans(uint32_t& r, const void* row) { LdmatrixN<1, true>(&r, row); }
inline void LdmatrixTrans(uint32_t (&r)[2], const void* row) { LdmatrixN<2, true>(r, row); }
inline void LdmatrixTrans(uint32_t (&r)[4], const void* row) { LdmatrixN<4, true>(r, row); }

inline void CpAsync16(void* dst, const void* src, bool fill) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 ||
      !packsched_cuda_emulation::InSmem(dst, 16)) {
    packsched_cuda_emulation::Fail("cp.async: unaligned address or destination outside smem");
  }
  std::memset(dst, 0xff, 16);
  packsched_cuda_emulation::CurrentFiber().open_group.push_back({dst, src, fill});
}

inline void CpAsyncCommit() {
  packsched_cuda_emulation::Fiber& f = packsched_cuda_emulation::CurrentFiber();
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}

template <int kPending>
void CpAsyncWait() {
  packsched_cuda_emulation::Fiber& f = packsched_cuda_emulation::CurrentFiber();
  while (f.committed.size() > static_cast<size_t>(kPending)) {
    for (const packsched_cuda_emulation::PendingCopy& c : f.committed.front()) {
      if (c.fill) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    f.committed.erase(f.committed.begin());
  }
}

inline void LoadGlobal16(uint32_t (&r)[4], const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    packsched_cuda_emulation::Fail("ld.global.v4: unaligned address");
  }
  std::memcpy(r, p, 16);
}

template <typename V>
V ShflXor(V v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
template <typename V>
V Shfl(V v, int src_lane) {
  return __shfl_sync(0xffffffffu, v, src_lane);
}

inline bool WarpAny(bool p) { return __any_sync(0xffffffffu, p); }

// ex2.approx.ftz.f32: 2^x with subnormal inputs read as 0 and subnormal results flushed to 0 (the
// emulation rounds 2^x correctly; the hardware's result is within 2^-22 of it).
inline float Ex2(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.f;
  const float r = std::exp2(x);
  return std::fpclassify(r) == FP_SUBNORMAL ? 0.f : r;
}

template <typename T>
uint32_t PackPair(float lo, float hi) {
  return static_cast<uint32_t>(FromAcc<T>(lo).bits) |
         (static_cast<uint32_t>(FromAcc<T>(hi).bits) << 16);
}

}  // namespace packsched::kernels::internal::cuda::ptx

#endif  // PACKSCHED_KERNELS_CUDA_PTX_CUH_
