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
// double-buffered (cp.async). Warp w owns query rows [16w, 16w + 16): S = Q Kᵀ and dP = dO Vᵀ (B
// fragments of K and V by ldmatrix), dS = P (dP - D) ds/dz in the accumulators, then dQ += dS K
// with dS reused as A fragments and K's B fragments by ldmatrix .trans.
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
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[kM / 16][4];
#pragma unroll
    for (int mi = 0; mi < kM / 16; ++mi) {
      ptx::Ldmatrix(af[mi],
                    a_tile + Swz<kK>(a_row0 + 16 * mi + lane % 16, kk * 16 + 8 * (lane / 16)));
    }
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      ptx::Ldmatrix(b, b_tile + Swz<kK>(b_row0 + np * 16 + lane % 8 + 8 * (lane / 16),
                                        kk * 16 + 8 * (lane / 8 % 2)));
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

// acc (16 x kD) += C B for the warp: C = a 16 x kK accumulator (rounded to T, reused as A
// fragments: the C layout of two 8-column tiles is the A layout of one 16-wide k step), B = rows
// [0, kK) of the swizzled tile `b_tile` (kD columns).
template <typename T, int kD, int kK>
__device__ void MmaAccTimesRows(float (&acc)[kD / 8][4], const float (&c)[kK / 8][4],
                                const T* b_tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint32_t af[4] = {ptx::PackPair<T>(c[2 * kk][0], c[2 * kk][1]),
                            ptx::PackPair<T>(c[2 * kk][2], c[2 * kk][3]),
                            ptx::PackPair<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]),
                            ptx::PackPair<T>(c[2 * kk + 1][2], c[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t b[4];
      ptx::LdmatrixTrans(
          b, b_tile + Swz<kD>(kk * 16 + lane % 8 + 8 * (lane / 8 % 2), dp * 16 + 8 * (lane / 16)));
      const uint32_t b0[2] = {b[0], b[1]};
      const uint32_t b1[2] = {b[2], b[3]};
      ptx::Mma<T>(acc[2 * dp], af, b0);
      ptx::Mma<T>(acc[2 * dp + 1], af, b1);
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
// passes read it only for real rows). kD / 32 consecutive threads per pair, each summing a
// contiguous 32 columns (16-byte loads) in column order, then a butterfly over the threads: the
// order pass 2 used when it computed D itself. Blocks of kDotOutThreads threads, over
// DotOutBlocks(rows, kD) blocks.
inline constexpr int kDotOutThreads = 128;

inline int64_t DotOutBlocks(int64_t rows, int kD) {
  return (rows * (kD / 32) + kDotOutThreads - 1) / kDotOutThreads;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kDotOutThreads)
    AttentionTcDotOutKernel(const void* out, const void* dout, float* dot_out, int64_t rows) {
  constexpr int kParts = kD / 32;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kDotOutThreads + threadIdx.x;
  const int64_t r = idx / kParts;
  const int part = static_cast<int>(idx % kParts);
  float d = 0.f;
  if (r < rows) {
    const int64_t offset = r * kD + part * 32;
    const T* o = static_cast<const T*>(out) + offset;
    const T* dout_row = static_cast<const T*>(dout) + offset;
#pragma unroll
    for (int x = 0; x < 32; x += 8) {
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
  const AttentionArgs& a = p.args;
  const TcBlockIndex block = HeaviestFirstBlock<uint32_t>();
  const AttnSeq seq = LoadSeq(a, block.seq);
  const QueryTile tile = QueryTileAt<Tr>(a, seq, block.tile, block.head);
  if (tile.first >= seq.seg_q) return;
  const int64_t h = tile.h, hk = tile.hk, first = tile.first, rows = tile.rows;
  const TcMask mask = MakeTcMask(p, seq);
  const TcSoftmax sm = MakeTcSoftmax(a);

  unsigned char* smem = ptx::DynamicSmem();
  T* qs = reinterpret_cast<T*>(smem);                                    // [kBr][kD]
  T* dos = qs + kBr * kD;                                                // [kBr][kD]
  T* ks = dos + kBr * kD;                                                // [2][kBc][kD]
  T* vs = ks + 2 * kBc * kD;                                             // [2][kBc][kD]
  int32_t* key_end = reinterpret_cast<int32_t*>(smem + Tr::kTileBytes);  // [2][kV]
  int32_t* key_pos = key_end + 2 * kV;                                   // [2][kV]

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const KeyRange keys = TileKeys<Tr>(mask.rule, first, rows);
  const int tiles = keys.hi > keys.lo ? static_cast<int>((keys.hi - keys.lo + kBc - 1) / kBc) : 0;
  const KeySource<T> key_source = MakeKeySource<T, kD>(a, mask, keys.lo, hk);
  auto load_keys = [&](int n) { LoadKeyTile<T, Tr>(key_source, n, ks, vs, key_end, key_pos); };

  LoadRowsAsync<T, kD, kBr, Tr::kThreads>(qs, a.q, seq.q0 + first, rows, a.heads, h);
  LoadRowsAsync<T, kD, kBr, Tr::kThreads>(dos, a.dout, seq.q0 + first, rows, a.heads, h);
  ptx::CpAsyncCommit();
  if (tiles > 0) load_keys(0);
  ptx::CpAsyncCommit();

  // lse (as TcProb's base) and D of the lane's rows g and g + 8 (the pre-pass's), while the tiles
  // load.
  const int wrow = warp * 16;
  const TcRow row[2] = {MakeTcRow(mask, first + wrow + g), MakeTcRow(mask, first + wrow + g + 8)};
  float lse[2], d_row[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = wrow + g + 8 * rr;
    const bool real = r < rows;
    const int64_t q_row = seq.q0 + first + r;
    lse[rr] = real ? TcLse2(static_cast<const float*>(a.lse)[h * a.total_q + q_row]) : Inf<float>();
    d_row[rr] = real ? p.dout_dot_out[q_row * a.heads + h] : 0.f;
  }
  ptx::CpAsyncWait<1>();  // Q and dO have landed
  __syncthreads();
  const int64_t warp_rows = Clamp0(rows - wrow, 16);
  // The keys some row of the warp sees, and those every row sees (WarpKeysOf).
  const WarpKeys wk = WarpKeysOf(mask, first + wrow, warp_rows, 16);
  const KeyRange warp_keys = wk.some, warp_all = wk.all;

  float dq[kD / 8][4];
  ZeroAcc(dq);
  // The key-tile loop, compiled capped and not, so that the uncapped loop holds no trace of tanh
  // (left to itself, ptxas may keep the cap in the loop as predicated-off instructions that
  // still issue).
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
      bool skip = warp_keys.hi <= key0 || warp_keys.lo >= key0 + kBc;
      if (!skip && mask.subtree_end != nullptr) {
        const int32_t a0 = end[lane], a1 = end[lane + 32];
        skip = seq.q0 + first + wrow >= WarpMax(a0 > a1 ? a0 : a1);
      }
      const bool full = warp_all.lo <= key0 && key0 + kBc <= warp_all.hi;
      if (!skip) {
        float s_tile[1][kBc / 8][4];
        float dp_tile[1][kBc / 8][4];
        ZeroAcc(s_tile);
        ZeroAcc(dp_tile);
        MmaTileTimesTileT<T, kD, 16, kBc>(s_tile, qs, wrow, kt, 0);
        MmaTileTimesTileT<T, kD, 16, kBc>(dp_tile, dos, wrow, vt, 0);
        float(&s)[kBc / 8][4] = s_tile[0];
        const float(&dp)[kBc / 8][4] = dp_tile[0];
        // dS for every score, with no per-score branch; then on partial tiles the mask, by
        // selection (a score the mask hides may have given inf or NaN).
        if constexpr (decltype(capped)::value) CapScores(sm, s);
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int rr = i / 2;
            s[nt][i] = TcScoreGradient<decltype(capped)::value>(sm, TcProb(sm, s[nt][i], lse[rr]),
                                                                dp[nt][i], d_row[rr], s[nt][i]);
          }
        }
        if (!full) {
#pragma unroll
          for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int c = nt * 8 + 2 * t + (i & 1);
              if (!TcVisible(mask, row[i / 2], key0 + c, end, pos, c)) s[nt][i] = 0.f;
            }
          }
        }
        MmaAccTimesRows<T, kD, kBc>(dq, s, kt);  // dQ += dS K
      }
      __syncthreads();
    }
  };
  if (sm.capped) {
    tile_loop(std::true_type{});
  } else {
    tile_loop(std::false_type{});
  }
  ptx::CpAsyncWait<0>();

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = wrow + g + 8 * rr;
    if (r >= tile.tile_rows) continue;
    T* out = static_cast<T*>(a.dq) + ((seq.q0 + first + r) * a.heads + h) * kD;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(out + dt * 8 + 2 * t) =
          ptx::PackPair<T>(dq[dt][2 * rr] * sm.scale, dq[dt][2 * rr + 1] * sm.scale);
    }
  }
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_BWD_CUH_
