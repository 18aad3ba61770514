#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_ONEPASS_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_ONEPASS_CUH_

// The one-pass tensor-core attention backward, FlashAttention-2's non-deterministic one: a block
// per (128 keys, kv head, sequence) runs pass 2's body (BackwardKeyTile, attention_tc_bwd_keys.cuh:
// Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ and dSᵀ through shared tiles, dV += Pᵀ dO, dK += dSᵀ Q over the query
// tiles of the group's heads that see the keys, D read from the pre-pass's buffer) and also adds
// each query tile's dQ = dS K into a float32 accumulator in global memory with atomicAdd. Five
// tile products per (query tile, key tile) instead of the two passes' seven; the float sums into
// dQ happen in whatever order the blocks reach them, so dq is not bitwise reproducible from run to
// run (dk and dv are).
//
// Per query tile (64 rows), once the block's dSᵀ tile [128 keys][64 queries] (rounded to T, as
// pass 1 rounds dS) is whole: warp w computes 32 query rows x kDqCols columns of dQ = dS K (A
// fragments of dS by ldmatrix .trans of the dSᵀ tile, K's B fragments by ldmatrix .trans as in
// pass 1) and adds them to the accumulator, rows past the tile's real ones left out. A second
// kernel (DqFromAccumKernel) then rounds the accumulator into dq.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_tc_bwd.cuh"
#include "kernels/cuda/attention_tc_bwd_keys.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_traits.h"
#include "kernels/cuda/ptx.cuh"

namespace packsched::kernels::internal::cuda {

// Pass 2's shapes and shared layout, and how its 8 warps split a query tile's dQ (kBr x
// kHeadDim): kDqRows-row slices times kDqCols-wide column slices (32 x 32 per warp at D = 128,
// 32 x 16 at 64: each fragment read serves two products or more; 16 x 48 at 96, whose 6 column
// pairs do not split 4 ways).
template <int kHeadDimValue>
struct TcOnePassTraits : TcTraits<kHeadDimValue, TcKernel::kBackwardDkDv> {
  using Base = TcTraits<kHeadDimValue, TcKernel::kBackwardDkDv>;
  static constexpr int kDqRows = kHeadDimValue % 64 == 0 ? 32 : 16;
  static constexpr int kRowSlices = Base::kBr / kDqRows;
  static constexpr int kColSlices = Base::kWarps / kRowSlices;
  static constexpr int kDqCols = Base::kHeadDim / kColSlices;

  static_assert(Base::kWarps % kRowSlices == 0 && kDqCols % 16 == 0, "whole dQ slices");
};

// acc (kM x kCols) += dS K for the warp: dS rows [row0, row0 + kM) = columns of the shared dSᵀ
// tile `dst` ([kBc][kBr], swizzled), K = the swizzled tile `ks` ([kBc][kD]), columns
// [col0, col0 + kCols).
template <typename T, int kD, int kBr, int kBc, int kM, int kCols>
__device__ void MmaDsTimesK(float (&acc)[kM / 16][kCols / 8][4], const T* dst, int row0,
                            const T* ks, int col0) {
  static_assert(kM <= 64 && kCols <= 64, "chunks c0 + 2 k + h with k < 4 (SwzPairs)");
  const int lane = threadIdx.x % 32;
  // row0 and col0 are multiples of 8, every fragment's stored rows start at a multiple of 8.
  const SwzPairs pa = MakeSwzPairs<kBr>(row0 / 8, lane / 8 % 2, lane % 8);
  const SwzPairs pb = MakeSwzPairs<kD>(col0 / 8, lane / 16, lane % 8);
  const T* a_row = dst + (8 * (lane / 16) + lane % 8) * kBr;
  const T* b_row = ks + (lane % 8 + 8 * (lane / 8 % 2)) * kD;
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    // Matrix m = lane / 8 of an A fragment: keys kk 16 + 8 (m / 2) .. + 8 (stored rows), queries
    // row0 + 16 mi + 8 (m % 2) .. + 8 (stored columns); .trans hands lane l query l / 4, keys
    // 2 (l % 4).
    uint32_t af[kM / 16][4];
#pragma unroll
    for (int mi = 0; mi < kM / 16; ++mi) {
      ptx::LdmatrixTrans(af[mi], a_row + kk * 16 * kBr + pa.off[mi]);
    }
#pragma unroll
    for (int dp = 0; dp < kCols / 16; ++dp) {
      uint32_t b[4];
      ptx::LdmatrixTrans(b, b_row + kk * 16 * kD + pb.off[dp]);
      const uint32_t b0[2] = {b[0], b[1]};
      const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mi = 0; mi < kM / 16; ++mi) {
        ptx::Mma<T>(acc[mi][2 * dp], af[mi], b0);
        ptx::Mma<T>(acc[mi][2 * dp + 1], af[mi], b1);
      }
    }
  }
}

