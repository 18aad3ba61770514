#ifndef PACKSCHED_KERNELS_COMMON_ATTENTION_TILE_H_
#define PACKSCHED_KERNELS_COMMON_ATTENTION_TILE_H_

// Per-element math of tiled (FlashAttention-2) attention, compiled for host and device: which keys
// a query sees, the score of a q . k product, the online-softmax running state, and the backward's
// score gradient. The CPU and CUDA backends call exactly these functions on every tile element;
// only the order of the dot-product sums differs between them.
//
// Notation per sequence: sq, sk real lengths; query i, key j (0-based); s_ij the (capped,
// scaled) score; P = softmax rows; lse_i = log sum_j exp(s_ij).

#include <cmath>
#include <cstdint>

#include "kernels/common/elementwise.h"
#include "kernels/common/macros.h"
#include "kernels/common/tree.h"

namespace packsched::kernels {

// The tree mask of a self-attention sequence (attention.h, "Tree packing" in docs/design.md):
// packed-row arrays of the whole call, indexed by row0 + the in-sequence index.
struct AttnTree {
  const int32_t* subtree_end = nullptr;  // nullptr: no tree
  const int32_t* positions = nullptr;    // read only when window_left >= 0
  int64_t window_left = -1;              // on positions (depths); -1 = unbounded
  int64_t row0 = 0;                      // the sequence's first packed row
};

// Which keys the queries of one sequence see (see attention.h). With a tree, the range rule
// below is causal without a left window, and TreeVisible narrows it per element.
struct AttnMask {
  int64_t sq;  // real query rows
  int64_t sk;  // real key rows
  bool causal;
  int64_t window_left;   // -1 = unbounded
  int64_t window_right;  // -1 = unbounded
  AttnTree tree;
};

// The keys query i sees are the contiguous range [lo, hi) (empty when lo >= hi; always empty
// for a pad slot i >= sq). Both ends are non-decreasing in i, so a tile of rows i0..i1 sees at
// most [lo(i0), hi(i1)).
struct KeyRange {
  int64_t lo;
  int64_t hi;
};

// sq, sk and i are row counts (below 2^31); a window may be any value >= -1 up to INT64_MAX. The
// comparisons are arranged so that no intermediate overflows: a window wider than the sequence
// is the same as an unbounded one.
PACKSCHED_HD_INLINE KeyRange VisibleKeys(const AttnMask& m, int64_t i) {
  if (i >= m.sq) return KeyRange{0, 0};
  const int64_t diag = i + m.sk - m.sq;  // bottom-right aligned diagonal
  KeyRange r{0, m.sk};
  // lo = diag - left when that is above 0, i.e. when left < diag.
  if (m.window_left >= 0 && m.window_left < diag) r.lo = diag - m.window_left;
  // causal is a right window of 0, tighter than any explicit right window.
  const int64_t right = m.causal ? 0 : m.window_right;
  // hi = diag + right + 1 when that is below sk, i.e. when right < sk - 1 - diag = sq - 1 - i.
  if (right >= 0 && right < m.sq - 1 - i) r.hi = diag + right + 1;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// The tree rule for query i and key j of one sequence (in-sequence indices, j already in i's
// causal range): TreeKeyVisible (common/tree.h) on their packed rows. Always true without a tree.
PACKSCHED_HD_INLINE bool TreeVisible(const AttnTree& t, int64_t i, int64_t j) {
  if (t.subtree_end == nullptr) return true;
  const int64_t qi = t.row0 + i;
  const int64_t kj = t.row0 + j;
  const bool window = t.window_left >= 0;
  return TreeKeyVisible(qi, t.subtree_end[kj], window ? t.positions[qi] : 0,
                        window ? t.positions[kj] : 0, t.window_left);
}

// Whether query i sees key j: inside VisibleKeys(m, i) and, with a tree, TreeVisible.
PACKSCHED_HD_INLINE bool KeyVisible(const AttnMask& m, const KeyRange& keys, int64_t i, int64_t j) {
  return j >= keys.lo && j < keys.hi && TreeVisible(m.tree, i, j);
}

PACKSCHED_HD_INLINE float Tanh(float x) { return tanhf(x); }
PACKSCHED_HD_INLINE double Tanh(double x) { return tanh(x); }

template <typename AccT>
PACKSCHED_HD_INLINE AccT Inf() {
  return static_cast<AccT>(INFINITY);
}

// s = scale * (q . k), capped to softcap * tanh(s / softcap) when softcap > 0.
template <typename AccT>
PACKSCHED_HD_INLINE AccT AttnScore(AccT dot, AccT scale, AccT softcap) {
  const AccT s = dot * scale;
  return softcap > AccT(0) ? softcap * Tanh(s / softcap) : s;
}

// ds / d(q . k) at score s: scale, times 1 - tanh^2 = 1 - (s / softcap)^2 when capped.
template <typename AccT>
PACKSCHED_HD_INLINE AccT AttnScoreGrad(AccT s, AccT scale, AccT softcap) {
  if (softcap > AccT(0)) {
    const AccT t = s / softcap;
    return scale * (AccT(1) - t * t);
  }
  return scale;
}

// The online-softmax state of one query row: the running max of its scores and the sum of
// exp(s - max) over the keys seen so far. Starts at {-inf, 0}.
template <typename AccT>
struct SoftmaxRow {
  AccT max;
  AccT sum;
};

template <typename AccT>
PACKSCHED_HD_INLINE SoftmaxRow<AccT> SoftmaxStart() {
  return SoftmaxRow<AccT>{-Inf<AccT>(), AccT(0)};
}

// Moves the row to the new max max(row.max, tile_max) and returns the factor exp(old - new) by
// which the partial sum (already applied) and the row's output accumulator must be multiplied.
template <typename AccT>
PACKSCHED_HD_INLINE AccT SoftmaxRescale(SoftmaxRow<AccT>& row, AccT tile_max) {
  if (!(tile_max > row.max)) return AccT(1);  // also when both are -inf (nothing seen yet)
  const AccT factor = row.max == -Inf<AccT>() ? AccT(0) : Exp(row.max - tile_max);
  row.sum *= factor;
  row.max = tile_max;
  return factor;
}

// p = exp(s - max); a masked score (-inf) contributes 0.
template <typename AccT>
PACKSCHED_HD_INLINE AccT SoftmaxProb(AccT s, AccT max) {
  return s == -Inf<AccT>() ? AccT(0) : Exp(s - max);
}

// lse = max + log(sum); +inf for a row that saw no key.
template <typename AccT>
PACKSCHED_HD_INLINE AccT SoftmaxLse(const SoftmaxRow<AccT>& row) {
  return row.sum > AccT(0) ? row.max + Log(row.sum) : Inf<AccT>();
}

// out = accumulator / sum; 0 for a row that saw no key.
template <typename AccT>
PACKSCHED_HD_INLINE AccT SoftmaxOutScale(const SoftmaxRow<AccT>& row) {
  return row.sum > AccT(0) ? AccT(1) / row.sum : AccT(0);
}

// Backward: P_ij recomputed from the forward's lse, P = exp(s - lse) (0 for a masked key or a
// row that saw none).
template <typename AccT>
PACKSCHED_HD_INLINE AccT ProbFromLse(AccT s, AccT lse) {
  return s == -Inf<AccT>() || lse == Inf<AccT>() ? AccT(0) : Exp(s - lse);
}

// Backward: dS = P * (dP - D), with dP_ij = dout_i . v_j and D_i = dout_i . out_i (the softmax
// Jacobian applied to dP). Times AttnScoreGrad it is the gradient w.r.t. q_i . k_j.
template <typename AccT>
PACKSCHED_HD_INLINE AccT ScoreGradient(AccT p, AccT dp, AccT d_row) {
  return p * (dp - d_row);
}

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_COMMON_ATTENTION_TILE_H_
