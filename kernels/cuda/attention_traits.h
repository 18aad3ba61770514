#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TRAITS_H_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TRAITS_H_

// Compile-time shapes of the CUDA attention kernels (params -> traits -> device code -> launcher):
// one head-dim bucket (64, 128 or 256; smaller head dims are zero-padded up to the bucket in
// shared memory), the query-tile and key-tile sizes, the threads per block, and the shared-memory
// budget they imply, checked against the 163 KiB an sm_80 block may opt into.
//
// Every tile is held in shared memory as float (converted on load), rows padded by one float so
// the threads of a warp that read different rows hit different banks.

#include <cstddef>

namespace packsched::kernels::internal::cuda {

// sm_80's largest opt-in dynamic shared memory per block (sm_90 allows more).
inline constexpr size_t kMaxSharedBytes = 163 * 1024;

enum class AttnKernel { kForward, kBackwardDq, kBackwardDkDv };

template <int kHeadDimBucket, AttnKernel kKind>
struct AttnTraits {
  static constexpr int kHeadDim = kHeadDimBucket;
  static constexpr int kBr = kHeadDim <= 128 ? 64 : 32;  // query rows per tile
  static constexpr int kBc = kHeadDim <= 64 ? 64 : 32;   // keys per tile
  static constexpr int kThreads = kKind == AttnKernel::kForward ? 128 : 256;
  static constexpr int kPitch = kHeadDim + 1;  // floats per smem row of Q, K, V, dO
  static constexpr int kSPitch = kBc + 1;      // floats per smem row of S, P, dS
  // Which tiles each kernel keeps: forward Q, K, V, S; dq Q, dO, K, V, dS; dk/dv K, V, Q, dO, P,
  // dS. Plus per-row scalars (max, sum, rescale factor / lse, D).
  static constexpr int kQTiles = kKind == AttnKernel::kForward ? 1 : 2;
  static constexpr int kSTiles = kKind == AttnKernel::kBackwardDkDv ? 2 : 1;
  static constexpr int kRowScalars = kKind == AttnKernel::kForward ? 3 : 2;
  static constexpr size_t kSharedBytes =
      sizeof(float) * (static_cast<size_t>(kQTiles) * kBr * kPitch + 2 * kBc * kPitch +
                       static_cast<size_t>(kSTiles) * kBr * kSPitch + kRowScalars * kBr);
  // Output ownership: forward and dq give each query row kThreads / kBr threads; dk/dv give each
  // key row kThreads / kBc threads. Each thread accumulates kCols columns (strided).
  static constexpr int kOwnedRows = kKind == AttnKernel::kBackwardDkDv ? kBc : kBr;
  static constexpr int kThreadsPerRow = kThreads / kOwnedRows;
  static constexpr int kCols = kHeadDim / kThreadsPerRow;

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head-dim buckets only");
  static_assert(kThreads % kOwnedRows == 0, "whole threads per output row");
  static_assert(kHeadDim % kThreadsPerRow == 0, "whole columns per thread");
  static_assert(kCols <= 64, "accumulator registers per thread");
  static_assert(kSharedBytes <= kMaxSharedBytes, "shared-memory budget of sm_80");
};

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TRAITS_H_