// BackwardKeyTile's sink of the one-pass backward (NoDqSink describes the calls).
template <typename T, typename Tr>
struct AtomicDqSink {
  static constexpr int kD = Tr::kHeadDim;
  static constexpr int kBr = Tr::kBr;
  float* dq_accum;  // [total_q, heads, kD], zeroed before the kernel
  int64_t heads;

  // After the barrier that makes the whole dSᵀ tile `ds` visible: dQ of packed rows
  // [q_row0, q_row0 + rows) of head h += dS K (`ks` the block's K tile).
  __device__ void Add(const T* ds, const T* ks, int64_t q_row0, int64_t rows, int64_t h) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int row0 = Tr::kDqRows * (warp % Tr::kRowSlices);
    const int col0 = Tr::kDqCols * (warp / Tr::kRowSlices);
    if (row0 >= rows) return;  // uniform across the warp
    float acc[Tr::kDqRows / 16][Tr::kDqCols / 8][4];
    ZeroAcc(acc);
    MmaDsTimesK<T, kD, kBr, Tr::kBc, Tr::kDqRows, Tr::kDqCols>(acc, ds, row0, ks, col0);
#pragma unroll
    for (int mi = 0; mi < Tr::kDqRows / 16; ++mi) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = row0 + 16 * mi + lane / 4 + 8 * rr;
        if (r >= rows) continue;
        float* out = dq_accum + ((q_row0 + r) * heads + h) * kD + col0 + 2 * (lane % 4);
#pragma unroll
        for (int nt = 0; nt < Tr::kDqCols / 8; ++nt) {
          atomicAdd(out + nt * 8, acc[mi][nt][2 * rr]);
          atomicAdd(out + nt * 8 + 1, acc[mi][nt][2 * rr + 1]);
        }
      }
    }
  }
};

// Grid as pass 2's (TcGrid over the keys, kv heads); dq_accum as AtomicDqSink's.
template <typename T, int kD>
__global__ void __launch_bounds__(256)
    AttentionTcBackwardOnePassKernel(const TcAttnParams p, float* dq_accum) {
  using Tr = TcOnePassTraits<kD>;
  AtomicDqSink<T, Tr> sink{dq_accum, p.args.heads};
  BackwardKeyTile<T, kD, Tr>(p, sink);
}

// dq = `acc` · scale rounded to T (the accumulator sums dS / scale, TcScoreGradient), 4 elements
// [4 i, 4 i + 4) per thread i = blockIdx.x * kDqConvertThreads + threadIdx.x, for i < n4 (blocks
// of kDqConvertThreads threads).
inline constexpr int kDqConvertThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kDqConvertThreads)
    DqFromAccumKernel(const float* acc, T* dq, int64_t n4, float scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kDqConvertThreads + threadIdx.x;
  if (i >= n4) return;
  const float* s = acc + 4 * i;
  uint32_t* d = reinterpret_cast<uint32_t*>(dq + 4 * i);
  d[0] = ptx::PackPair<T>(s[0] * scale, s[1] * scale);
  d[1] = ptx::PackPair<T>(s[2] * scale, s[3] * scale);
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_ONEPASS_CUH_
