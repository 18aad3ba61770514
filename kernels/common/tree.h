#ifndef PACKSCHED_KERNELS_COMMON_TREE_H_
#define PACKSCHED_KERNELS_COMMON_TREE_H_

// Per-element math of the tree-packing kernels (tree.h), compiled for host and device.

#include <cstdint>

#include "kernels/common/elementwise.h"
#include "kernels/common/macros.h"

namespace packsched::kernels {

// Whether row j (before t, same sequence) is still open at row t: t is inside the subtree of j's
// node, so j is on t's root path (the attention mask's rule without the causal half).
PACKSCHED_HD_INLINE bool OpenAt(int32_t subtree_end_j, int64_t t) { return t < subtree_end_j; }

// The tree mask rule of attention (docs/design.md, "Mask rule"), the one predicate every kernel
// applies per element (the CPU backend, the scalar and the tensor-core CUDA kernels): query row
// qi sees key row kj of its sequence, packed indices with kj <= qi (the causal half is the varlen
// rule's), while qi is inside the subtree of kj's node (key_subtree_end = subtree_end[kj]) and,
// with a left window (window_left >= 0), when the depths differ by at most the window. The depths
// are read only with a window: pass 0 without one.
PACKSCHED_HD_INLINE bool TreeKeyVisible(int64_t qi, int32_t key_subtree_end, int64_t q_depth,
                                        int64_t k_depth, int64_t window_left) {
  return OpenAt(key_subtree_end, qi) && (window_left < 0 || q_depth - k_depth <= window_left);
}

// The first index in [lo, hi) whose row is >= `row` (rows non-decreasing): the targets of a row
// are [LowerBound(row), LowerBound(row + 1)).
template <typename Index>
PACKSCHED_HD_INLINE int64_t LowerBound(const Index* rows, int64_t lo, int64_t hi, int64_t row) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(rows[mid]) < row) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// d_logits[r, v] before the labels' one-hot terms: the row's summed target gradient times
// softmax(logits[r])[v] = exp(logit - lse).
template <typename AccT>
PACKSCHED_HD_INLINE AccT MultiTargetSoftmaxGrad(AccT grad_sum, AccT logit, AccT lse) {
  return grad_sum == AccT(0) ? AccT(0) : grad_sum * Exp(logit - lse);
}

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_COMMON_TREE_H_
