#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_FWD_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_FWD_CUH_

// The tensor-core attention forward (FlashAttention-2 on mma.sync): one block of 4 warps per
// (query tile, head, sequence), grid as the scalar kernel's (attention_device.cuh) but walked
// heaviest-first (HeaviestFirstBlock: the highest tile indices, under a causal mask the tiles
// that see the most keys, start first). Each warp owns kM tiles of 16 query rows: 2 (128-row
// query tiles; D = 64 and 96, and D = 128 by default) or 1 (64-row tiles, D = 128 only; the
// launcher's PACKSCHED_ATTENTION_TC_FWD_TILE=64):
//   - Q is copied to shared memory once (cp.async); with kM = 1 its A fragments stay in
//     registers, with kM = 2 they are reloaded by ldmatrix per 16-wide k step;
//   - key tiles of 64 keys (K and V, swizzled) are double-buffered: tile n + 1 is in flight
//     (cp.async) while tile n is used;
//   - on partial tiles the mask is computed first, as one bit per score of the lane (the per-row
//     key ranges and positions come from shared memory), so that it costs few registers while S
//     is live;
//   - S = Q Kᵀ: B fragments of K by ldmatrix (K's rows are B's columns), each used for all the
//     warp's row tiles, float accumulators; at D = 96 and 128 with kM = 2 in sub-tiles of 32 keys
//     (S, softmax and P V per sub-tile: S's 32 x 64 accumulators plus O's 32 x D spill);
//   - softcap and mask on the accumulators; the online softmax in registers, in base 2 with the
//     scale folded into the exponent (TcSoftmax: one fused multiply-add and one ex2 per score, no
//     per-score branch; each row lives in the 4 lanes of a quad: max and sum by two shuffles);
//   - P (rounded to T) is reused as A fragments directly from S's accumulator layout (the C layout
//     of two 8-key tiles is the A layout of one 16-key step), O += P V with V's B fragments by
//     ldmatrix .trans.
// A warp skips a key tile none of its rows sees (the varlen rule; with a tree, when its first
// query row is at or past every key's subtree end). With a query-row map a block whose tile holds
// no mapped row exits at once (attention_query_runs.cuh).

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/attention_tile.h"
#include "kernels/common/half.h"
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_traits.h"
#include "kernels/cuda/ptx.cuh"

