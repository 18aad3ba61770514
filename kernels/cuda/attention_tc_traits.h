#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_TRAITS_H_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_TRAITS_H_

// Compile-time shapes of the tensor-core attention kernels (attention_tc_fwd.cuh,
// attention_tc_bwd.cuh, attention_tc_bwd_keys.cuh): head dim 64, 96 or 128 exactly (no padding);
// the forward runs 4 warps per block, each owning 16-row mma tiles of the block's query tile; the
// dq kernel 4 warps over 64 query rows, 32 rows per pair of warps; the dk/dv kernel 8 warps over
// 128 keys, 32 keys per pair of warps; and the shared-memory budget of the 16-bit tiles.
//
// Shared tiles hold rows of kHeadDim 16-bit elements, 16-byte chunks XOR-swizzled by the row
// (chunk c of row r is stored at chunk c ^ (r % 8), within groups of 4 chunks at head dim 96:
// SwzChunk in attention_tc_common.cuh): the 8 row addresses of one ldmatrix phase then cover all
// 32 banks, and cp.async writes whole chunks.

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace packsched::kernels::internal::cuda {

enum class TcKernel { kForward, kBackwardDq, kBackwardDkDv };

// The forward's default 16-row mma tiles per warp (TcTraits::kWarpTiles): 2 at every head dim
// (128-row query tiles). Other kernels use 1.
constexpr int TcDefaultWarpTiles(TcKernel kind) { return kind == TcKernel::kForward ? 2 : 1; }

template <int kHeadDimValue, TcKernel kKind, int kWarpTilesValue = TcDefaultWarpTiles(kKind)>
struct TcTraits {
  static constexpr TcKernel kKernel = kKind;
  static constexpr int kHeadDim = kHeadDimValue;
  static constexpr int kWarps = kKind == TcKernel::kBackwardDkDv ? 8 : 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16;  // rows of one mma tile
  // Query rows per tile and keys per tile. The forward and dq kernels hold kBr = 64 x kWarpTiles
  // query rows (16 per warp and row tile) and walk key tiles of kBc = 64; the dk/dv kernel
  // holds kBc = 128 keys (32 per pair of warps) and walks query tiles of kBr = 64 rows.
  // The forward gives each warp kWarpTiles tiles of 16 rows: 2 (128-row query tiles: each K/V
  // fragment loaded serves 32 rows, Q's fragments reloaded from shared memory per k step) or, at
  // D = 128 only, 1 (64-row query tiles, Q's fragments held in registers).
  static constexpr int kWarpTiles = kWarpTilesValue;
  static constexpr int kBr =
      kKind == TcKernel::kBackwardDkDv ? 64 : kWarps * kWarpRows * kWarpTiles;
  static constexpr int kBc = kKind == TcKernel::kBackwardDkDv ? 128 : 64;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr size_t kElementBytes = 2;
  static constexpr size_t kRowTileBytes = static_cast<size_t>(kBr) * kHeadDim * kElementBytes;
  static constexpr size_t kKeyTileBytes = static_cast<size_t>(kBc) * kHeadDim * kElementBytes;
  // A tile of 16-bit scores, kBr x kBc: the dq kernel's dS, the dk/dv kernel's Pᵀ and dSᵀ.
  static constexpr size_t kScoreTileBytes = static_cast<size_t>(kBc) * kBr * kElementBytes;
  // Forward: Q, then K and V double-buffered. dq: Q, dO, K and V double-buffered, dS.
  // dk/dv: K, V, Q and dO double-buffered, Pᵀ, dSᵀ. Then 5 vectors of 4-byte values per row or
  // key of a tile, double-buffered: the tree's subtree ends and positions of a key tile; lse, D,
  // positions and the visible key range (two) of a query tile.
  static constexpr size_t kTileBytes =
      kKind == TcKernel::kForward ? kRowTileBytes + 4 * kKeyTileBytes
      : kKind == TcKernel::kBackwardDq
          ? 2 * kRowTileBytes + 4 * kKeyTileBytes + kScoreTileBytes
          : 2 * kKeyTileBytes + 4 * kRowTileBytes + 2 * kScoreTileBytes;
  static constexpr int kVectorLen = 64;
  static constexpr size_t kVectorBytes = 2 * 5 * kVectorLen * 4;
  // Forward and dq: 3 vectors of 4-byte values per query row of the block's tile (each row's
  // visible keys, its position).
  static constexpr size_t kRowVectorBytes =
      kKind != TcKernel::kBackwardDkDv ? 3 * static_cast<size_t>(kBr) * 4 : 0;
  static constexpr size_t kSharedBytes = kTileBytes + kVectorBytes + kRowVectorBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128, "tensor-core head dims");
  static_assert(kWarpTiles == 1 || (kWarpTiles == 2 && kKind == TcKernel::kForward),
                "two row tiles per warp in the forward only");
  static_assert(kBr % 16 == 0 && kBc % 16 == 0, "whole mma tiles");
  static_assert(kKind == TcKernel::kBackwardDkDv || kBc <= kVectorLen, "per-key vectors");
  static_assert(kKind == TcKernel::kForward || kBr <= kVectorLen, "per-row vectors");
  static_assert(kSharedBytes <= 163 * 1024, "shared-memory budget of sm_80");
};

