#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_CUH_

// The tensor-core attention backward, deterministic like the scalar one (attention_device.cuh):
// a pre-pass computes D_i = dO_i · O_i per query row and head, pass 1 dq per query tile, pass 2
// dk and dv per key tile; no atomics, each output row written by exactly one block, every sum in
// a fixed order. Both passes recompute P from the forward's lse and read D from the pre-pass, in
// base 2 (TcSoftmax: one FFMA and one ex2 per score), compute dS / scale and apply the scale once
// to dQ and dK, and run their tile loop compiled twice, capped and not.
//
// Pre-pass (AttentionTcDotOutKernel): D of every packed row and head into a float32 buffer
// [total_q, heads] (TcAttnParams::dout_dot_out), kD / 32 threads per row.
//
// Pass 1 (AttentionTcBackwardDqKernel): a block of 4 warps per (query tile of 64 rows, head,
// sequence), started heaviest first (HeaviestFirstBlock<uint32_t>: the forward's order, in 32-bit
// arithmetic, which keeps the kernel spill-free); Q and dO tiles in shared memory, K and V tiles
// double-buffered (cp.async), each row's key range and position in shared vectors. Warp w owns
// query rows [32 (w / 2), + 32) and half w % 2 (FlashAttention-2's layout): per key tile, S = Q Kᵀ
// and dP = dO Vᵀ for its rows × the 32 keys of its half, dS = P (dP - D) ds/dz into a shared
// [64][64] tile (rounded to T); after a barrier, dQ += dS K for its rows × the D / 2 columns of
// its half, dS's A fragments by ldmatrix, K's B fragments by ldmatrix .trans. Every fragment
// read serves two or more products.
//
// Pass 2 (AttentionTcBackwardDkDvKernel, attention_tc_bwd_keys.cuh): dk and dv per block of 128
// keys, 8 warps, over the query tiles that see them.

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

// acc (kM x kN) += A Bᵀ for the warp: A = rows [a_row0, a_row0 + kM) of `a_tile`, B = rows
// [b_row0, b_row0 + kN) of `b_tile`, both swizzled tiles of kK columns. Each A fragment serves
// kN / 8 products and each B fragment kM / 16.
template <typename T, int kK, int kM, int kN>
__device__ void MmaTileTimesTileT(float (&acc)[kM / 16][kN / 8][4], const T* a_tile, int a_row0,
                                  const T* b_tile, int b_row0) {
  // a_row0 and b_row0 are multiples of 8: each lane's row % 8 is lane % 8.
  const int lane = threadIdx.x % 32;
  const SwzPairs pa = MakeSwzPairs<kK>(0, lane / 16, lane % 8);
  const SwzPairs pb = MakeSwzPairs<kK>(0, lane / 8 % 2, lane % 8);
  const T* a_row = a_tile + (a_row0 + lane % 16) * kK;
  const T* b_row = b_tile + (b_row0 + lane % 8 + 8 * (lane / 16)) * kK;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[kM / 16][4];
#pragma unroll
    for (int mi = 0; mi < kM / 16; ++mi) {
      ptx::Ldmatrix(af[mi], a_row + 16 * mi * kK + SwzPair(pa, kk));
    }
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      ptx::Ldmatrix(b, b_row + 16 * np * kK + SwzPair(pb, kk));
      const uint32_t b0[2] = {b[0], b[1]};
      const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mi = 0; mi < kM / 16; ++mi) {
        ptx::Mma<T>(acc[mi][2 * np], af[mi], b0);
        ptx::Mma<T>(acc[mi][2 * np + 1], af[mi], b1);
      }
    }
  }
}