namespace packsched::kernels::internal::cuda {

template <typename T, int kD, int kM>
__global__ void __launch_bounds__(128) AttentionTcForwardKernel(const TcAttnParams p) {
  using Tr = TcTraits<kD, TcKernel::kForward, kM>;
  constexpr int kBr = Tr::kBr;
  constexpr int kBc = Tr::kBc;
  constexpr int kV = Tr::kVectorLen;
  const AttentionArgs& a = p.args;
  const TcBlockIndex block = HeaviestFirstBlock();
  const AttnSeq seq = LoadSeq(a, block.seq);
  const QueryTile tile = QueryTileAt<Tr>(a, seq, block.tile, block.head);
  if (tile.first >= seq.seg_q) return;
  if (!ListedRows(a, seq.q0 + tile.first, seq.q0 + tile.first + tile.tile_rows)) return;
  const int64_t h = tile.h, hk = tile.hk, first = tile.first, rows = tile.rows;
  const TcMask mask = MakeTcMask(p, seq);
  const TcSoftmax sm = MakeTcSoftmax(a);

  using L = TcSmemLayout<Tr>;
  unsigned char* smem = ptx::DynamicSmem();
  T* qs = reinterpret_cast<T*>(smem + L::kQAt);                           // [kBr][kD]
  T* ks = reinterpret_cast<T*>(smem + L::kKAt);                           // [2][kBc][kD]
  T* vs = reinterpret_cast<T*>(smem + L::kVAt);                           // [2][kBc][kD]
  int32_t* key_end = reinterpret_cast<int32_t*>(smem + L::Vector(0));     // [2][kV]
  int32_t* key_pos = reinterpret_cast<int32_t*>(smem + L::Vector(1));     // [2][kV]
  int32_t* row_lo = reinterpret_cast<int32_t*>(smem + L::RowVector(0));   // [kBr]
  int32_t* row_hi = reinterpret_cast<int32_t*>(smem + L::RowVector(1));   // [kBr]
  int32_t* row_pos = reinterpret_cast<int32_t*>(smem + L::RowVector(2));  // [kBr]

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const KeyRange keys = TileKeys<Tr>(mask.rule, first, rows);
  const int tiles = keys.hi > keys.lo ? static_cast<int>((keys.hi - keys.lo + kBc - 1) / kBc) : 0;
  const KeySource<T> key_source = MakeKeySource<T, kD>(a, mask, keys.lo, hk);
  auto load_keys = [&](int n) { LoadKeyTile<T, Tr>(key_source, n, ks, vs, key_end, key_pos); };

  LoadRowsAsync<T, kD, kBr, Tr::kThreads>(qs, a.q, seq.q0 + first, rows, a.heads, h);
  ptx::CpAsyncCommit();
  // Per row of the tile, what the partial tiles' predicate needs, read there from shared memory
  // rather than held in registers across the loop: the keys the row sees (VisibleKeys; empty for
  // pad slots) as key columns counted from keys.lo, in 32 bits (segments are below 2^31 rows),
  // and with a tree and a left window the row's position.
  for (int r = threadIdx.x; r < kBr; r += Tr::kThreads) {
    const KeyRange k = VisibleKeys(mask.rule, first + r);
    row_lo[r] = static_cast<int32_t>(Clamp0(k.lo - keys.lo, int64_t{tiles} * kBc));
    row_hi[r] = static_cast<int32_t>(Clamp0(k.hi - keys.lo, int64_t{tiles} * kBc));
    row_pos[r] = mask.positions != nullptr && first + r < mask.rule.sq
                     ? mask.positions[seq.q0 + first + r]
                     : 0;
  }
  if (tiles > 0) load_keys(0);
  ptx::CpAsyncCommit();
  ptx::CpAsyncWait<1>();  // Q has landed
  __syncthreads();

  // The warp's rows: kM mma tiles of 16; this lane holds rows g and g + 8 of each, "row slot"
  // rs = 2 mi + half for row wrow + 16 mi + 8 half + g.
  constexpr int kSlots = 2 * kM;
  // Keys per sub-tile of S (a whole key tile but at D = 96 and 128 with two row tiles per warp).
  constexpr int kSub = kD >= 96 && kM == 2 ? 32 : kBc;
  const int wrow = warp * 16 * kM;
  // The lane's swizzled column offsets (SwzPairs; every fragment's rows start at a multiple of 8)
  // and its row of Q's A fragments.
  const SwzPairs pairs_a = MakeSwzPairs<kD>(0, lane / 16, lane % 8);
  const SwzPairs pairs_b = MakeSwzPairs<kD>(0, lane / 8 % 2, lane % 8);
  const T* q_row = qs + (wrow + lane % 16) * kD;
  const int64_t warp_rows = Clamp0(rows - wrow, 16 * kM);
  // The key tiles (loop indices) in which some row of the warp sees a key, and those in which
  // every row sees every key (WarpKeysOf).
  const WarpKeys wk = WarpKeysOf(mask, first + wrow, warp_rows, 16 * kM);
  const TileSpan some = TilesOverlapping(wk.some, keys.lo, kBc, tiles);
  const TileSpan all = TilesInside(wk.all, keys.lo, kBc, tiles);
  const int32_t row0 = static_cast<int32_t>(seq.q0 + first + wrow + g);  // packed row of slot 0

  float o[kM][kD / 8][4];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
      o[mi][dt][0] = o[mi][dt][1] = o[mi][dt][2] = o[mi][dt][3] = 0.f;
  }
  // With one row tile per warp, Q's A fragments for every k step stay in registers.
  constexpr bool kQInRegisters = kM == 1;
  uint32_t q_regs[kQInRegisters ? kD / 16 : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      ptx::Ldmatrix(q_regs[kk], qs + Swz<kD>(wrow + lane % 16, kk * 16 + 8 * (lane / 16)));
    }
  }
  SoftmaxRow<float> state[kSlots];
