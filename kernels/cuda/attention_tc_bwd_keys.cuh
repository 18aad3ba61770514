#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_KEYS_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_KEYS_CUH_

// Pass 2 of the tensor-core attention backward (attention_tc_bwd.cuh has the pre-pass and pass
// 1): dK and dV, a block of 8 warps per (128 keys, kv head, sequence), started heaviest first
// (HeaviestFirstBlock<uint32_t>, the key tiles counted back from each sequence's end).
// K and V stay in shared memory; the block walks the group's query heads and the query tiles
// (64 rows) that see its keys (a range found once per block, walked by two counters), with Q and
// dO tiles double-buffered by cp.async and each tile's lse, D, positions and per-row key ranges
// in double-buffered shared vectors. The layout is FlashAttention-2's backward at head dim 128
// (64 query rows by 128 keys, 8 warps): warp w owns key slab w / 2 (32 keys) and half w % 2, and
// works each query tile in two phases:
//   1. Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for its 32 keys × the 32 query rows of its half, then Pᵀ and
//      dSᵀ (masked on partial tiles) rounded to T into two shared tiles [128 keys][64 queries];
//   2. after a barrier, dV += Pᵀ dO and dK += dSᵀ Q for its 32 keys × the head-dim columns of its
//      half, over all 64 query rows: Pᵀ and dSᵀ as A fragments by ldmatrix, dO's and Q's B
//      fragments by ldmatrix .trans.
// Each warp's products are 32 × 32 (phase 1) and 32 × D/2 (phase 2), so every fragment loaded
// from shared memory serves two or more tensor-core products: at head dim 128 0.47 shared-memory
// transfers of 512 bytes (ldmatrix.x4, or the Pᵀ/dSᵀ stores) per m16n8k16 product, where warps
// owning 16 keys each (every Q and dO fragment serving one product) read 0.63. dK and dV of 32
// keys × D/2 are 64 accumulator registers each at D = 128, as with 16 keys × D.
//
// The body (BackwardKeyTile) is also the one-pass backward's (attention_tc_bwd_onepass.cuh),
// whose sink adds each query tile's dQ = dS K from the same shared dSᵀ tile.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/attention_tile.h"
#include "kernels/common/half.h"
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_tc_bwd.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_traits.h"
#include "kernels/cuda/ptx.cuh"

