#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_DEVICE_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_DEVICE_CUH_

// Device code of the CUDA attention: a straightforward tiled FlashAttention-2 with every tile in
// shared memory as float and scalar FMAs (no tensor cores yet; correctness first). The per-element
// math is common/attention_tile.h, the same functions the CPU backend calls.
//
// One block per (tile, head, sequence): blockIdx.x = tile, blockIdx.y = head (kv head for dk/dv),
// blockIdx.z = sequence. Blocks whose tile starts past the sequence's segment exit at once.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/attention_tile.h"
#include "kernels/common/half.h"
#include "kernels/cuda/attention_query_runs.cuh"
#include "kernels/cuda/attention_traits.h"
#include "kernels/internal/attention_args.h"

namespace packsched::kernels::internal::cuda {

// The sequence a block works on.
struct AttnSeq {
  int64_t q0, k0;        // first rows
  int64_t seg_q, seg_k;  // segment lengths
  AttnMask mask;         // real lengths and the mask options
};

// b == a.batch is the tail (rows past cu[B], kernels.h): a sequence without real rows, so its
// rows are written like pad slots (out 0, lse +inf, gradients 0) and are never keys.
__device__ inline AttnSeq LoadSeq(const AttentionArgs& a, int64_t b) {
  AttnSeq s;
  if (b == a.batch) {
    s.q0 = a.cu_q[b];
    s.k0 = a.cu_k[b];
    s.seg_q = a.total_q - s.q0;
    s.seg_k = a.total_k - s.k0;
    s.mask = AttnMask{0, 0, a.causal, a.window_left, a.window_right, AttnTree{}};
    return s;
  }
  s.q0 = a.cu_q[b];
  s.k0 = a.cu_k[b];
  s.seg_q = a.cu_q[b + 1] - s.q0;
  s.seg_k = a.cu_k[b + 1] - s.k0;
  // seqused is not validated on the device: clamp it into [0, segment length].
  int64_t sq = a.seqused_q != nullptr ? a.seqused_q[b] : s.seg_q;
  int64_t sk = a.seqused_k != nullptr ? a.seqused_k[b] : s.seg_k;
  sq = sq < 0 ? 0 : (sq > s.seg_q ? s.seg_q : sq);
  sk = sk < 0 ? 0 : (sk > s.seg_k ? s.seg_k : sk);
  const AttnTree tree{a.subtree_end, a.positions, a.tree_window_left, s.q0};
  s.mask = AttnMask{sq, sk, a.causal, a.window_left, a.window_right, tree};
  return s;
}

// Host side: what a launch's grid must cover. `sequences` = B, plus one slot for a tail
// (blockIdx.z = B, LoadSeq); `longest` = the longest segment its tiles span, the tail of q (or of
// k for the dk/dv kernel, `keys`) included, given the longest real segment `max_seqlen`.
struct AttnLaunchSpan {
  int64_t sequences, longest;
};
inline AttnLaunchSpan LaunchSpan(const AttentionArgs& a, int64_t max_seqlen, bool keys) {
  const int64_t tail_q = a.total_q - a.cu_q_host[a.batch];
  const int64_t tail_k = a.total_k - a.cu_k_host[a.batch];
  const int64_t tail = keys ? tail_k : tail_q;
  return AttnLaunchSpan{a.batch + (tail_q > 0 || tail_k > 0 ? 1 : 0),
                        tail > max_seqlen ? tail : max_seqlen};
}

__device__ inline int64_t Clamp0(int64_t x, int64_t hi) { return x < 0 ? 0 : (x > hi ? hi : x); }

// smem[r][d] (pitch kPitch) = rows [first, first + n) of head h of `src` as float; zero for
// r >= n and for d >= head_dim (the bucket's padding).
template <typename T, typename Tr>
__device__ void LoadTile(float* smem, int rows, const void* src, int64_t first, int64_t n,
                         int64_t heads, int64_t h, int64_t head_dim) {
  const T* base = static_cast<const T*>(src);
  for (int idx = threadIdx.x; idx < rows * Tr::kHeadDim; idx += Tr::kThreads) {
    const int r = idx / Tr::kHeadDim;
    const int d = idx % Tr::kHeadDim;
    float x = 0.f;
    if (r < n && d < head_dim) x = ToAcc(base[((first + r) * heads + h) * head_dim + d]);
    smem[r * Tr::kPitch + d] = x;
  }
}

// Loads the key side of a tile: K and V rows [key0, key0 + n) of kv head hk (zero past n).
template <typename T, typename Tr>
__device__ void LoadKeySide(const AttentionArgs& a, const AttnSeq& seq, int64_t hk, int64_t key0,
                            int64_t n, float* ks, float* vs) {
  LoadTile<T, Tr>(ks, Tr::kBc, a.k, seq.k0 + key0, n, a.kv_heads, hk, a.head_dim);
  LoadTile<T, Tr>(vs, Tr::kBc, a.v, seq.k0 + key0, n, a.kv_heads, hk, a.head_dim);
}

// The query tile of a forward or dq block: head h (of kv head hk), segment rows
// [first, first + tile_rows), the first `rows` of them real (the rest are pad slots). A block
// whose first >= seg_q has no tile and exits.
struct QueryTile {
  int64_t h, hk, first, tile_rows, rows;
};

// Query tile `index` of head h of the sequence.
template <typename Tr>
__device__ QueryTile QueryTileAt(const AttentionArgs& a, const AttnSeq& seq, int64_t index,
                                 int64_t h) {
  QueryTile t;
  t.h = h;
  t.hk = t.h / (a.heads / a.kv_heads);
  t.first = index * Tr::kBr;
  t.tile_rows = Clamp0(seq.seg_q - t.first, Tr::kBr);
  t.rows = Clamp0(seq.mask.sq - t.first, t.tile_rows);
  return t;
}

// The block's tile: blockIdx.x of head blockIdx.y.
template <typename Tr>
__device__ QueryTile BlockQueryTile(const AttentionArgs& a, const AttnSeq& seq) {
  return QueryTileAt<Tr>(a, seq, blockIdx.x, blockIdx.y);
}

// The key tiles [lo, hi) the real rows [first, first + rows) can see (tile-aligned lo).
template <typename Tr>
__device__ KeyRange TileKeys(const AttnMask& m, int64_t first, int64_t rows) {
  if (rows <= 0) return KeyRange{0, 0};
  const KeyRange lo = VisibleKeys(m, first);
  const KeyRange hi = VisibleKeys(m, first + rows - 1);
  if (hi.hi <= lo.lo) return KeyRange{0, 0};
  return KeyRange{lo.lo / Tr::kBc * Tr::kBc, hi.hi};
}

// Dot product of two smem rows over the bucket (padding is zero).
template <typename Tr>
__device__ float RowDot(const float* x, const float* y) {
  float acc = 0.f;
#pragma unroll 8
  for (int d = 0; d < Tr::kHeadDim; ++d) acc += x[d] * y[d];
  return acc;
}

// The masked, capped score of query row `first + r` and key `key0 + c`, or -inf.
__device__ inline float MaskedScore(const AttnMask& m, int64_t i, int64_t j, float dot, float scale,
                                    float softcap) {
  return KeyVisible(m, VisibleKeys(m, i), i, j) ? AttnScore(dot, scale, softcap) : -Inf<float>();
}

template <typename T, typename Tr>
__global__ void __launch_bounds__(Tr::kThreads) AttentionForwardKernel(const AttentionArgs a) {
  const AttnSeq seq = LoadSeq(a, blockIdx.z);
  const QueryTile tile = BlockQueryTile<Tr>(a, seq);
  if (tile.first >= seq.seg_q) return;
  if (!ListedRows(a, seq.q0 + tile.first, seq.q0 + tile.first + tile.tile_rows)) return;
  const auto [h, hk, first, tile_rows, rows] = tile;
  const float scale = static_cast<float>(a.scale);
  const float softcap = static_cast<float>(a.softcap);

  extern __shared__ float smem[];
  using Smem = typename Tr::Smem;
  float* qs = smem + Smem::kQ;
  float* ks = smem + Smem::kK;
  float* vs = smem + Smem::kV;
  float* ss = smem + Smem::kScores;  // S, then P
  float* row_max = smem + Smem::RowScalar(0);
  float* row_sum = smem + Smem::RowScalar(1);
  float* row_factor = smem + Smem::RowScalar(2);

  LoadTile<T, Tr>(qs, Tr::kBr, a.q, seq.q0 + first, rows, a.heads, h, a.head_dim);
  if (threadIdx.x < Tr::kBr) {
    row_max[threadIdx.x] = -Inf<float>();
    row_sum[threadIdx.x] = 0.f;
  }
  const int my_row = threadIdx.x / Tr::kThreadsPerRow;
  const int my_lane = threadIdx.x % Tr::kThreadsPerRow;
  float acc[Tr::kCols];
#pragma unroll
  for (int i = 0; i < Tr::kCols; ++i) acc[i] = 0.f;

  const KeyRange keys = TileKeys<Tr>(seq.mask, first, rows);
  for (int64_t key0 = keys.lo; key0 < keys.hi; key0 += Tr::kBc) {
    const int64_t cols = Clamp0(seq.mask.sk - key0, Tr::kBc);
    __syncthreads();  // the previous tile is consumed
    LoadKeySide<T, Tr>(a, seq, hk, key0, cols, ks, vs);
    __syncthreads();
    // S = Q·Kᵀ, scaled, capped and masked.
    for (int idx = threadIdx.x; idx < Tr::kBr * Tr::kBc; idx += Tr::kThreads) {
      const int r = idx / Tr::kBc;
      const int c = idx % Tr::kBc;
      float s = -Inf<float>();
      if (r < rows && c < cols) {
        s = MaskedScore(seq.mask, first + r, key0 + c,
                        RowDot<Tr>(qs + r * Tr::kPitch, ks + c * Tr::kPitch), scale, softcap);
      }
      ss[r * Tr::kSPitch + c] = s;
    }
    __syncthreads();
    // Online softmax: new row max, rescale factor, P = exp(S - m), running sum.
    if (threadIdx.x < Tr::kBr) {
      float* s = ss + threadIdx.x * Tr::kSPitch;
      float tile_max = -Inf<float>();
      for (int c = 0; c < Tr::kBc; ++c) tile_max = fmaxf(tile_max, s[c]);
      SoftmaxRow<float> row{row_max[threadIdx.x], row_sum[threadIdx.x]};
      row_factor[threadIdx.x] = SoftmaxRescale(row, tile_max);
      for (int c = 0; c < Tr::kBc; ++c) {
        s[c] = SoftmaxProb(s[c], row.max);
        row.sum += s[c];
      }
      row_max[threadIdx.x] = row.max;
      row_sum[threadIdx.x] = row.sum;
    }
    __syncthreads();
    // O = O * factor + P·V.
    const float factor = row_factor[my_row];
    const float* p = ss + my_row * Tr::kSPitch;
#pragma unroll
    for (int i = 0; i < Tr::kCols; ++i) {
      const int d = my_lane + i * Tr::kThreadsPerRow;
      float o = acc[i] * factor;
      for (int c = 0; c < Tr::kBc; ++c) o += p[c] * vs[c * Tr::kPitch + d];
      acc[i] = o;
    }
  }
  __syncthreads();  // row state of the last tile (or the initial state) is visible
  if (my_row >= tile_rows) return;
  const SoftmaxRow<float> row{row_max[my_row], row_sum[my_row]};
  const float inv = SoftmaxOutScale(row);
  const int64_t q_row = seq.q0 + first + my_row;
  T* out = static_cast<T*>(a.out) + (q_row * a.heads + h) * a.head_dim;
#pragma unroll
  for (int i = 0; i < Tr::kCols; ++i) {
    const int d = my_lane + i * Tr::kThreadsPerRow;
    if (d < a.head_dim) out[d] = FromAcc<T>(acc[i] * inv);
  }
  if (my_lane == 0) static_cast<float*>(a.lse)[h * a.total_q + q_row] = SoftmaxLse(row);
}

// Loads the query side of a backward tile: Q, dO, lse and D = rowsum(dO ∘ O) per row
// (rows >= n, and rows outside a query-row map, get lse = +inf and D = 0 so their P is 0).
template <typename T, typename Tr>
__device__ void LoadQuerySide(const AttentionArgs& a, const AttnSeq& seq, int64_t h, int64_t first,
                              int64_t n, float* qs, float* dos, float* row_lse, float* row_d) {
  LoadTile<T, Tr>(qs, Tr::kBr, a.q, seq.q0 + first, n, a.heads, h, a.head_dim);
  LoadTile<T, Tr>(dos, Tr::kBr, a.dout, seq.q0 + first, n, a.heads, h, a.head_dim);
  __syncthreads();
  if (threadIdx.x < Tr::kBr) {
    const int r = threadIdx.x;
    float lse = Inf<float>();
    float d_row = 0.f;
    const int64_t row = seq.q0 + first + r;
    if (r < n && ListedRows(a, row, row + 1)) {
      lse = static_cast<const float*>(a.lse)[h * a.total_q + row];
      const T* out = static_cast<const T*>(a.out) + (row * a.heads + h) * a.head_dim;
      for (int d = 0; d < a.head_dim; ++d) d_row += dos[r * Tr::kPitch + d] * ToAcc(out[d]);
    }
    row_lse[r] = lse;
    row_d[r] = d_row;
  }
  __syncthreads();
}

// P and dS∘(ds/dot) of element (r, c) of a (query tile, key tile) pair.
template <typename Tr>
__device__ void BackwardElement(const AttnSeq& seq, int64_t first, int64_t rows, int64_t key0,
                                int64_t cols, int r, int c, const float* qs, const float* dos,
                                const float* ks, const float* vs, const float* row_lse,
                                const float* row_d, float scale, float softcap, float* p_out,
                                float* ds_out) {
  float p = 0.f;
  float ds = 0.f;
  if (r < rows && c < cols) {
    const float s =
        MaskedScore(seq.mask, first + r, key0 + c,
                    RowDot<Tr>(qs + r * Tr::kPitch, ks + c * Tr::kPitch), scale, softcap);
    p = ProbFromLse(s, row_lse[r]);
    if (p != 0.f) {
      const float dp = RowDot<Tr>(dos + r * Tr::kPitch, vs + c * Tr::kPitch);  // dP = dO·Vᵀ
      ds = ScoreGradient(p, dp, row_d[r]) * AttnScoreGrad(s, scale, softcap);
    }
  }
  *p_out = p;
  *ds_out = ds;
}

// Backward pass 1: dq of one query tile, over the key tiles it sees.
template <typename T, typename Tr>
__global__ void __launch_bounds__(Tr::kThreads) AttentionBackwardDqKernel(const AttentionArgs a) {
  const AttnSeq seq = LoadSeq(a, blockIdx.z);
  const QueryTile tile = BlockQueryTile<Tr>(a, seq);
  if (tile.first >= seq.seg_q) return;
  if (!ListedRows(a, seq.q0 + tile.first, seq.q0 + tile.first + tile.tile_rows)) return;
  const auto [h, hk, first, tile_rows, rows] = tile;
  const float scale = static_cast<float>(a.scale);
  const float softcap = static_cast<float>(a.softcap);

  extern __shared__ float smem[];
  using Smem = typename Tr::Smem;
  float* qs = smem + Smem::kQ;
  float* dos = smem + Smem::kDout;
  float* ks = smem + Smem::kK;
  float* vs = smem + Smem::kV;
  float* dss = smem + Smem::kScores;
  float* row_lse = smem + Smem::RowScalar(0);
  float* row_d = smem + Smem::RowScalar(1);

  LoadQuerySide<T, Tr>(a, seq, h, first, rows, qs, dos, row_lse, row_d);
  const int my_row = threadIdx.x / Tr::kThreadsPerRow;
  const int my_lane = threadIdx.x % Tr::kThreadsPerRow;
  float acc[Tr::kCols];
#pragma unroll
  for (int i = 0; i < Tr::kCols; ++i) acc[i] = 0.f;

  const KeyRange keys = TileKeys<Tr>(seq.mask, first, rows);
  for (int64_t key0 = keys.lo; key0 < keys.hi; key0 += Tr::kBc) {
    const int64_t cols = Clamp0(seq.mask.sk - key0, Tr::kBc);
    __syncthreads();
    LoadKeySide<T, Tr>(a, seq, hk, key0, cols, ks, vs);
    __syncthreads();
    for (int idx = threadIdx.x; idx < Tr::kBr * Tr::kBc; idx += Tr::kThreads) {
      const int r = idx / Tr::kBc;
      const int c = idx % Tr::kBc;
      float p;
      BackwardElement<Tr>(seq, first, rows, key0, cols, r, c, qs, dos, ks, vs, row_lse, row_d,
                          scale, softcap, &p, &dss[r * Tr::kSPitch + c]);
    }
    __syncthreads();
    const float* ds = dss + my_row * Tr::kSPitch;  // dQ += dS·K
#pragma unroll
    for (int i = 0; i < Tr::kCols; ++i) {
      const int d = my_lane + i * Tr::kThreadsPerRow;
      float x = acc[i];
      for (int c = 0; c < Tr::kBc; ++c) x += ds[c] * ks[c * Tr::kPitch + d];
      acc[i] = x;
    }
  }
  if (my_row >= tile_rows) return;
  T* dq = static_cast<T*>(a.dq) + ((seq.q0 + first + my_row) * a.heads + h) * a.head_dim;
#pragma unroll
  for (int i = 0; i < Tr::kCols; ++i) {
    const int d = my_lane + i * Tr::kThreadsPerRow;
    if (d < a.head_dim) dq[d] = FromAcc<T>(acc[i]);
  }
}

// Backward pass 2: dk and dv of one key tile, over the group's query heads and the query tiles
// that see it, in a fixed order (deterministic, no atomics).
template <typename T, typename Tr>
__global__ void __launch_bounds__(Tr::kThreads) AttentionBackwardDkDvKernel(const AttentionArgs a) {
  const AttnSeq seq = LoadSeq(a, blockIdx.z);
  const int64_t hk = blockIdx.y;
  const int64_t key0 = static_cast<int64_t>(blockIdx.x) * Tr::kBc;
  if (key0 >= seq.seg_k) return;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t tile_cols = Clamp0(seq.seg_k - key0, Tr::kBc);
  const int64_t cols = Clamp0(seq.mask.sk - key0, tile_cols);  // real keys
  const float scale = static_cast<float>(a.scale);
  const float softcap = static_cast<float>(a.softcap);

  extern __shared__ float smem[];
  using Smem = typename Tr::Smem;
  float* qs = smem + Smem::kQ;
  float* dos = smem + Smem::kDout;
  float* ks = smem + Smem::kK;
  float* vs = smem + Smem::kV;
  float* ps = smem + Smem::kP;
  float* dss = smem + Smem::kScores;
  float* row_lse = smem + Smem::RowScalar(0);
  float* row_d = smem + Smem::RowScalar(1);

  LoadKeySide<T, Tr>(a, seq, hk, key0, cols, ks, vs);
  const int my_key = threadIdx.x / Tr::kThreadsPerRow;
  const int my_lane = threadIdx.x % Tr::kThreadsPerRow;
  float dk[Tr::kCols];
  float dv[Tr::kCols];
#pragma unroll
  for (int i = 0; i < Tr::kCols; ++i) dk[i] = dv[i] = 0.f;

  for (int64_t h = hk * group; cols > 0 && h < (hk + 1) * group; ++h) {
    for (int64_t first = 0; first < seq.mask.sq; first += Tr::kBr) {
      const int64_t rows = Clamp0(seq.mask.sq - first, Tr::kBr);
      const KeyRange keys = TileKeys<Tr>(seq.mask, first, rows);
      if (keys.hi <= key0 || keys.lo >= key0 + cols) continue;  // uniform across the block
      if (!ListedRows(a, seq.q0 + first, seq.q0 + first + rows)) continue;  // no mapped row
      __syncthreads();  // the previous query tile is consumed
      LoadQuerySide<T, Tr>(a, seq, h, first, rows, qs, dos, row_lse, row_d);
      for (int idx = threadIdx.x; idx < Tr::kBr * Tr::kBc; idx += Tr::kThreads) {
        const int r = idx / Tr::kBc;
        const int c = idx % Tr::kBc;
        BackwardElement<Tr>(seq, first, rows, key0, cols, r, c, qs, dos, ks, vs, row_lse, row_d,
                            scale, softcap, &ps[r * Tr::kSPitch + c], &dss[r * Tr::kSPitch + c]);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < Tr::kCols; ++i) {  // dV += Pᵀ·dO, dK += dSᵀ·Q
        const int d = my_lane + i * Tr::kThreadsPerRow;
        float xv = dv[i];
        float xk = dk[i];
        for (int r = 0; r < Tr::kBr; ++r) {
          xv += ps[r * Tr::kSPitch + my_key] * dos[r * Tr::kPitch + d];
          xk += dss[r * Tr::kSPitch + my_key] * qs[r * Tr::kPitch + d];
        }
        dv[i] = xv;
        dk[i] = xk;
      }
    }
  }
  if (my_key >= tile_cols) return;
  const int64_t offset = ((seq.k0 + key0 + my_key) * a.kv_heads + hk) * a.head_dim;
  T* dk_out = static_cast<T*>(a.dk) + offset;
  T* dv_out = static_cast<T*>(a.dv) + offset;
#pragma unroll
  for (int i = 0; i < Tr::kCols; ++i) {
    const int d = my_lane + i * Tr::kThreadsPerRow;
    if (d < a.head_dim) {
      dk_out[d] = FromAcc<T>(dk[i]);
      dv_out[d] = FromAcc<T>(dv[i]);
    }
  }
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_DEVICE_CUH_