#pragma unroll
  for (int rs = 0; rs < kSlots; ++rs) state[rs] = TcRowStart();

  // The key-tile loop, compiled capped and not (RunPerCap).
  auto tile_loop = [&](auto capped) {
    for (int n = 0; n < tiles; ++n) {
      const int buf = static_cast<int>(n & 1);
      if (n + 1 < tiles) load_keys(n + 1);  // its buffer was released by the last barrier
      ptx::CpAsyncCommit();
      ptx::CpAsyncWait<1>();  // tile n has landed
      __syncthreads();
      const T* kt = ks + buf * kBc * kD;
      const T* vt = vs + buf * kBc * kD;
      const int32_t* end = key_end + buf * kV;
      const int32_t* pos = key_pos + buf * kV;
      // Uniform across the warp: every lane computes the same.
      bool skip = n < some.lo || n >= some.hi;
      if (!skip && mask.subtree_end != nullptr) {
        const int32_t a0 = end[lane], a1 = end[lane + 32];
        skip = row0 - g >= WarpMax(a0 > a1 ? a0 : a1);
      }
      const bool full = n >= all.lo && n < all.hi;
      if (!skip) {
        // On partial tiles (the diagonal, window edges, trees), which of this lane's scores the
        // mask lets through, computed before S is live: bit 16 half + 2 nt + e of visible[mi] for
        // row slot 2 mi + half, column 8 nt + 2 t + e. The varlen rule by the row's column range;
        // with a tree, the tree rule by its packed index and position (TreeKeyVisible; the
        // varlen rule already keeps j <= i, a tree being causal).
        uint32_t visible[kM];
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) visible[mi] = ~0u;
        if (!full) {
          const bool tree = mask.subtree_end != nullptr;
#pragma unroll
          for (int rs = 0; rs < kSlots; ++rs) {
            const int r = wrow + 8 * rs + g;
            const int lo = row_lo[r] - n * kBc;
            const int hi = row_hi[r] - n * kBc;
            const int32_t packed = row0 + 8 * rs;
            const int32_t position = row_pos[r];
            uint32_t bits = 0;
#pragma unroll
            for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int c = nt * 8 + 2 * t + e;
                bool v = c >= lo && c < hi;
                if (v && tree) v = TreeKeyVisible(packed, end[c], position, pos[c], mask.window);
                bits |= static_cast<uint32_t>(v) << (nt * 2 + e);
              }
            }
            visible[rs / 2] = rs % 2 == 0 ? bits : (visible[rs / 2] & 0xffffu) | (bits << 16);
          }
        }
        // The tile in sub-tiles of kSub keys (S, softmax, P V per sub-tile), bounding S's
        // accumulators: 32 keys at D = 96 and 128 with two row tiles per warp. Not unrolled, so
        // that the scheduler does not overlap one sub-tile's S with the other's (that spills).
#pragma unroll 1
        for (int sub = 0; sub < kBc / kSub; ++sub) {
          float s[kM][kSub / 8][4];
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
            for (int nt = 0; nt < kSub / 8; ++nt) {
              s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.f;
            }
          }
          // S = Q Kᵀ: per 16-wide k step, the warp's Q fragments (A, from shared memory) and each
          // pair of 8-key K fragments (B) once for all kM row tiles.
#pragma unroll
          for (int kk = 0; kk < kD / 16; ++kk) {
            uint32_t qf[kM][4];
#pragma unroll
            for (int mi = 0; mi < kM; ++mi) {
              if constexpr (kQInRegisters) {
#pragma unroll
                for (int r = 0; r < 4; ++r) qf[mi][r] = q_regs[kk][r];
              } else {
                ptx::Ldmatrix(qf[mi], q_row + 16 * mi * kD + SwzPair(pairs_a, kk));
              }
            }
#pragma unroll
            for (int np = 0; np < kSub / 16; ++np) {
              // Matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (8-15, 8-15).
              uint32_t b[4];
              ptx::Ldmatrix(b, kt + (kSub * sub + np * 16 + lane % 8 + 8 * (lane / 16)) * kD +
                                   SwzPair(pairs_b, kk));
              const uint32_t b0[2] = {b[0], b[1]};
              const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
              for (int mi = 0; mi < kM; ++mi) {
                ptx::Mma<T>(s[mi][2 * np], qf[mi], b0);
                ptx::Mma<T>(s[mi][2 * np + 1], qf[mi], b1);
              }
            }
          }
          // The cap (scores otherwise stay unscaled: TcSoftmax), then on partial tiles the mask.
          if constexpr (decltype(capped)::value) {
#pragma unroll
            for (int mi = 0; mi < kM; ++mi) CapScores(sm, s[mi]);
          }
          if (!full) {
#pragma unroll
            for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
              for (int nt = 0; nt < kSub / 8; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  if (!(visible[mi] >> ((i / 2) * 16 + (kSub / 8 * sub + nt) * 2 + (i & 1)) & 1u)) {
                    s[mi][nt][i] = -Inf<float>();
                  }
                }
              }
            }
          }
          float tile_max[kSlots];