namespace packsched::kernels::internal::cuda {

// What pass 2 does with dS beyond dK: nothing. The one-pass backward's sink
// (attention_tc_bwd_onepass.cuh) adds, after the barrier that makes a query tile's dSᵀ tile
// whole, the tile's dQ = dS K to a float32 accumulator.
struct NoDqSink {
  template <typename T>
  __device__ void Add(const T*, const T*, int64_t, int64_t, int64_t) {}
};

// Pass 2's block (see the kernel below) over the shared-memory layout of Tr, with `sink` given
// each query tile's dSᵀ.
template <typename T, int kD, typename Tr, bool kMapped = false, typename DqSink>
__device__ void BackwardKeyTile(const TcAttnParams& p, DqSink& sink) {
  constexpr int kBr = Tr::kBr;
  constexpr int kBc = Tr::kBc;
  constexpr int kV = Tr::kVectorLen;
  constexpr int kSlab = 32;       // keys per pair of warps
  constexpr int kHalf = kBr / 2;  // query rows of a warp's phase 1
  constexpr int kCols = kD / 2;   // head-dim columns of a warp's phase 2
  static_assert(Tr::kWarps == 2 * kBc / kSlab && kBr == 64, "pass 2's warp layout");
  const AttentionArgs& a = p.args;
  // Heaviest first: the grid's tile index counts key tiles back from each sequence's last one, so
  // the blocks that start first hold the first key tiles of the longest sequences, which the most
  // query tiles see under a causal mask (without one, the longest sequences' tiles).
  const TcBlockIndex block = HeaviestFirstBlock<uint32_t>();
  const AttnSeq seq = LoadSeq(a, block.seq);
  const int64_t hk = block.head;
  const int64_t key_tile = (seq.seg_k + kBc - 1) / kBc - 1 - block.tile;
  if (key_tile < 0) return;
  const int64_t key0 = key_tile * kBc;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t tile_cols = Clamp0(seq.seg_k - key0, kBc);
  const int64_t cols = Clamp0(seq.mask.sk - key0, tile_cols);  // real keys
  const TcMask mask = MakeTcMask(p, seq);
  const TcSoftmax sm = MakeTcSoftmax(a);

  using L = TcSmemLayout<Tr>;
  unsigned char* smem = ptx::DynamicSmem();
  T* ks = reinterpret_cast<T*>(smem + L::kKAt);                      // [kBc][kD]
  T* vs = reinterpret_cast<T*>(smem + L::kVAt);                      // [kBc][kD]
  T* qs = reinterpret_cast<T*>(smem + L::kQAt);                      // [2][kBr][kD]
  T* dos = reinterpret_cast<T*>(smem + L::kDoutAt);                  // [2][kBr][kD]
  T* pts = reinterpret_cast<T*>(smem + L::kScoresAt);                // Pᵀ [kBc][kBr]
  T* dsts = pts + kBc * kBr;                                         // dSᵀ [kBc][kBr]
  float* q_lse = reinterpret_cast<float*>(smem + L::Vector(0));      // [2][kV]
  float* q_d = reinterpret_cast<float*>(smem + L::Vector(1));        // [2][kV]
  int32_t* q_pos = reinterpret_cast<int32_t*>(smem + L::Vector(2));  // [2][kV]
  int32_t* q_lo = reinterpret_cast<int32_t*>(smem + L::Vector(3));   // [2][kV]
  int32_t* q_hi = reinterpret_cast<int32_t*>(smem + L::Vector(4));   // [2][kV]

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int slab = warp / 2;
  const int half = warp % 2;
  const int krow = slab * kSlab;  // the warp's first key in the block
  const int64_t slab_cols = Clamp0(cols - krow, kSlab);
  const int32_t slab_key = static_cast<int32_t>(key0 + krow);  // segments are below 2^31 keys

  // The largest subtree end of the block's and of the slab's real keys: no query at or past it
  // sees them.
  int32_t block_end = 0, slab_end = 0;
  if (mask.subtree_end != nullptr) {
    for (int c = 0; c < cols; ++c) {
      const int32_t e = mask.subtree_end[seq.k0 + key0 + c];
      block_end = e > block_end ? e : block_end;
    }
    slab_end = WarpMax(lane < slab_cols ? mask.subtree_end[seq.k0 + slab_key + lane] : 0);
  }

  LoadRowsAsync<T, kD, kBc, Tr::kThreads>(ks, a.k, seq.k0 + key0, cols, a.kv_heads, hk);
  LoadRowsAsync<T, kD, kBc, Tr::kThreads>(vs, a.v, seq.k0 + key0, cols, a.kv_heads, hk);
  ptx::CpAsyncCommit();

  // The query tiles that see a real key of the block, [t_lo, t_hi), found once: the same for
  // every head of the group, and contiguous (both ends of a row's visible keys, and with a tree
  // the bound block_end, are monotone in the row; a tile inside that saw none would be skipped
  // by every warp). The walk visits (head in the group, tile) in order with two counters: no
  // division per tile.
  const int tiles_q = static_cast<int>((mask.rule.sq + kBr - 1) / kBr);
  auto sees_block = [&](int tile) {
    const int64_t first = static_cast<int64_t>(tile) * kBr;
    const KeyRange kr = TileKeys<Tr>(mask.rule, first, Clamp0(mask.rule.sq - first, kBr));
    if (kr.hi <= key0 || kr.lo >= key0 + cols) return false;
    return mask.subtree_end == nullptr || seq.q0 + first < block_end;
  };
  // With a query-row map (kMapped: the kernel's instantiation for calls with one, so that the
  // plain walk keeps its registers) only the tiles holding a mapped real row are walked (the
  // others give no share); they need not be contiguous, so the walk steps by next_tile.
  auto listed = [&](int tile) {
    const int64_t first = static_cast<int64_t>(tile) * kBr;
    return !kMapped ||
           ListedRows(a, seq.q0 + first, seq.q0 + first + Clamp0(mask.rule.sq - first, kBr));
  };
  int t_lo = 0, t_hi = cols > 0 ? tiles_q : 0;
  while (t_lo < t_hi && !(sees_block(t_lo) && listed(t_lo))) ++t_lo;
  while (t_hi > t_lo && !(sees_block(t_hi - 1) && listed(t_hi - 1))) --t_hi;
  auto next_tile = [&](int tile) {
    do {
      ++tile;
    } while (kMapped && tile < t_hi && !listed(tile));
    return tile;
  };
  const int heads_in_group = t_hi > t_lo ? static_cast<int>(group) : 0;
  auto load_queries = [&](int head, int tile, int buf) {
    const int64_t h = hk * group + head;
    const int64_t first = static_cast<int64_t>(tile) * kBr;
    const int64_t rows = Clamp0(mask.rule.sq - first, kBr);
    T* qt = qs + buf * kBr * kD;
    T* dot = dos + buf * kBr * kD;
    LoadRowsAsync<T, kD, kBr, Tr::kThreads>(qt, a.q, seq.q0 + first, rows, a.heads, h);
    LoadRowsAsync<T, kD, kBr, Tr::kThreads>(dot, a.dout, seq.q0 + first, rows, a.heads, h);
    // lse (as TcProb's base), D (the pre-pass's) and positions of the tile's rows, from global
    // memory, and the keys each row sees by the varlen rule (empty for pad rows), for the
    // partial tiles' per-element mask.
    for (int r = threadIdx.x; r < kBr; r += Tr::kThreads) {
      const int64_t q_row = seq.q0 + first + r;
      // P = 0 outside the map.
      const bool real = r < rows && (!kMapped || ListedRows(a, q_row, q_row + 1));
      const KeyRange seen = VisibleKeys(mask.rule, first + r);
      q_lo[buf * kV + r] = static_cast<int32_t>(seen.lo);
      q_hi[buf * kV + r] = static_cast<int32_t>(seen.hi);
      q_d[buf * kV + r] = real ? p.dout_dot_out[q_row * a.heads + h] : 0.f;
      q_lse[buf * kV + r] =
          real ? TcLse2(static_cast<const float*>(a.lse)[h * a.total_q + q_row]) : Inf<float>();
      q_pos[buf * kV + r] = real && mask.positions != nullptr ? mask.positions[q_row] : 0;
    }
  };

  float dk[kSlab / 16][kCols / 8][4];
  float dv[kSlab / 16][kCols / 8][4];
  ZeroAcc(dk);
  ZeroAcc(dv);
  int head = 0, tile = t_lo;  // the query tile being processed
  if (head < heads_in_group) load_queries(head, tile, 0);
  ptx::CpAsyncCommit();
  // The query-tile loop, compiled capped and not (RunPerCap).
  auto tile_loop = [&](auto capped) {
    for (int n = 0; head < heads_in_group; ++n) {
      const int buf = n & 1;
      const int after = next_tile(tile);
      const bool wrap = after == t_hi;
      const int head_next = wrap ? head + 1 : head;
      const int tile_next = wrap ? t_lo : after;
      if (head_next < heads_in_group) load_queries(head_next, tile_next, buf ^ 1);
      ptx::CpAsyncCommit();
      ptx::CpAsyncWait<1>();  // K, V and this tile have landed
      __syncthreads();
      const int64_t first = static_cast<int64_t>(tile) * kBr;
      const int64_t rows = Clamp0(mask.rule.sq - first, kBr);
      const T* qt = qs + buf * kBr * kD;
      const T* dot = dos + buf * kBr * kD;
      const int32_t* row_lo = q_lo + buf * kV;
      const int32_t* row_hi = q_hi + buf * kV;
      // Uniform across the pair of warps of a slab: which halves of the tile's rows see one of
      // the slab's keys (a half's first and last real rows bound its rows' keys: both ends of a
      // row's range are non-decreasing in the row), and whether every row of the warp's half sees
      // every key of the slab, so that no per-element mask is needed (no tree, all real). Read
      // from the tile's key-range vectors (32-bit compares). A pair whose halves both see none
      // skips phase 2.
      bool sees_half[2];  // unrolled: two registers, not an array indexed by the warp's half
      bool full = false;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int top = hh * kHalf;
        const int n = static_cast<int>(Clamp0(rows - top, kHalf));
        const int bottom = top + (n > 0 ? n - 1 : 0);
        sees_half[hh] = n > 0 && slab_cols > 0 && row_lo[top] < row_hi[bottom] &&
                        row_hi[bottom] > slab_key && row_lo[top] < slab_key + slab_cols &&
                        (mask.subtree_end == nullptr || seq.q0 + first + top < slab_end);
        if (hh == half) {
          full = mask.subtree_end == nullptr && n == kHalf && slab_cols == kSlab &&
                 row_lo[bottom] <= slab_key && slab_key + kSlab <= row_hi[top];
        }
      }
      const bool sees = half == 0 ? sees_half[0] : sees_half[1];
      const bool pair_sees = sees_half[0] || sees_half[1];
      const int qrow = half * kHalf;  // the warp's first query row of phase 1
      if (sees) {
        const float* lse = q_lse + buf * kV;
        const float* d_row = q_d + buf * kV;
        float st[kSlab / 16][kHalf / 8][4];
        float dpt[kSlab / 16][kHalf / 8][4];
        ZeroAcc(st);
        ZeroAcc(dpt);
        MmaTileTimesTileT<T, kD, kSlab, kHalf>(st, ks, krow, qt, qrow);    // Sᵀ = K Qᵀ
        MmaTileTimesTileT<T, kD, kSlab, kHalf>(dpt, vs, krow, dot, qrow);  // dPᵀ = V dOᵀ
        // Pᵀ and dSᵀ for every score, with no per-score branch; then on partial tiles the mask,
        // by selection (a score the mask hides may have given inf or NaN).
#pragma unroll
        for (int mi = 0; mi < kSlab / 16; ++mi) {
          if constexpr (decltype(capped)::value) CapScores(sm, st[mi]);
#pragma unroll
          for (int nt = 0; nt < kHalf / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int c = qrow + nt * 8 + 2 * t + (i & 1);  // query row of the tile
              const float pr = TcProb(sm, st[mi][nt][i], lse[c]);
              dpt[mi][nt][i] = TcScoreGradient<decltype(capped)::value>(sm, pr, dpt[mi][nt][i],
                                                                        d_row[c], st[mi][nt][i]);
              st[mi][nt][i] = pr;
            }
          }
        }
        if (!full) {
          const int32_t* pos = q_pos + buf * kV;
#pragma unroll
          for (int mi = 0; mi < kSlab / 16; ++mi) {
#pragma unroll
            for (int nt = 0; nt < kHalf / 8; ++nt) {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int c = qrow + nt * 8 + 2 * t + (i & 1);
                const int32_t j = slab_key + 16 * mi + g + 8 * (i / 2);
                bool visible = j >= row_lo[c] && j < row_hi[c];
                if (visible && mask.subtree_end != nullptr) {
                  // The varlen rule let j through, so j is a real key of the sequence.
                  const int64_t qi = first + c;
                  const TcRow q{KeyRange{row_lo[c], row_hi[c]}, qi,
                                static_cast<int32_t>(seq.q0 + qi), pos[c]};
                  const int64_t kj = seq.k0 + j;
                  visible = TreeVisible(mask, q, j, mask.subtree_end[kj],
                                        mask.positions != nullptr ? mask.positions[kj] : 0);
                }
                if (!visible) st[mi][nt][i] = dpt[mi][nt][i] = 0.f;
              }
            }
          }
        }
        StoreAcc<T, kBr, kSlab, kHalf>(pts, krow, qrow, st);
        StoreAcc<T, kBr, kSlab, kHalf>(dsts, krow, qrow, dpt);
      } else {
        // Nothing of the warp's part is visible: its Pᵀ and dSᵀ are 0 (read by phase 2 when the
        // other half sees the slab, and by the one-pass sink).
        float zero[kSlab / 16][kHalf / 8][4];
        ZeroAcc(zero);
        StoreAcc<T, kBr, kSlab, kHalf>(pts, krow, qrow, zero);
        StoreAcc<T, kBr, kSlab, kHalf>(dsts, krow, qrow, zero);
      }
      __syncthreads();
      if (pair_sees) {
        // dV += Pᵀ dO and dK += dSᵀ Q for the slab's keys and the warp's half of the columns.
        MmaTileTimesTile<T, kBr, kD, kSlab, kCols>(dv, pts, krow, dot, half * kCols);
        MmaTileTimesTile<T, kBr, kD, kSlab, kCols>(dk, dsts, krow, qt, half * kCols);
      }
      sink.Add(dsts, ks, seq.q0 + first, rows, hk * group + head);
      __syncthreads();
      head = head_next;
      tile = tile_next;
    }
  };
  RunPerCap(sm, tile_loop);
  ptx::CpAsyncWait<0>();

