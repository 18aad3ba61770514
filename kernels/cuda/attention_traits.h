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

// The dynamic shared memory of one attention kernel: each region's offset in floats from the
// block's base, in this order, and the total. A kernel keeps only the regions it uses (the others
// are empty and take no room):
//   forward  Q, K, V, S (then P, in place), per-row max, sum and rescale factor
//   dq       Q, dO, K, V, dS, per-row lse and D
//   dk/dv    Q, dO, K, V, P, dS, per-row lse and D
// Q and dO are [kBr][kPitch], K and V [kBc][kPitch], S, P and dS [kBr][kSPitch]; each per-row
// scalar region holds kBr floats.
template <int kBr, int kBc, int kPitch, int kSPitch, AttnKernel kKind>
struct AttnSmemLayout {
  static constexpr bool kBackward = kKind != AttnKernel::kForward;
  static constexpr size_t kQueryTile = static_cast<size_t>(kBr) * kPitch;
  static constexpr size_t kKeyTile = static_cast<size_t>(kBc) * kPitch;
  static constexpr size_t kScoreTile = static_cast<size_t>(kBr) * kSPitch;

  static constexpr size_t kQ = 0;
  static constexpr size_t kDout = kQ + kQueryTile;  // backward only
  static constexpr size_t kK = kDout + (kBackward ? kQueryTile : 0);
  static constexpr size_t kV = kK + kKeyTile;
  static constexpr size_t kP = kV + kKeyTile;  // dk/dv only
  // S, then P (forward); dS (backward).
  static constexpr size_t kScores = kP + (kKind == AttnKernel::kBackwardDkDv ? kScoreTile : 0);
  static constexpr size_t kRowScalars = kScores + kScoreTile;
  static constexpr int kRowScalarCount = kBackward ? 2 : 3;
  static constexpr size_t kFloats = kRowScalars + static_cast<size_t>(kRowScalarCount) * kBr;

  // The offset of per-row scalar region i, i < kRowScalarCount (forward: 0 max, 1 sum, 2 rescale
  // factor; backward: 0 lse, 1 D).
  static constexpr size_t RowScalar(int i) { return kRowScalars + static_cast<size_t>(i) * kBr; }
};

template <int kHeadDimBucket, AttnKernel kKind>
struct AttnTraits {
  static constexpr int kHeadDim = kHeadDimBucket;
  static constexpr int kBr = kHeadDim <= 128 ? 64 : 32;  // query rows per tile
  static constexpr int kBc = kHeadDim <= 64 ? 64 : 32;   // keys per tile
  static constexpr int kThreads = kKind == AttnKernel::kForward ? 128 : 256;
  static constexpr int kPitch = kHeadDim + 1;  // floats per smem row of Q, K, V, dO
  static constexpr int kSPitch = kBc + 1;      // floats per smem row of S, P, dS
  // The shared-memory layout (offsets for the device code); the launch asks for its total.
  using Smem = AttnSmemLayout<kBr, kBc, kPitch, kSPitch, kKind>;
  static constexpr size_t kSharedBytes = sizeof(float) * Smem::kFloats;
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
