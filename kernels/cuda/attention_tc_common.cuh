#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_COMMON_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_COMMON_CUH_

// Pieces shared by the tensor-core attention kernels (attention_tc_fwd.cuh, attention_tc_bwd.cuh):
// their parameters, the swizzled shared tiles and their asynchronous loads, the mask predicate
// (the varlen rule of attention.h plus the tree rule of docs/design.md "Tree packing"), and
// quad reductions over the 4 lanes that hold one row of an mma accumulator.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/attention_tile.h"
#include "kernels/common/half.h"
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/ptx.cuh"
#include "kernels/internal/attention_args.h"

namespace packsched::kernels::internal::cuda {

// Host side: the grid of a tensor-core kernel, (tiles of `tile` rows over the longest segment,
// `heads`, sequences + a tail slot) as LaunchSpan counts them; false past the grid's limits.
inline bool TcGrid(const AttentionArgs& a, int64_t max_seqlen, int tile, int64_t heads, bool keys,
                   dim3* grid) {
  const AttnLaunchSpan span = LaunchSpan(a, max_seqlen, keys);
  const int64_t tiles = (span.longest + tile - 1) / tile;
  if (heads > 65535 || span.sequences > 65535 || tiles > 0x7fffffff) return false;
  *grid = dim3(static_cast<unsigned>(tiles < 1 ? 1 : tiles), static_cast<unsigned>(heads),
               static_cast<unsigned>(span.sequences));
  return true;
}

// The (query tile, head, sequence) of a block of the forward or of the backward's pass 1 in
// heaviest-first order. Blocks start roughly in the order of their linear index (blockIdx.x
// fastest); that index is mapped so that the grid (tiles, heads, sequences) of TcGrid is walked
// tile index descending, every head and sequence (tail slot included) at one tile index before
// the next lower one. Under a causal mask query tile i of a sequence sees about (i + 1) tiles of
// keys whatever the sequence, so the longest-running blocks start first and the short ones fill
// the last wave (without a mask the high tile indices are those of the longest sequences, which
// see the most keys). A bijection of the grid: every block of the plain order is run exactly
// once. `Linear` is the type of the linear index: uint64_t for any grid, uint32_t (cheaper
// division, fewer registers) only for grids of fewer than 2^32 blocks (TcGridFits32).
struct TcBlockIndex {
  int64_t tile, head, seq;
};

template <typename Linear = uint64_t>
__device__ inline TcBlockIndex HeaviestFirstBlock() {
  const Linear per_tile = static_cast<Linear>(gridDim.y) * gridDim.z;
  const Linear linear = blockIdx.x + static_cast<Linear>(gridDim.x) *
                                         (blockIdx.y + static_cast<Linear>(gridDim.y) * blockIdx.z);
  const Linear rest = linear % per_tile;
  return TcBlockIndex{static_cast<int64_t>(gridDim.x - 1 - linear / per_tile),
                      static_cast<int64_t>(rest % gridDim.y),
                      static_cast<int64_t>(rest / gridDim.y)};
}

// Host side: whether `grid` has fewer than 2^32 blocks (HeaviestFirstBlock<uint32_t> applies).
inline bool TcGridFits32(const dim3& grid) {
  return static_cast<uint64_t>(grid.x) * grid.y * grid.z <= 0xffffffffu;
}

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// The swizzle of the shared tiles (attention_tc_traits.h): where 16-byte chunk c of a row r with
// r % 8 == r7 is stored, in a tile of kCols 16-bit columns. Rows of a multiple of 64 columns
// (128 bytes) XOR the chunk with r7: the 8 rows of an ldmatrix phase (one chunk each, rows r0 ..
// r0 + 7 with r0 % 8 == 0) land on 8 different 16-byte bank groups. Rows of 96 columns (192
// bytes, 12 chunks) start on bank group 0 or 4 alternately, so the chunk's place within its
// aligned group of 4 is XORed with (r7 / 2) % 4: even rows take the 4 groups of one half of the
// banks, odd rows those of the other.
template <int kCols>
__device__ inline int SwzChunk(int c, int r7) {
  static_assert(kCols % 64 == 0 || kCols == 96, "swizzled tile widths");
  if constexpr (kCols % 64 == 0) {
    return c ^ r7;
  } else {
    return c ^ ((r7 >> 1) & 3);
  }
}

// Element offset of (row, col) in a swizzled tile of kD 16-bit columns.
template <int kD>
__device__ inline int Swz(int row, int col) {
  return row * kD + ((SwzChunk<kD>(col >> 3, row & 7) << 3) | (col & 7));
}

// The element offsets, within a row of a swizzled tile of kCols columns, of chunks c0 + 2 k + h
// for k = 0..3 (c0 even) in rows r with r % 8 == r7: SwzChunk(c0 + 2 k + h, r7) 8, a lane's 4
// values computed once, so that an address inside a fragment loop is a row pointer plus one of
// them plus a constant (Swz computed per address costs an XOR and a shift-add each: the compiler
// cannot see that r7 < 8 leaves the chunk's high bits alone).
struct SwzPairs {
  int off[4];
};

template <int kCols>
__device__ inline SwzPairs MakeSwzPairs(int c0, int h, int r7) {
  SwzPairs p;
#pragma unroll
  for (int k = 0; k < 4; ++k) p.off[k] = SwzChunk<kCols>(c0 + 2 * k + h, r7) << 3;
  return p;
}

// The element offset of chunk c0 + 2 kk + h of a row (kk compile-time after unrolling; kk >= 4
// only when c0 is a multiple of 8, and the swizzle repeats every 8 chunks): Swz's column part.
__device__ inline int SwzPair(const SwzPairs& p, int kk) { return (kk >> 2) * 64 + p.off[kk & 3]; }

// Issues cp.async copies of n rows starting at `first` (rows `stride` elements apart, kD
// elements each) into tile rows [0, n) and zero fill into rows [n, kRows), spread over the
// block's kThreads threads: chunks [kC0, kC0 + kNc) of each row here, the rest by the next part
// (rows of 96 columns in parts of 8 and 4 chunks). Each thread copies one 16-byte chunk column c
// of rows r0, r0 + R, r0 + 2R, ... (R = kThreads / kNc, a multiple of 8): the swizzle of its
// chunk is the same in every one of those rows, so its shared and global addresses are set up
// once and step by constants (the per-copy index arithmetic of the plain loop cost about 20
// instructions per 16-byte copy).
template <typename T, int kD, int kRows, int kThreads, int kC0 = 0>
__device__ void LoadTileAsync(T* tile, const T* first, int32_t stride, int32_t n) {
  constexpr int kLeft = kD / 8 - kC0;                        // chunks of a row not yet copied
  constexpr int kNc = kLeft >= 8 ? 8 * (kLeft / 8) : kLeft;  // this part's: 8 k or the rest
  constexpr int kStep = kThreads / kNc;                      // rows per pass of the block
  static_assert(kThreads % kNc == 0 && kStep % 8 == 0 && kRows % kStep == 0,
                "a thread's chunk keeps its swizzle from pass to pass");
  const int c = kC0 + static_cast<int>(threadIdx.x) % kNc;
  const int r0 = static_cast<int>(threadIdx.x) / kNc;
  T* to = tile + Swz<kD>(r0, c * 8);
  const T* from = first + static_cast<int64_t>(r0) * stride + c * 8;
  const int64_t from_step = static_cast<int64_t>(kStep) * stride;
  const int32_t rows_left = n - r0;
#pragma unroll
  for (int pass = 0; pass < kRows / kStep; ++pass) {
    const bool real = pass * kStep < rows_left;
    ptx::CpAsync16(to + pass * kStep * kD, real ? from : first, real);
    from += from_step;
  }
  if constexpr (kC0 + kNc < kD / 8) {
    LoadTileAsync<T, kD, kRows, kThreads, kC0 + kNc>(tile, first, stride, n);
  }
}

// The same for rows [row0, row0 + n) of head h of `src` ([rows, heads, kD]).
template <typename T, int kD, int kRows, int kThreads>
__device__ void LoadRowsAsync(T* tile, const void* src, int64_t row0, int64_t n, int64_t heads,
                              int64_t h) {
  LoadTileAsync<T, kD, kRows, kThreads>(tile, static_cast<const T*>(src) + (row0 * heads + h) * kD,
                                        static_cast<int32_t>(heads * kD), static_cast<int32_t>(n));
}

// Which keys the rows of a sequence see: the varlen rule, and the tree when there is one.
struct TcMask {
  AttnMask rule;               // the window's left side cleared with a tree
  const int32_t* subtree_end;  // null: no tree
  const int32_t* positions;    // with a tree and a left window
  int64_t window;              // position window (tree only), -1: none
  int64_t q0, k0;              // the sequence's first packed rows
};

__device__ inline TcMask MakeTcMask(const TcAttnParams& p, const AttnSeq& seq) {
  TcMask m{seq.mask, p.subtree_end, nullptr, -1, seq.q0, seq.k0};
  if (p.subtree_end != nullptr) {
    // With a tree the front end has moved the left window onto the positions (AttentionArgs).
    if (p.args.tree_window_left >= 0) {
      m.positions = p.positions;
      m.window = p.args.tree_window_left;
    }
    m.rule.window_left = -1;
  }
  return m;
}

// What one query row needs for the per-element predicate: its key range under the varlen rule,
// and with a tree its packed row and position.
struct TcRow {
  KeyRange keys;
  int64_t i;       // segment row
  int32_t packed;  // packed row (tree)
  int32_t position;
};

__device__ inline TcRow MakeTcRow(const TcMask& m, int64_t i) {
  TcRow r{VisibleKeys(m.rule, i), i, static_cast<int32_t>(m.q0 + i), 0};
  if (m.positions != nullptr && i < m.rule.sq) r.position = m.positions[m.q0 + i];
  return r;
}

// The tree part of the predicate, for a row and key j that the varlen rule lets through: key j's
// subtree end and position.
__device__ inline bool TreeVisible(const TcMask& m, const TcRow& r, int64_t j, int32_t end,
                                   int32_t pos) {
  return j <= r.i && TreeKeyVisible(r.packed, end, r.position, pos, m.window);
}

// Whether the row sees key j (segment index), column c of the key tile whose tree vectors are
// `end` and `pos` (LoadKeyVectors; read only with a tree).
__device__ inline bool TcVisible(const TcMask& m, const TcRow& r, int64_t j, const int32_t* end,
                                 const int32_t* pos, int c) {
  if (j < r.keys.lo || j >= r.keys.hi) return false;
  if (m.subtree_end == nullptr) return true;
  return TreeVisible(m, r, j, end[c], m.positions != nullptr ? pos[c] : 0);
}

// Where the key tiles of a block come from, set up once so that the loop holds two pointers and
// two counts rather than the sequence's 64-bit offsets: K's and V's row of kv head hk at the
// block's first key `lo` (rows `stride` elements apart), the tree vectors at that key (null
// without a tree, or without positions), and how many keys from `lo` are real (the segment's).
template <typename T>
struct KeySource {
  const T* k;
  const T* v;
  const int32_t* end;
  const int32_t* pos;
  int32_t stride;
  int32_t real;
};

template <typename T, int kD>
__device__ inline KeySource<T> MakeKeySource(const AttentionArgs& a, const TcMask& mask, int64_t lo,
                                             int64_t hk) {
  const int64_t row = (mask.k0 + lo) * a.kv_heads + hk;
  const bool tree = mask.subtree_end != nullptr;
  return KeySource<T>{static_cast<const T*>(a.k) + row * kD,
                      static_cast<const T*>(a.v) + row * kD,
                      tree ? mask.subtree_end + mask.k0 + lo : nullptr,
                      tree && mask.positions != nullptr ? mask.positions + mask.k0 + lo : nullptr,
                      static_cast<int32_t>(a.kv_heads * kD),
                      static_cast<int32_t>(Clamp0(mask.rule.sk - lo, int64_t{0x7fffffff}))};
}

// Issues the cp.async loads of key tile n (keys lo + n kBc onwards; the rows past the real keys
// zero-filled) into buffer n & 1 of `ks` and `vs` ([2][kBc][kD] each), and with a tree loads the
// tile's vectors into `key_end` and `key_pos` ([2][kVectorLen] each; 0 past the real keys, so no
// row sees them; plain loads, visible after the next __syncthreads). The caller commits and waits.
template <typename T, typename Tr>
__device__ void LoadKeyTile(const KeySource<T>& src, int n, T* ks, T* vs, int32_t* key_end,
                            int32_t* key_pos) {
  constexpr int kD = Tr::kHeadDim;
  constexpr int kBc = Tr::kBc;
  constexpr int kV = Tr::kVectorLen;
  const int buf = n & 1;
  const int32_t first = n * kBc;
  const int32_t cols = src.real - first < kBc ? src.real - first : kBc;
  const int64_t offset = static_cast<int64_t>(first) * src.stride;
  LoadTileAsync<T, kD, kBc, Tr::kThreads>(ks + buf * kBc * kD, src.k + offset, src.stride, cols);
  LoadTileAsync<T, kD, kBc, Tr::kThreads>(vs + buf * kBc * kD, src.v + offset, src.stride, cols);
  if (src.end == nullptr) return;
  for (int c = threadIdx.x; c < kBc; c += Tr::kThreads) {
    const bool real = c < cols;
    key_end[buf * kV + c] = real ? src.end[first + c] : 0;
    if (src.pos != nullptr) key_pos[buf * kV + c] = real ? src.pos[first + c] : 0;
  }
}

// The keys of a warp's query rows [i0, i0 + n) (0 <= n <= full): `some`, the keys some row sees;
// `all`, the keys every row sees (both ends of a row's range are non-decreasing in the row),
// empty with a tree or a partial warp (n < full). Without a tree a key tile inside `all` needs
// no per-element mask.
struct WarpKeys {
  KeyRange some{0, 0};
  KeyRange all{0, 0};
};

__device__ inline WarpKeys WarpKeysOf(const TcMask& mask, int64_t i0, int64_t n, int64_t full) {
  WarpKeys w;
  if (n > 0) {
    const KeyRange top = VisibleKeys(mask.rule, i0);
    const KeyRange bottom = VisibleKeys(mask.rule, i0 + n - 1);
    w.some = KeyRange{top.lo, bottom.hi};
    if (n == full && mask.subtree_end == nullptr) w.all = KeyRange{bottom.lo, top.hi};
  }
  return w;
}

// A range [lo, hi) of key tile indices n, tile n holding keys [base + n kBc, base + (n + 1) kBc);
// empty when lo >= hi.
struct TileSpan {
  int lo, hi;
};

// x / d rounded down and up (d > 0, any sign of x).
__device__ inline int64_t FloorDiv(int64_t x, int64_t d) {
  return x >= 0 ? x / d : -((-x + d - 1) / d);
}
__device__ inline int64_t CeilDiv(int64_t x, int64_t d) { return -FloorDiv(-x, d); }

// The tiles among [0, tiles) holding some key of r, and those holding only keys of r.
__device__ inline TileSpan TilesOverlapping(KeyRange r, int64_t base, int kBc, int tiles) {
  if (r.hi <= r.lo) return TileSpan{0, 0};
  return TileSpan{static_cast<int>(Clamp0(FloorDiv(r.lo - base, kBc), tiles)),
                  static_cast<int>(Clamp0(CeilDiv(r.hi - base, kBc), tiles))};
}
__device__ inline TileSpan TilesInside(KeyRange r, int64_t base, int kBc, int tiles) {
  if (r.hi <= r.lo) return TileSpan{0, 0};
  return TileSpan{static_cast<int>(Clamp0(CeilDiv(r.lo - base, kBc), tiles)),
                  static_cast<int>(Clamp0(FloorDiv(r.hi - base, kBc), tiles))};
}

// Reductions over the 4 lanes of a quad (the lanes that share rows g and g + 8).
__device__ inline float QuadMax(float x) {
  x = fmaxf(x, ptx::ShflXor(x, 1));
  return fmaxf(x, ptx::ShflXor(x, 2));
}
__device__ inline float QuadSum(float x) {
  x += ptx::ShflXor(x, 1);
  return x + ptx::ShflXor(x, 2);
}
// Over the whole warp.
__device__ inline int32_t WarpMax(int32_t x) {
  for (int mask = 16; mask >= 1; mask /= 2) {
    const int32_t y = ptx::ShflXor(x, mask);
    x = y > x ? y : x;
  }
  return x;
}

// The softmax of the tensor-core kernels, in base 2 as FlashAttention-2's: a score is held as the
// tile product q·k leaves the tensor cores (capped: softcap · tanh(scale · q·k / softcap), by
// CapScores in the capped copy of each kernel's tile loop), and each exponential is one fused
// multiply-add and one ex2.approx.ftz, p = 2^(s · exp_mult − base), with base the row's running
// max (forward) or its lse (backward, TcLse2) in base-2 units. Nothing tests for −inf per score:
// a masked score is −inf and gives 2^−inf = 0, and the bases are never −inf (the forward's max
// starts at the lowest float, TcRowStart; a row that saw no key in the forward has lse +inf, so
// all its p are 0).
struct TcSoftmax {
  float scale;     // the attention's scale
  float softcap;   // > 0: scores capped
  float cap_in;    // scale / softcap (capped)
  float inv_cap;   // 1 / softcap (capped)
  float exp_mult;  // base-2 exponent per unit of a held score: scale · log2(e), capped log2(e)
  bool capped;
};

__device__ inline TcSoftmax MakeTcSoftmax(const AttentionArgs& a) {
  const float scale = static_cast<float>(a.scale);
  const float softcap = static_cast<float>(a.softcap);
  const bool capped = softcap > 0.f;
  return TcSoftmax{scale,
                   softcap,
                   capped ? scale / softcap : 0.f,
                   capped ? 1.f / softcap : 0.f,
                   capped ? kLog2e : scale * kLog2e,
                   capped};
}

// Caps the held scores of an accumulator array in place (call only when sm.capped).
template <int kN>
__device__ inline void CapScores(const TcSoftmax& sm, float (&s)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = sm.softcap * tanhf(s[n][i] * sm.cap_in);
  }
}

