#ifndef PACKSCHED_KERNELS_TREE_H_
#define PACKSCHED_KERNELS_TREE_H_

// Kernels of tree packing (docs/design.md, "Tree packing"): a micro-batch holds pieces of a
// forest of rollouts, each piece one sequence of cu_seqlens with its nodes in depth-first
// preorder; subtree_end[t] (int32) is one past the last row of the subtree of row t's node. The
// attention mask is in attention.h (AttentionSeqlens::subtree_end); here are the positions and the
// loss over targets, where one row may predict several next tokens (a node's last row predicts
// the first token of each child). Conventions of kernels.h apply.

#include <cstdint>

#include "absl/status/status.h"
#include "dlpack/dlpack.h"
#include "packsched/kernels/kernels.h"

namespace packsched::kernels {

// position_ids[t] (int64 [rows]) = the depth of row t: the number of rows j of t's sequence
// before t with subtree_end[j] > t (the rows of its node and its ancestors before it), which is
// t's index in every rollout through it. Tail rows (seqlens.rows) count from 0 as in PositionIds.
// For a flat sequence (subtree_end = its end) this is PositionIds.
//
//   seqlens       the pieces' cu_seqlens (with rows for a tail)
//   subtree_end   int32 [rows]; for each row t of sequence b: t < subtree_end[t] <= cu[b + 1] and
//                 the subtrees nest (the contract's layout); tail rows are not read
//   position_ids  int64 [rows], output
//
// Returns InvalidArgument on a bad argument; on the CPU backend also for a subtree_end outside its
// range. The CUDA backend trusts the values.
absl::Status TreePositionIds(const Seqlens& seqlens, const DLTensor& subtree_end,
                             const DLTensor& position_ids, Stream stream);

// Cross entropy over targets (row, label), any number per row:
//   loss[i]    = logsumexp(logits[rows[i]]) - logits[rows[i], labels[i]]   (nats)
//   row_lse[r] = logsumexp(logits[r]) for every row (the backward's input)
//
//   logits   [R, V]  float16, bfloat16, float32 or float64; V >= 1
//   rows     [T]     int32 or int64, non-decreasing, each in [0, R)
//   labels   [T]     int32 or int64 (rows' dtype), each in [0, V)
//   loss     [T]     output, float32 (float64 for float64 logits)
//   row_lse  [R]     output, loss's dtype
//
// Accumulates in float32 (float64 for float64). Returns InvalidArgument on a bad argument; on the
// CPU backend also for rows out of order or out of range and labels out of range. The CUDA backend
// writes NaN for a label out of range and trusts the rows.
absl::Status MultiTargetCrossEntropy(const DLTensor& logits, const DLTensor& rows,
                                     const DLTensor& labels, const DLTensor& loss,
                                     const DLTensor& row_lse, Stream stream);

// The gradient of sum_i d_loss[i] * loss[i] with respect to the logits:
//   d_logits[r, v] = sum over targets i of row r of d_loss[i] * (softmax(logits[r])[v] - [v ==
//   labels[i]]), 0 on rows without targets.
// logits, rows, labels and row_lse as MultiTargetCrossEntropy took and returned them; d_loss [T]
// in loss's dtype; d_logits [R, V] output in logits' dtype. Errors as in the forward.
absl::Status MultiTargetCrossEntropyBackward(const DLTensor& logits, const DLTensor& row_lse,
                                             const DLTensor& rows, const DLTensor& labels,
                                             const DLTensor& d_loss, const DLTensor& d_logits,
                                             Stream stream);

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_TREE_H_
