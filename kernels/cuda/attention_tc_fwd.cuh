#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_FWD_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_FWD_CUH_

// The tensor-core attention forward (FlashAttention-2 on mma.sync): one block of 4 warps per
// (query tile, head, sequence), grid as the scalar kernel's (attention_device.cuh). Each warp owns
// kWarpTiles tiles of 16 query rows (TcTraits: 2 at D = 64, a 128-row query tile; 1 at D = 128,
// 64 rows):
//   - Q is copied to shared memory once (cp.async); at D = 128 its A fragments stay in registers;
//   - key tiles of 64 keys (K and V, swizzled) are double-buffered: tile n + 1 is in flight
//     (cp.async) while tile n is used;
//   - S = Q Kᵀ: B fragments of K by ldmatrix (K's rows are B's columns), each used for all the
//     warp's row tiles, float accumulators;
//   - masking, scale and softcap on the accumulators; the online softmax in registers (each row
//     lives in the 4 lanes of a quad: max and sum by two shuffles);
//   - P (rounded to T) is reused as A fragments directly from S's accumulator layout (the C layout
//     of two 8-key tiles is the A layout of one 16-key step), O += P V with V's B fragments by
//     ldmatrix .trans.
// A warp skips a key tile none of its rows sees (the varlen rule; with a tree, when its first
// query row is at or past every key's subtree end).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/attention_tile.h"
#include "kernels/common/half.h"
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_traits.h"
#include "kernels/cuda/ptx.cuh"

namespace packsched::kernels::internal::cuda {

template <typename T, int kD>
__global__ void __launch_bounds__(128) AttentionTcForwardKernel(const TcAttnParams p) {
  using Tr = TcTraits<kD, TcKernel::kForward>;
  constexpr int kBr = Tr::kBr;
  constexpr int kBc = Tr::kBc;
  constexpr int kV = Tr::kVectorLen;
  const AttentionArgs& a = p.args;
  const AttnSeq seq = LoadSeq(a, blockIdx.z);
  const QueryTile tile = BlockQueryTile<Tr>(a, seq);
  if (tile.first >= seq.seg_q) return;
  const int64_t h = tile.h, hk = tile.hk, first = tile.first, rows = tile.rows;
  const TcMask mask = MakeTcMask(p, seq);
  const float scale = static_cast<float>(a.scale);
  const float softcap = static_cast<float>(a.softcap);

  unsigned char* smem = ptx::DynamicSmem();
  T* qs = reinterpret_cast<T*>(smem);                                    // [kBr][kD]
  T* ks = qs + kBr * kD;                                                 // [2][kBc][kD]
  T* vs = ks + 2 * kBc * kD;                                             // [2][kBc][kD]
  int32_t* key_end = reinterpret_cast<int32_t*>(smem + Tr::kTileBytes);  // [2][kV]
  int32_t* key_pos = key_end + 2 * kV;                                   // [2][kV]

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const KeyRange keys = TileKeys<Tr>(mask.rule, first, rows);
  const int64_t tiles = keys.hi > keys.lo ? (keys.hi - keys.lo + kBc - 1) / kBc : 0;
  auto load_keys = [&](int64_t n) {
    const int buf = static_cast<int>(n & 1);
    const int64_t key0 = keys.lo + n * kBc;
    const int64_t cols = Clamp0(mask.rule.sk - key0, kBc);
    LoadRowsAsync<T, kD, kBc, Tr::kThreads>(ks + buf * kBc * kD, a.k, seq.k0 + key0, cols,
                                            a.kv_heads, hk);
    LoadRowsAsync<T, kD, kBc, Tr::kThreads>(vs + buf * kBc * kD, a.v, seq.k0 + key0, cols,
                                            a.kv_heads, hk);
    LoadKeyVectors<kBc, Tr::kThreads>(mask, key0, cols, key_end + buf * kV, key_pos + buf * kV);
  };

  LoadRowsAsync<T, kD, kBr, Tr::kThreads>(qs, a.q, seq.q0 + first, rows, a.heads, h);
  ptx::CpAsyncCommit();
  if (tiles > 0) load_keys(0);
  ptx::CpAsyncCommit();
  ptx::CpAsyncWait<1>();  // Q has landed
  __syncthreads();

  // The warp's rows: kM mma tiles of 16; this lane holds rows g and g + 8 of each, "row slot"
  // rs = 2 mi + half for row wrow + 16 mi + 8 half + g.
  constexpr int kM = Tr::kWarpTiles;
  constexpr int kSlots = 2 * kM;
  const int wrow = warp * 16 * kM;
  TcRow row[kSlots];
#pragma unroll
  for (int rs = 0; rs < kSlots; ++rs) row[rs] = MakeTcRow(mask, first + wrow + 8 * rs + g);
  const int64_t warp_rows = Clamp0(rows - wrow, 16 * kM);
  // warp_keys: the keys some row of the warp sees; warp_all: the keys every row sees (both ends
  // of a row's range are non-decreasing in the row). Without a tree, a key tile inside warp_all
  // needs no per-element mask.
  KeyRange warp_keys{0, 0};
  KeyRange warp_all{0, 0};
  if (warp_rows > 0) {
    const KeyRange top = VisibleKeys(mask.rule, first + wrow);
    const KeyRange bottom = VisibleKeys(mask.rule, first + wrow + warp_rows - 1);
    warp_keys = KeyRange{top.lo, bottom.hi};
    if (warp_rows == 16 * kM && mask.subtree_end == nullptr) {
      warp_all = KeyRange{bottom.lo, top.hi};
    }
  }

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
  for (int rs = 0; rs < kSlots; ++rs) state[rs] = SoftmaxStart<float>();

  for (int64_t n = 0; n < tiles; ++n) {
    const int buf = static_cast<int>(n & 1);
    const int64_t key0 = keys.lo + n * kBc;
    if (n + 1 < tiles) load_keys(n + 1);  // its buffer was released by the last barrier
    ptx::CpAsyncCommit();
    ptx::CpAsyncWait<1>();  // tile n has landed
    __syncthreads();
    const T* kt = ks + buf * kBc * kD;
    const T* vt = vs + buf * kBc * kD;
    const int32_t* end = key_end + buf * kV;
    const int32_t* pos = key_pos + buf * kV;
    // Uniform across the warp: every lane computes the same.
    bool skip = warp_keys.hi <= key0 || warp_keys.lo >= key0 + kBc;
    if (!skip && mask.subtree_end != nullptr) {
      const int32_t a0 = end[lane], a1 = end[lane + 32];
      skip = seq.q0 + first + wrow >= WarpMax(a0 > a1 ? a0 : a1);
    }
    const bool full = warp_all.lo <= key0 && key0 + kBc <= warp_all.hi;
    if (!skip) {
      float s[kM][kBc / 8][4];
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
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
            ptx::Ldmatrix(qf[mi],
                          qs + Swz<kD>(wrow + 16 * mi + lane % 16, kk * 16 + 8 * (lane / 16)));
          }
        }
#pragma unroll
        for (int np = 0; np < kBc / 16; ++np) {
          // Matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (8-15, 8-15).
          uint32_t b[4];
          ptx::Ldmatrix(
              b, kt + Swz<kD>(np * 16 + lane % 8 + 8 * (lane / 16), kk * 16 + 8 * (lane / 8 % 2)));
          const uint32_t b0[2] = {b[0], b[1]};
          const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) {
            ptx::Mma<T>(s[mi][2 * np], qf[mi], b0);
            ptx::Mma<T>(s[mi][2 * np + 1], qf[mi], b1);
          }
        }
      }
      float tile_max[kSlots];
