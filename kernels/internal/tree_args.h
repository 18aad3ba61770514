#ifndef PACKSCHED_KERNELS_INTERNAL_TREE_ARGS_H_
#define PACKSCHED_KERNELS_INTERNAL_TREE_ARGS_H_

// Checked, plain-pointer arguments of the tree-packing entry points (tree.h). No absl: the CUDA
// translation unit includes this header.

#include <cstdint>

#include "kernels/internal/args.h"

namespace packsched::kernels::internal {

struct TreePositionsArgs {
  const int32_t* cu;           // [B + 1]
  const int32_t* subtree_end;  // [rows]
  int64_t batch, rows;         // rows >= cu[B]: [cu[B], rows) is the tail
  int64_t* position_ids;       // [rows]
};

struct MultiTargetArgs {
  const void* logits;  // [num_rows, vocab]
  FloatType dtype;
  int64_t num_rows, vocab, targets;
  const void* rows;  // [targets], int32 or int64 (index_64), non-decreasing
  const void* labels;
  bool index_64;
  void* loss;     // [targets], float32 (float64 for kF64): forward output
  void* row_lse;  // [num_rows], loss's type: forward output, backward input
  // Backward only.
  const void* d_loss;  // [targets], loss's type
  void* d_logits;      // [num_rows, vocab], dtype
};

}  // namespace packsched::kernels::internal

#endif  // PACKSCHED_KERNELS_INTERNAL_TREE_ARGS_H_