// acc (kM x kN) += A B for the warp: A = rows [a_row0, a_row0 + kM) of `a_tile` (swizzled, kK
// columns), B = rows [0, kK) of `b_tile` (swizzled, kBCols columns), columns [b_col0, b_col0 +
// kN), by ldmatrix .trans.
template <typename T, int kK, int kBCols, int kM, int kN>
__device__ void MmaTileTimesTile(float (&acc)[kM / 16][kN / 8][4], const T* a_tile, int a_row0,
                                 const T* b_tile, int b_col0) {
  // a_row0 is a multiple of 8 (each lane's row % 8 is lane % 8) and b_col0 of 16.
  static_assert(kN <= 64, "B's chunks: b_col0 / 8 + 2 dp + h with dp < 4");
  const int lane = threadIdx.x % 32;
  const SwzPairs pa = MakeSwzPairs<kK>(0, lane / 16, lane % 8);
  const SwzPairs pb = MakeSwzPairs<kBCols>(b_col0 / 8, lane / 16, lane % 8);
  const T* a_row = a_tile + (a_row0 + lane % 16) * kK;
  const T* b_row = b_tile + (lane % 8 + 8 * (lane / 8 % 2)) * kBCols;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[kM / 16][4];
#pragma unroll
    for (int mi = 0; mi < kM / 16; ++mi) {
      ptx::Ldmatrix(af[mi], a_row + 16 * mi * kK + SwzPair(pa, kk));
    }
#pragma unroll
    for (int dp = 0; dp < kN / 16; ++dp) {
      uint32_t b[4];
      ptx::LdmatrixTrans(b, b_row + 16 * kk * kBCols + pb.off[dp]);
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

// Stores the warp's kM x kN accumulator, rounded to T, into rows [row0, row0 + kM), columns
// [col0, col0 + kN) of the swizzled shared tile `tile` of kCols columns: one 32-bit store per
// pair (the 8 rows g of a store fall on 8 different 16-byte bank groups: no conflict).
template <typename T, int kCols, int kM, int kN>
__device__ inline void StoreAcc(T* tile, int row0, int col0,
                                const float (&acc)[kM / 16][kN / 8][4]) {
  // row0 is a multiple of 8 (each lane's row % 8 is lane / 4) and col0 of 8.
  static_assert(kN <= 32, "chunks col0 / 8 + nt with nt < 4");
  const int lane = threadIdx.x % 32;
  T* row = tile + (row0 + lane / 4) * kCols + 2 * (lane % 4);
#pragma unroll
  for (int nt = 0; nt < kN / 8; ++nt) {
    const int col = ((col0 / 8 + nt) ^ (lane / 4)) << 3;
#pragma unroll
    for (int mi = 0; mi < kM / 16; ++mi) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        *reinterpret_cast<uint32_t*>(row + (16 * mi + 8 * rr) * kCols + col) =
            ptx::PackPair<T>(acc[mi][nt][2 * rr], acc[mi][nt][2 * rr + 1]);
      }
    }
  }
}

// Element `half` (0: the low 16 bits) of a register holding two T values, as float.
template <typename T>
__device__ inline float HalfOf(uint32_t reg, int half) {
  return ToAcc(T{static_cast<uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16)});
}

template <int kN, int kD>
__device__ inline void ZeroAcc(float (&acc)[kN][kD]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int i = 0; i < kD; ++i) acc[n][i] = 0.f;
  }
}
template <int kM, int kN, int kD>
__device__ inline void ZeroAcc(float (&acc)[kM][kN][kD]) {
#pragma unroll
  for (int m = 0; m < kM; ++m) ZeroAcc(acc[m]);
}

// The pre-pass: dot_out[r] = dO_r · O_r in float32 for the packed (row, head) pairs r =
// q_row * heads + h < rows of `dout` and `out` (viewed as [rows, kD]), whatever the row (the
// passes read it only for real rows). DotOutParts(kD) consecutive threads per pair (kD / 32, a
// power of two, or one thread at D = 96), each summing a contiguous kD / parts columns (16-byte
// loads) in column order, then a butterfly over the threads. Blocks of kDotOutThreads threads,
// over DotOutBlocks(rows, kD) blocks.
inline constexpr int kDotOutThreads = 128;