// Runs a kernel's tile loop, a generic lambda compiled twice, as loop(std::true_type{}) when the
// scores are capped and loop(std::false_type{}) when not: the uncapped copy then holds no trace
// of tanh (left to itself, ptxas may keep the cap inside one loop as predicated-off instructions
// that still issue).
template <typename Loop>
__device__ inline void RunPerCap(const TcSoftmax& sm, Loop& loop) {
  if (sm.capped) {
    loop(std::true_type{});
  } else {
    loop(std::false_type{});
  }
}

// p = 2^(s · exp_mult − base).
__device__ inline float TcProb(const TcSoftmax& sm, float s, float base) {
  return ptx::Ex2(fmaf(s, sm.exp_mult, -base));
}

// Forward: a row's online-softmax state with `max` in base-2 units (the largest s · exp_mult so
// far, the base of its TcProb), starting at the lowest float rather than −inf: a row that has
// seen no key yet then gives p = 0 for a masked score and factor 0 once it sees one, with no
// test for −inf.
__device__ inline SoftmaxRow<float> TcRowStart() { return SoftmaxRow<float>{-3.40282347e38f, 0.f}; }

// Forward: moves the row to max(row.max, tile_max · exp_mult) (tile_max in held units, −inf for
// a tile the row does not see) and returns the factor 2^(old − new), already applied to the row's
// sum, by which its output accumulator is multiplied: 1 when the max stays, 0 from a row that had
// seen no key.
__device__ inline float TcRescale(const TcSoftmax& sm, SoftmaxRow<float>& row, float tile_max) {
  const float next = fmaxf(row.max, tile_max * sm.exp_mult);
  const float factor = ptx::Ex2(row.max - next);
  row.sum *= factor;
  row.max = next;
  return factor;
}

