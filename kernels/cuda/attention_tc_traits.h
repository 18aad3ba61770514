#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_TRAITS_H_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_TRAITS_H_

// Compile-time shapes of the tensor-core attention kernels (attention_tc_fwd.cuh,
// attention_tc_bwd.cuh): head dim 64 or 128 exactly (no padding), 4 warps per block, each warp
// owning 16-row mma tiles of the block's row tile (query rows for the forward and dq kernels, key
// rows for the dk/dv kernel), and the shared-memory budget of the 16-bit tiles.
//
// Shared tiles hold rows of kHeadDim 16-bit elements, 16-byte chunks XOR-swizzled by the row
// (chunk c of row r is stored at chunk c ^ (r % 8)): the 8 row addresses of one ldmatrix phase
// then cover all 32 banks, and cp.async writes whole chunks.

#include <cstddef>

namespace packsched::kernels::internal::cuda {

enum class TcKernel { kForward, kBackwardDq, kBackwardDkDv };

// The forward's default 16-row mma tiles per warp (TcTraits::kWarpTiles): 2 at both head dims
// (128-row query tiles). Other kernels use 1.
constexpr int TcDefaultWarpTiles(TcKernel kind) { return kind == TcKernel::kForward ? 2 : 1; }

template <int kHeadDimValue, TcKernel kKind, int kWarpTilesValue = TcDefaultWarpTiles(kKind)>
struct TcTraits {
  static constexpr int kHeadDim = kHeadDimValue;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16;  // rows of one mma tile
  // Query rows per tile and keys per tile. The forward and dq kernels give each warp 16 query
  // rows per row tile (kBr = 64 x kWarpTiles) and walk key tiles of kBc; the dk/dv kernel gives
  // each warp 16 keys (kBc = 64) and walks query tiles of kBr (32 at D = 128 to bound its
  // accumulators).
  // The forward gives each warp kWarpTiles tiles of 16 rows: 2 (128-row query tiles: each K/V
  // fragment loaded serves 32 rows, Q's fragments reloaded from shared memory per k step) or, at
  // D = 128 only, 1 (64-row query tiles, Q's fragments held in registers).
  static constexpr int kWarpTiles = kWarpTilesValue;
  static constexpr int kBr = kKind == TcKernel::kBackwardDkDv ? (kHeadDim <= 64 ? 64 : 32)
                                                              : kWarps * kWarpRows * kWarpTiles;
  static constexpr int kBc = 64;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr size_t kElementBytes = 2;
  static constexpr size_t kRowTileBytes = static_cast<size_t>(kBr) * kHeadDim * kElementBytes;
  static constexpr size_t kKeyTileBytes = static_cast<size_t>(kBc) * kHeadDim * kElementBytes;
  // Forward: Q, then K and V double-buffered. dq: Q, dO, then K and V double-buffered.
  // dk/dv: K, V, then Q and dO double-buffered. Then 5 vectors of 4-byte values per row or key
  // of a tile, double-buffered: the tree's subtree ends and positions of a key tile; lse, D,
  // positions and the visible key range (two) of a query tile.
  static constexpr size_t kTileBytes =
      kKind == TcKernel::kForward      ? kRowTileBytes + 4 * kKeyTileBytes
      : kKind == TcKernel::kBackwardDq ? 2 * kRowTileBytes + 4 * kKeyTileBytes
                                       : 2 * kKeyTileBytes + 4 * kRowTileBytes;
  static constexpr int kVectorLen = 64;
  static constexpr size_t kVectorBytes = 2 * 5 * kVectorLen * 4;
  // Forward: 3 vectors of 4-byte values per query row (each row's visible key columns, its
  // position).
  static constexpr size_t kRowVectorBytes =
      kKind == TcKernel::kForward ? 3 * static_cast<size_t>(kBr) * 4 : 0;
  static constexpr size_t kSharedBytes = kTileBytes + kVectorBytes + kRowVectorBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "tensor-core head dims");
  static_assert(kWarpTiles == 1 || (kWarpTiles == 2 && kKind == TcKernel::kForward),
                "two row tiles per warp in the forward only");
  static_assert(kBr % 16 == 0 && kBc % 16 == 0, "whole mma tiles");
  static_assert(kBc <= kVectorLen, "per-key vectors");
  static_assert(kKind == TcKernel::kForward || kBr <= kVectorLen, "per-row vectors");
  static_assert(kSharedBytes <= 163 * 1024, "shared-memory budget of sm_80");
};

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_TRAITS_H_