#pragma unroll
          for (int rs = 0; rs < kSlots; ++rs) tile_max[rs] = -Inf<float>();
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
            for (int nt = 0; nt < kSub / 8; ++nt) {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                tile_max[2 * mi + i / 2] = fmaxf(tile_max[2 * mi + i / 2], s[mi][nt][i]);
              }
            }
          }
          // The rows' maxes move, and O is rescaled, only when some row of the warp grows past
          // its slack (kRescaleSlack): after the first tiles of a row that is rare, and the
          // kD / 2 multiplies per row slot are skipped.
          bool grows = false;
#pragma unroll
          for (int rs = 0; rs < kSlots; ++rs) {
            tile_max[rs] = QuadMax(tile_max[rs]);
            grows = grows || TcMaxGrows(sm, state[rs], tile_max[rs]);
          }
          if (ptx::WarpAny(grows)) {
            float factor[kSlots];
#pragma unroll
            for (int rs = 0; rs < kSlots; ++rs) factor[rs] = TcRescale(sm, state[rs], tile_max[rs]);
#pragma unroll
            for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
              for (int dt = 0; dt < kD / 8; ++dt) {
                o[mi][dt][0] *= factor[2 * mi];
                o[mi][dt][1] *= factor[2 * mi];
                o[mi][dt][2] *= factor[2 * mi + 1];
                o[mi][dt][3] *= factor[2 * mi + 1];
              }
            }
          }
          // O += P V per 16 keys: P of the 16 keys (the row sums take them as they are), rounded to
          // T, as A fragments straight from the accumulators (so S's registers are freed 16 keys at
          // a time), V's B fragments once for all kM row tiles.
#pragma unroll
          for (int kk = 0; kk < kSub / 16; ++kk) {
            uint32_t pa[kM][4];
#pragma unroll
            for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
              for (int nt = 2 * kk; nt < 2 * kk + 2; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  const int rs = 2 * mi + i / 2;
                  s[mi][nt][i] = TcProb(sm, s[mi][nt][i], state[rs].max);
                  state[rs].sum += s[mi][nt][i];  // this lane's part of the row sum
                }
              }
              pa[mi][0] = ptx::PackPair<T>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
              pa[mi][1] = ptx::PackPair<T>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
              pa[mi][2] = ptx::PackPair<T>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
              pa[mi][3] = ptx::PackPair<T>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < kD / 16; ++dp) {
              // Matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (8-15, 8-15),
              // transposed: V's rows are B's rows (k), so each lane gets a column pair of keys.
              uint32_t b[4];
              ptx::LdmatrixTrans(b,
                                 vt + (kSub * sub + kk * 16 + lane % 8 + 8 * (lane / 8 % 2)) * kD +
                                     SwzPair(pairs_a, dp));
              const uint32_t b0[2] = {b[0], b[1]};
              const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
              for (int mi = 0; mi < kM; ++mi) {
                ptx::Mma<T>(o[mi][2 * dp], pa[mi], b0);
                ptx::Mma<T>(o[mi][2 * dp + 1], pa[mi], b1);
              }
            }
          }
        }
      }
      __syncthreads();  // every warp is done with buffer `buf` before it is refilled
    }
  };
  RunPerCap(sm, tile_loop);
  ptx::CpAsyncWait<0>();

#pragma unroll
  for (int rs = 0; rs < kSlots; ++rs) {
    state[rs].sum = QuadSum(state[rs].sum);
    const int64_t r = wrow + 8 * rs + g;
    if (r >= tile.tile_rows) continue;
    const float inv = SoftmaxOutScale(state[rs]);
    const int64_t q_row = seq.q0 + first + r;
    T* out = static_cast<T*>(a.out) + (q_row * a.heads + h) * kD;
    const int mi = rs / 2;
    const int half = rs % 2;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(out + dt * 8 + 2 * t) =
          ptx::PackPair<T>(o[mi][dt][2 * half] * inv, o[mi][dt][2 * half + 1] * inv);
    }
    if (t == 0) static_cast<float*>(a.lse)[h * a.total_q + q_row] = TcLse(state[rs]);
  }
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_FWD_CUH_