constexpr int DotOutParts(int kD) { return kD % 64 == 0 ? kD / 32 : 1; }

inline int64_t DotOutBlocks(int64_t rows, int kD) {
  return (rows * DotOutParts(kD) + kDotOutThreads - 1) / kDotOutThreads;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kDotOutThreads)
    AttentionTcDotOutKernel(const void* out, const void* dout, float* dot_out, int64_t rows) {
  constexpr int kParts = DotOutParts(kD);
  constexpr int kPartCols = kD / kParts;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kDotOutThreads + threadIdx.x;
  const int64_t r = idx / kParts;
  const int part = static_cast<int>(idx % kParts);
  float d = 0.f;
  if (r < rows) {
    const int64_t offset = r * kD + part * kPartCols;
    const T* o = static_cast<const T*>(out) + offset;
    const T* dout_row = static_cast<const T*>(dout) + offset;
#pragma unroll
    for (int x = 0; x < kPartCols; x += 8) {
      uint32_t ov[4], dv[4];
      ptx::LoadGlobal16(ov, o + x);
      ptx::LoadGlobal16(dv, dout_row + x);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        d += HalfOf<T>(dv[w], 0) * HalfOf<T>(ov[w], 0) + HalfOf<T>(dv[w], 1) * HalfOf<T>(ov[w], 1);
      }
    }
  }
#pragma unroll
  for (int m = 1; m < kParts; m *= 2) d += ptx::ShflXor(d, m);  // every lane of the warp
  if (part == 0 && r < rows) dot_out[r] = d;
}