// Forward: how far (base-2 units) a row's running max may trail the largest score it has seen.
// The max moves, and O is rescaled, only when a tile lifts some row of the warp by more than
// this (FlashAttention-4's conditional rescaling); otherwise every row keeps its max, its p stay
// at most 2^8 = 256 (within range and at the same relative precision in bf16, fp16 and the float
// sums), and O and the sum go on in the same units, so the result is the same up to rounding.
inline constexpr float kRescaleSlack = 8.f;

// Forward: whether a tile's max (held units, QuadMax'ed) lifts the row past its slack.
__device__ inline bool TcMaxGrows(const TcSoftmax& sm, const SoftmaxRow<float>& row,
                                  float tile_max) {
  return tile_max * sm.exp_mult > row.max + kRescaleSlack;
}

// Forward: lse = max · ln 2 + log(sum), natural-log units of the scaled (and capped) score; +inf
// for a row that saw no key.
__device__ inline float TcLse(const SoftmaxRow<float>& row) {
  return row.sum > 0.f ? row.max * kLn2 + logf(row.sum) : Inf<float>();
}

// Backward: a row's lse as the base of TcProb (+inf stays +inf: every p of the row is 0).
__device__ inline float TcLse2(float lse) { return lse * kLog2e; }

// Backward: dS / scale = P (dP − D) · ds/d(q·k) / scale at held score s: 1, capped
// 1 − (s / softcap)². The scale itself is applied once to the sums (dQ, dK) rather than to every
// score, as FlashAttention-2 does.
template <bool kCapped>
__device__ inline float TcScoreGradient(const TcSoftmax& sm, float p, float dp, float d_row,
                                        float s) {
  if constexpr (kCapped) {
    const float t = s * sm.inv_cap;
    return p * (dp - d_row) * fmaf(-t, t, 1.f);
  } else {
    return p * (dp - d_row);
  }
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_COMMON_CUH_