#pragma unroll
      for (int rs = 0; rs < kSlots; ++rs) tile_max[rs] = -Inf<float>();
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int c = nt * 8 + 2 * t + (i & 1);
            const int rs = 2 * mi + i / 2;
            const float x = full || TcVisible(mask, row[rs], key0 + c, end, pos, c)
                                ? AttnScore(s[mi][nt][i], scale, softcap)
                                : -Inf<float>();
            s[mi][nt][i] = x;
            tile_max[rs] = fmaxf(tile_max[rs], x);
          }
        }
      }
      float factor[kSlots];
#pragma unroll
      for (int rs = 0; rs < kSlots; ++rs) {
        factor[rs] = SoftmaxRescale(state[rs], QuadMax(tile_max[rs]));
      }
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int rs = 2 * mi + i / 2;
            const float x = ExpShifted(s[mi][nt][i], state[rs].max);
            s[mi][nt][i] = x;
            state[rs].sum += x;  // this lane's part of the row sum
          }
        }
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          o[mi][dt][0] *= factor[2 * mi];
          o[mi][dt][1] *= factor[2 * mi];
          o[mi][dt][2] *= factor[2 * mi + 1];
          o[mi][dt][3] *= factor[2 * mi + 1];
        }
      }
      // O += P V: P (rounded to T) as A fragments straight from the accumulators, V's B
      // fragments once per 16 keys for all kM row tiles.
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t pa[kM][4];
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
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
          ptx::LdmatrixTrans(
              b, vt + Swz<kD>(kk * 16 + lane % 8 + 8 * (lane / 8 % 2), dp * 16 + 8 * (lane / 16)));
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
    __syncthreads();  // every warp is done with buffer `buf` before it is refilled
  }
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
    if (t == 0) static_cast<float*>(a.lse)[h * a.total_q + q_row] = SoftmaxLse(state[rs]);
  }
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_FWD_CUH_