template <typename T, int kD>
__global__ void __launch_bounds__(128) AttentionTcBackwardDqKernel(const TcAttnParams p) {
  using Tr = TcTraits<kD, TcKernel::kBackwardDq>;
  constexpr int kBr = Tr::kBr;
  constexpr int kBc = Tr::kBc;
  constexpr int kV = Tr::kVectorLen;
  constexpr int kSlab = 32;       // query rows per pair of warps
  constexpr int kHalf = kBc / 2;  // keys of a warp's S and dP
  constexpr int kCols = kD / 2;   // head-dim columns of a warp's dQ
  static_assert(Tr::kWarps == 2 * kBr / kSlab && kBc == 64, "pass 1's warp layout");
  const AttentionArgs& a = p.args;
  const TcBlockIndex block = HeaviestFirstBlock<uint32_t>();
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
  T* dos = reinterpret_cast<T*>(smem + L::kDoutAt);                       // [kBr][kD]
  T* ks = reinterpret_cast<T*>(smem + L::kKAt);                           // [2][kBc][kD]
  T* vs = reinterpret_cast<T*>(smem + L::kVAt);                           // [2][kBc][kD]
  T* dss = reinterpret_cast<T*>(smem + L::kScoresAt);                     // dS [kBr][kBc]
  int32_t* key_end = reinterpret_cast<int32_t*>(smem + L::Vector(0));     // [2][kV]
  int32_t* key_pos = reinterpret_cast<int32_t*>(smem + L::Vector(1));     // [2][kV]
  int32_t* row_lo = reinterpret_cast<int32_t*>(smem + L::RowVector(0));   // [kBr]
  int32_t* row_hi = reinterpret_cast<int32_t*>(smem + L::RowVector(1));   // [kBr]
  int32_t* row_pos = reinterpret_cast<int32_t*>(smem + L::RowVector(2));  // [kBr]

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int slab = warp / 2;
  const int half = warp % 2;
  const int qrow = slab * kSlab;  // the warp's first query row in the tile
  const int kcol = half * kHalf;  // the warp's first key of S and dP in a key tile

  const KeyRange keys = TileKeys<Tr>(mask.rule, first, rows);
  const int tiles = keys.hi > keys.lo ? static_cast<int>((keys.hi - keys.lo + kBc - 1) / kBc) : 0;
  const KeySource<T> key_source = MakeKeySource<T, kD>(a, mask, keys.lo, hk);
  auto load_keys = [&](int n) { LoadKeyTile<T, Tr>(key_source, n, ks, vs, key_end, key_pos); };

  LoadRowsAsync<T, kD, kBr, Tr::kThreads>(qs, a.q, seq.q0 + first, rows, a.heads, h);
  LoadRowsAsync<T, kD, kBr, Tr::kThreads>(dos, a.dout, seq.q0 + first, rows, a.heads, h);
  ptx::CpAsyncCommit();
  if (tiles > 0) load_keys(0);
  ptx::CpAsyncCommit();

  // While the tiles load: each row's visible keys by the varlen rule (empty past the real rows)
  // and position, for the skip tests and the partial tiles' mask; lse (as TcProb's base) and D
  // (the pre-pass's) of the lane's 4 rows qrow + 16 mi + g + 8 rr.
  for (int r = threadIdx.x; r < kBr; r += Tr::kThreads) {
    const KeyRange seen = VisibleKeys(mask.rule, first + r);
    row_lo[r] = static_cast<int32_t>(seen.lo);  // segments are below 2^31 keys
    row_hi[r] = static_cast<int32_t>(seen.hi);
    row_pos[r] = r < rows && mask.positions != nullptr ? mask.positions[seq.q0 + first + r] : 0;
  }
  float lse[kSlab / 16][2], d_row[kSlab / 16][2];
#pragma unroll
  for (int mi = 0; mi < kSlab / 16; ++mi) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = qrow + 16 * mi + g + 8 * rr;
      const bool real = r < rows;
      const int64_t q_row = seq.q0 + first + r;
      lse[mi][rr] =
          real ? TcLse2(static_cast<const float*>(a.lse)[h * a.total_q + q_row]) : Inf<float>();
      d_row[mi][rr] = real ? p.dout_dot_out[q_row * a.heads + h] : 0.f;
    }
  }
  ptx::CpAsyncWait<1>();  // Q and dO have landed
  __syncthreads();
  // The slab's rows: the keys some row sees, [lo of its first row, hi of its last real row), and
  // those every row sees, [lo of the last, hi of the first) (both ends are non-decreasing in the
  // row), empty with a tree or a partial slab.
  const int slab_rows = static_cast<int>(Clamp0(rows - qrow, kSlab));
  const int bottom = qrow + (slab_rows > 0 ? slab_rows - 1 : 0);
  const KeyRange some = slab_rows > 0 ? KeyRange{row_lo[qrow], row_hi[bottom]} : KeyRange{0, 0};
  const KeyRange all = slab_rows == kSlab && mask.subtree_end == nullptr
                           ? KeyRange{row_lo[bottom], row_hi[qrow]}
                           : KeyRange{0, 0};
  const int32_t first_packed = static_cast<int32_t>(seq.q0 + first + qrow);

  float dq[kSlab / 16][kCols / 8][4];
  ZeroAcc(dq);
  // The key-tile loop, compiled capped and not (RunPerCap).
  auto tile_loop = [&](auto capped) {
    for (int n = 0; n < tiles; ++n) {
      const int buf = static_cast<int>(n & 1);
      const int64_t key0 = keys.lo + n * kBc;
      if (n + 1 < tiles) load_keys(n + 1);
      ptx::CpAsyncCommit();
      ptx::CpAsyncWait<1>();
      __syncthreads();
      const T* kt = ks + buf * kBc * kD;
      const T* vt = vs + buf * kBc * kD;
      const int32_t* end = key_end + buf * kV;
      const int32_t* pos = key_pos + buf * kV;
      // Uniform across the pair of warps of a slab: which halves of the key tile some row of the
      // slab sees (with a tree, not when the slab's first row is past every subtree end of the
      // half), and whether every row of the slab sees every key of the warp's half (no mask). A
      // pair whose halves are both unseen skips dQ.
      bool sees_half[2];  // unrolled: two registers, not an array indexed by the warp's half
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t lo = key0 + hh * kHalf;
        sees_half[hh] = some.lo < some.hi && some.hi > lo && some.lo < lo + kHalf;
        if (mask.subtree_end != nullptr && sees_half[hh]) {
          sees_half[hh] = first_packed < WarpMax(end[hh * kHalf + lane]);
        }
      }
      const bool sees = half == 0 ? sees_half[0] : sees_half[1];
      const bool pair_sees = sees_half[0] || sees_half[1];
      const bool full = all.lo <= key0 + kcol && key0 + kcol + kHalf <= all.hi;
      if (sees) {
        float s[kSlab / 16][kHalf / 8][4];
        float dp[kSlab / 16][kHalf / 8][4];
        ZeroAcc(s);
        ZeroAcc(dp);
        MmaTileTimesTileT<T, kD, kSlab, kHalf>(s, qs, qrow, kt, kcol);    // S = Q Kᵀ
        MmaTileTimesTileT<T, kD, kSlab, kHalf>(dp, dos, qrow, vt, kcol);  // dP = dO Vᵀ
        // dS for every score, with no per-score branch; then on partial tiles the mask, by
        // selection (a score the mask hides may have given inf or NaN).
#pragma unroll
        for (int mi = 0; mi < kSlab / 16; ++mi) {
          if constexpr (decltype(capped)::value) CapScores(sm, s[mi]);
#pragma unroll
          for (int nt = 0; nt < kHalf / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int rr = i / 2;
              s[mi][nt][i] = TcScoreGradient<decltype(capped)::value>(
                  sm, TcProb(sm, s[mi][nt][i], lse[mi][rr]), dp[mi][nt][i], d_row[mi][rr],
                  s[mi][nt][i]);
            }
          }
        }
        if (!full) {
#pragma unroll
          for (int mi = 0; mi < kSlab / 16; ++mi) {
#pragma unroll
            for (int nt = 0; nt < kHalf / 8; ++nt) {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int r = qrow + 16 * mi + g + 8 * (i / 2);
                const int c = kcol + nt * 8 + 2 * t + (i & 1);
                const TcRow q{KeyRange{row_lo[r], row_hi[r]}, first + r,
                              static_cast<int32_t>(seq.q0 + first + r), row_pos[r]};
                if (!TcVisible(mask, q, key0 + c, end, pos, c)) s[mi][nt][i] = 0.f;
              }
            }
          }
        }
        StoreAcc<T, kBc, kSlab, kHalf>(dss, qrow, kcol, s);
      } else {
        // Nothing of the warp's part is visible: its dS is 0 (read when the other half sees).
        float zero[kSlab / 16][kHalf / 8][4];
        ZeroAcc(zero);
        StoreAcc<T, kBc, kSlab, kHalf>(dss, qrow, kcol, zero);
      }
      __syncthreads();
      // dQ += dS K for the slab's rows and the warp's half of the columns.
      if (pair_sees) MmaTileTimesTile<T, kBc, kD, kSlab, kCols>(dq, dss, qrow, kt, half * kCols);
      __syncthreads();
    }
  };
  RunPerCap(sm, tile_loop);
  ptx::CpAsyncWait<0>();

#pragma unroll
  for (int mi = 0; mi < kSlab / 16; ++mi) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t r = qrow + 16 * mi + g + 8 * rr;
      if (r >= tile.tile_rows) continue;
      T* out = static_cast<T*>(a.dq) + ((seq.q0 + first + r) * a.heads + h) * kD + half * kCols;
#pragma unroll
      for (int dt = 0; dt < kCols / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(out + dt * 8 + 2 * t) =
            ptx::PackPair<T>(dq[mi][dt][2 * rr] * sm.scale, dq[mi][dt][2 * rr + 1] * sm.scale);
      }
    }
  }
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_CUH_
