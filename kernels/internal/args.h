#ifndef PACKSCHED_KERNELS_INTERNAL_ARGS_H_
#define PACKSCHED_KERNELS_INTERNAL_ARGS_H_

// Checked, plain-pointer arguments of the backend entry points (see backend.h). No absl here:
// the CUDA translation unit includes this header and stays free of host-only libraries.

#include <cstdint>

namespace packsched::kernels::internal {

// Element types the arithmetic kernels distinguish; the copy kernels see only bytes.
enum class FloatType { kF16, kBf16, kF32, kF64 };

struct UnpadArgs {
  const void* x;           // [B, S, row_bytes]
  const void* mask;        // [B, S], mask_bytes per element
  int mask_bytes;          // 1, 4 or 8
  const int32_t* cu;       // [B + 1]
  const int32_t* cu_host;  // [B + 1], host
  int64_t batch, seqlen, row_bytes, total;
  void* x_packed;    // [total, row_bytes]
  int64_t* indices;  // [total]
};

struct PadArgs {
  const void* x_packed;                // [total, row_bytes]
  const int64_t* indices;              // [total]
  int64_t total, row_bytes, rows_out;  // rows_out = B * S
  void* x;                             // [rows_out, row_bytes]
};

struct PackAlignedArgs {
  const void* x_packed;           // [total, row_bytes]
  const int32_t* cu;              // [B + 1], real offsets
  const int32_t* cu_padded_host;  // [B + 1], host
  int64_t batch, total, total_padded, row_bytes, elem_bytes, align;
  int64_t rows;  // rows of x_aligned, >= total_padded: [total_padded, rows) is the tail
  // One element of the pad value, repeated to 16 bytes (element sizes divide 16).
  alignas(16) unsigned char pad_pattern[16];
  void* x_aligned;     // [rows, row_bytes]
  int32_t* cu_padded;  // [B + 1] output
  int32_t* seqused;    // [B] output
};

struct UnpackAlignedArgs {
  const void* x_aligned;     // [>= cu_padded[B], row_bytes] (a tail is not read)
  const int32_t* cu;         // [B + 1]
  const int32_t* cu_padded;  // [B + 1]
  int64_t batch, total, row_bytes;
  void* x_packed;  // [total, row_bytes]
};

struct PositionIdsArgs {
  const int32_t* cu;      // [B + 1]
  int64_t batch, rows;    // rows >= cu[B]: [cu[B], rows) is the tail
  int64_t* position_ids;  // [rows]
};

struct ShiftLabelsArgs {
  const void* ids;  // [rows], int32 or int64 (ids_64)
  bool ids_64;
  const int32_t* cu;                  // [B + 1] real offsets
  const int32_t* cu_padded;           // [B + 1] layout of ids, or nullptr: the packed layout (= cu)
  int64_t batch, rows, ignore_index;  // rows >= layout[B]: [layout[B], rows) is the tail
  void* labels;                       // [rows], ids' dtype
};

struct CrossEntropyArgs {
  const void* logits;  // [rows, vocab]
  FloatType dtype;
  int64_t vocab;
  const void* labels;  // [rows], int32 or int64 (labels_64)
  bool labels_64;
  const int32_t* cu;                  // [B + 1]
  int64_t batch, rows, ignore_index;  // rows >= cu[B]: [cu[B], rows) is the tail
  void* per_token_loss;               // [rows], dtype
  void* per_sequence_sum;             // [B], dtype
  int64_t* per_sequence_count;        // [B]
};

// CpShard (gather: shard[r] = x[map(r)]) and CpUnshard (scatter: x[map(r)] = shard[r]), map =
// CpSourceRow (common/context_parallel.h).
struct CpShardArgs {
  void* x;            // [total, row_bytes]: read by CpShard, written by CpUnshard
  const int32_t* cu;  // [B + 1], every length a multiple of 2 * cp
  int64_t batch, total, row_bytes, cp, rank;
  void* shard;  // [total / cp, row_bytes]: written by CpShard, read by CpUnshard
};

struct MropeArgs {
  const int32_t* types;        // [rows]
  const int32_t* cu;           // [B + 1]
  const int32_t* grids;        // [N, 3]
  const int32_t* grid_cu;      // [B + 1], grid offsets per sequence
  int64_t batch, rows, merge;  // rows >= cu[B]: [cu[B], rows) is the tail
  int64_t* position_ids;       // [3, rows]
};

}  // namespace packsched::kernels::internal

#endif  // PACKSCHED_KERNELS_INTERNAL_ARGS_H_