// The dynamic shared memory of the tensor-core kernel of traits Tr, carved from one typed layout:
// each region's byte offset from the block's base, in the kernel's order, and the total, which
// equals the budget TcTraits computes (Tr::kSharedBytes, what the launch asks for; asserted). A
// region the kernel does not have is empty. Tiles are rows of kHeadDim 16-bit elements; vectors
// hold 4-byte values.
//   forward  Q [kBr][kD], K and V [2][kBc][kD] (double-buffered), the key vectors, row vectors
//   dq       Q and dO [kBr][kD], K and V [2][kBc][kD], dS [kBr][kBc], key vectors, row vectors
//   dk/dv    K and V [kBc][kD], Q and dO [2][kBr][kD], Pᵀ and dSᵀ [kBc][kBr], query vectors
// Vectors: 5 of [2][kVectorLen], Vector(i): forward and dq the key tile's subtree ends (0) and
// positions (1), the others unused; dk/dv the query tile's lse (0), D (1), positions (2) and
// visible key range (3: lo, 4: hi). Row vectors (forward and dq): 3 of [kBr], RowVector(i): the
// visible key range (0: lo, 1: hi) and position (2) of each row of the block's query tile.
template <typename Tr>
struct TcSmemLayout {
  static constexpr bool kKeyBlock = Tr::kKernel == TcKernel::kBackwardDkDv;  // K, V held
  static constexpr size_t kQBytes = (kKeyBlock ? 2 : 1) * Tr::kRowTileBytes;
  static constexpr size_t kDoutBytes = Tr::kKernel == TcKernel::kForward ? 0 : kQBytes;
  static constexpr size_t kKvBytes = (kKeyBlock ? 1 : 2) * Tr::kKeyTileBytes;
  static constexpr int kScoreTiles = Tr::kKernel == TcKernel::kForward ? 0 : kKeyBlock ? 2 : 1;

  static constexpr size_t kQAt = kKeyBlock ? 2 * kKvBytes : 0;
  static constexpr size_t kDoutAt = kQAt + kQBytes;
  static constexpr size_t kKAt = kKeyBlock ? 0 : kDoutAt + kDoutBytes;
  static constexpr size_t kVAt = kKAt + kKvBytes;
  // dS (dq); Pᵀ, then dSᵀ at kScoresAt + kScoreTileBytes (dk/dv).
  static constexpr size_t kScoresAt = kKeyBlock ? kDoutAt + kDoutBytes : kVAt + kKvBytes;
  static constexpr size_t kVectors = kScoresAt + kScoreTiles * Tr::kScoreTileBytes;
  static constexpr int kVectorCount = 5;
  static constexpr size_t kOneVectorBytes = 2 * static_cast<size_t>(Tr::kVectorLen) * 4;
  static constexpr size_t Vector(int i) { return kVectors + i * kOneVectorBytes; }
  static constexpr size_t kRows = kVectors + kVectorCount * kOneVectorBytes;
  static constexpr int kRowVectorCount = kKeyBlock ? 0 : 3;
  static constexpr size_t RowVector(int i) { return kRows + i * static_cast<size_t>(Tr::kBr) * 4; }
  static constexpr size_t kBytes = RowVector(kRowVectorCount);

  static_assert(kVectors == Tr::kTileBytes, "the tiles are the traits' tile budget");
  static_assert(kBytes == Tr::kSharedBytes, "the layout is what the launch asks for");
  static_assert(kQAt % 16 == 0 && kDoutAt % 16 == 0 && kKAt % 16 == 0 && kVAt % 16 == 0 &&
                    kScoresAt % 16 == 0 && kVectors % 16 == 0 && kRows % 16 == 0,
                "16-byte aligned regions (cp.async, ldmatrix)");
};

// The most dynamic shared memory a tensor-core kernel of head dim kD asks for per block (the
// forward at either tile shape, pass 1, pass 2 and the one-pass backward, which shares pass 2's
// layout): 162.5 KiB at D = 128, within sm_80's and sm_90's opt-in limits, above the 99 KiB of
// sm_86, sm_89 and sm_120, where head dims 96 and 128 therefore take the scalar kernels
// (AttentionTcApplies).
template <int kD>
constexpr size_t TcMaxSharedBytes() {
  size_t most = TcTraits<kD, TcKernel::kForward>::kSharedBytes;
  const size_t others[] = {TcTraits<kD, TcKernel::kForward, 1>::kSharedBytes,
                           TcTraits<kD, TcKernel::kBackwardDq>::kSharedBytes,
                           TcTraits<kD, TcKernel::kBackwardDkDv>::kSharedBytes};
  for (const size_t bytes : others) most = bytes > most ? bytes : most;
  return most;
}

// Whether `head_dim` has tensor-core kernels.
constexpr bool TcHeadDim(int head_dim) {
  return head_dim == 64 || head_dim == 96 || head_dim == 128;
}

// The one dispatch over the tensor-core head dims: f(std::integral_constant<int, D>{}) for
// head_dim D (TcHeadDim; callers have checked it, anything else is taken as 128).
template <typename F>
constexpr auto WithTcHeadDim(int64_t head_dim, F&& f) {
  if (head_dim == 64) return f(std::integral_constant<int, 64>{});
  if (head_dim == 96) return f(std::integral_constant<int, 96>{});
  return f(std::integral_constant<int, 128>{});
}

// Whether every tensor-core kernel of `head_dim` (TcHeadDim) fits a device whose opt-in limit of
// dynamic shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin) is `optin_bytes`.
constexpr bool TcFitsSharedMemory(int head_dim, size_t optin_bytes) {
  return WithTcHeadDim(head_dim, [](auto d) { return TcMaxSharedBytes<decltype(d)::value>(); }) <=
         optin_bytes;
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_TRAITS_H_