#pragma unroll
  for (int mi = 0; mi < kSlab / 16; ++mi) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t c = krow + 16 * mi + g + 8 * rr;
      if (c >= tile_cols) continue;
      const int64_t offset = ((seq.k0 + key0 + c) * a.kv_heads + hk) * kD + half * kCols;
      T* dk_out = static_cast<T*>(a.dk) + offset;
      T* dv_out = static_cast<T*>(a.dv) + offset;
#pragma unroll
      for (int dt = 0; dt < kCols / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(dk_out + dt * 8 + 2 * t) =
            ptx::PackPair<T>(dk[mi][dt][2 * rr] * sm.scale, dk[mi][dt][2 * rr + 1] * sm.scale);
        *reinterpret_cast<uint32_t*>(dv_out + dt * 8 + 2 * t) =
            ptx::PackPair<T>(dv[mi][dt][2 * rr], dv[mi][dt][2 * rr + 1]);
      }
    }
  }
}

// kMapped: for calls with a query-row map (p.args.query_runs set), else without.
template <typename T, int kD, bool kMapped>
__global__ void __launch_bounds__(256) AttentionTcBackwardDkDvKernel(const TcAttnParams p) {
  NoDqSink sink;
  BackwardKeyTile<T, kD, TcTraits<kD, TcKernel::kBackwardDkDv>, kMapped>(p, sink);
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_KEYS_CUH_
