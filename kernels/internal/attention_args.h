#ifndef PACKSCHED_KERNELS_INTERNAL_ATTENTION_ARGS_H_
#define PACKSCHED_KERNELS_INTERNAL_ATTENTION_ARGS_H_

// Checked, plain-pointer arguments of the attention entry points (see backend.h). No absl: the
// CUDA translation unit includes this header.

#include <cstdint>

#include "kernels/internal/args.h"

namespace packsched::kernels::internal {

struct AttentionArgs {
  FloatType dtype;
  const void* q;             // [total_q, heads, head_dim]
  const void* k;             // [total_k, kv_heads, head_dim]
  const void* v;             // [total_k, kv_heads, head_dim]
  const int32_t* cu_q;       // [batch + 1] segment offsets of the query rows
  const int32_t* cu_k;       // [batch + 1] segment offsets of the key rows
  const int32_t* cu_q_host;  // the same, host
  const int32_t* cu_k_host;
  const int32_t* seqused_q;  // [batch] real lengths, or nullptr (= segment lengths)
  const int32_t* seqused_k;
  // Tree packing (attention.h), or nullptr: subtree_end [total_k] and positions [total_q] (read
  // only when tree_window_left >= 0). With a tree, window_left is -1 and the left window applies
  // to positions: tree_window_left.
  const int32_t* subtree_end;
  const int32_t* positions;
  int64_t tree_window_left;
  // The query-row map (attention.h), host, strictly ascending, or nullptr: every row.
  const int32_t* query_rows;
  int64_t num_query_rows;
  int64_t batch, total_q, total_k, heads, kv_heads, head_dim, max_seqlen_q, max_seqlen_k;
  double scale;    // multiplies q . k
  double softcap;  // 0 = off
  bool causal;
  int64_t window_left, window_right;  // -1 = unbounded
  int num_threads;                    // CPU only; >= 1
  // Forward: outputs. Backward: inputs (the forward's results), never written.
  void* out;  // [total_q, heads, head_dim], dtype
  void* lse;  // [heads, total_q], float32 (float64 for kF64)
  // Backward only.
  const void* dout;  // [total_q, heads, head_dim]
  void* dq;          // [total_q, heads, head_dim]
  void* dk;          // [total_k, kv_heads, head_dim]
  void* dv;          // [total_k, kv_heads, head_dim]
  // CUDA only, set by its launchers from query_rows (attention_query_runs.cuh): the map's runs of
  // consecutive rows as [first, end) pairs [2 * num_query_runs] on the device, or nullptr: no
  // map. The front end leaves it null. Last, so that the kernels' other parameters keep their
  // offsets.
  const int32_t* query_runs;
  int64_t num_query_runs;
};

}  // namespace packsched::kernels::internal

#endif  // PACKSCHED_KERNELS_INTERNAL_ATTENTION_ARGS_H_
