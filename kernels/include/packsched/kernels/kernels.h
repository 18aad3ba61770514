#ifndef PACKSCHED_KERNELS_KERNELS_H_
#define PACKSCHED_KERNELS_KERNELS_H_

// The worker kernels behind one backend-neutral API: packing (unpad / pad, aligned packing),
// position ids, label shifting and packed cross entropy; varlen attention is in attention.h.
// See docs/design.md §4.
//
// Tensors are DLPack views (`DLTensor`), compact row-major (strides NULL or equal to the compact
// strides). Every tensor of one call lives on the same device; the device type picks the
// backend: kDLCPU (and kDLCUDAHost, pinned host memory) run on the calling thread, kDLCUDA runs
// on the CUDA backend, asynchronously on `stream`. Outputs are provided by the caller, already
// allocated with the documented shape and dtype; the library never allocates device memory and
// never synchronises with the device: the host-side metadata a call needs (cu_seqlens, which
// the plan provides) is passed in as a host copy.
//
// Packed layout: a batch of B sequences is stored as rows [0, total) of one tensor, sequence b
// in rows [cu_seqlens[b], cu_seqlens[b + 1]). cu_seqlens is int32 [B + 1] with cu_seqlens[0] = 0,
// non-decreasing (zero-length sequences allowed), total = cu_seqlens[B]. B = 0 (cu_seqlens = {0})
// and total = 0 are valid everywhere.
//
// Aligned layout (TransformerEngine "THD"): sequence b occupies rows
// [cu_seqlens_padded[b], cu_seqlens_padded[b + 1]); its real tokens are the first
// cu_seqlens[b + 1] - cu_seqlens[b] rows, the rest are pad slots.
//
// Tail: a layout may hold more rows than its offsets cover, declared by `Seqlens::rows` (and
// PackAligned's `rows`). Rows [cu[B], rows) are the tail: the padding that rounds a micro-batch up
// to the plan's `total` rows (align_total_to, e.g. Ulysses sequence parallelism needs the row
// count divisible by the SP size). The tail belongs to no sequence and acts like one extra
// pseudo-sequence without real tokens (verl's Ulysses padding): PackAligned fills it with
// `pad_value`; its position ids restart at 0 (rows - cu[B] - 1 at the last row); its labels are
// ignore_index; its per-token cross-entropy loss is 0 whatever its labels; in attention its rows
// are never keys and, as queries, see no key (out = 0, lse = +inf, and dq, dk, dv = 0), so it
// adds nothing to any loss or gradient; UnpackAligned drops it. Calls that take no tail reject
// one (InvalidArgument).
//
// Errors: every call validates all arguments on the host before touching data and returns
// InvalidArgument naming the argument (wrong dtype, shape, device, non-contiguous tensor,
// non-monotone cu_seqlens, a total that does not match, an unsupported dtype); Unimplemented for
// CUDA tensors when the library was built without CUDA; FailedPrecondition / Internal when the
// CUDA runtime reports an error (for example, no device). Nothing is written when validation
// fails. Value checks that would need the device data (mask counts, index ranges, label ranges)
// are made on the CPU backend only; the CUDA backend documents what it does instead.
//
// Thread-safety: calls are independent; concurrent calls must not write the same outputs.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dlpack/dlpack.h"

namespace packsched::kernels {

// An opaque stream handle: a cudaStream_t for CUDA tensors (nullptr is the legacy default
// stream); ignored for host tensors, which are processed synchronously.
using Stream = void*;

// A cu_seqlens tensor together with a host copy of its values.
struct Seqlens {
  // int32 [B + 1] on the call's device.
  const DLTensor* cu_seqlens = nullptr;
  // The same B + 1 values in host memory. May be empty when `cu_seqlens` is a host tensor (its
  // data is then read directly); required for CUDA tensors. For host tensors a non-empty copy
  // must equal the tensor (checked). For CUDA tensors the caller guarantees they are equal.
  absl::Span<const int32_t> host;
  // Rows of the tensors laid out by these offsets: -1 (the default) means exactly cu[B] rows,
  // no tail; otherwise >= cu[B] (the plan's MicroBatch::total), and rows [cu[B], rows) are the
  // tail described above. InvalidArgument when below cu[B] or below -1.
  int64_t rows = -1;
};

// Dtypes accepted where a call says "any element type": float16, bfloat16, float32, float64,
// int8/16/32/64, uint8/16/32/64 (lanes = 1). These calls copy elements as bytes.

// Packs the token rows of a padded batch: x_packed[i] = x.flat[indices[i]], where indices lists
// the positions of the nonzero mask entries in row-major order of [B, S] (FlashAttention's
// unpad_input; the tokens of a row need not be contiguous, e.g. left padding works).
//
//   x         [B, S, ...]  any element type
//   mask      [B, S]       bool (DLPack code 6, 8 bits), int8, uint8, int32 or int64;
//                          nonzero = token
//   seqlens   cu_seqlens of the packed batch: sequence b has as many tokens as row b of `mask`;
//             no tail
//   x_packed  [total, ...] output, x's dtype and trailing dims
//   indices   [total]      output, int64, indices into the flattened [B * S]
//
// Returns InvalidArgument on a bad argument; on the CPU backend also when a mask row's token
// count differs from its cu_seqlens length. The CUDA backend trusts the counts (a mismatch
// leaves rows unwritten or writes only the first cu_seqlens[b+1] - cu_seqlens[b] tokens of a row).
absl::Status Unpad(const DLTensor& x, const DLTensor& mask, const Seqlens& seqlens,
                   const DLTensor& x_packed, const DLTensor& indices, Stream stream);

// Inverse of Unpad: x.flat[indices[i]] = x_packed[i], every other row of x set to zero bytes.
//
//   x_packed  [total, ...] any element type
//   indices   [total]      int64, distinct, each in [0, B * S)
//   x         [B, S, ...]  output, x_packed's dtype and trailing dims
//
// Returns InvalidArgument on a bad argument; on the CPU backend also for an index out of range.
// The CUDA backend skips out-of-range indices; duplicate indices are a race there.
absl::Status Pad(const DLTensor& x_packed, const DLTensor& indices, const DLTensor& x,
                 Stream stream);

// Host-side offsets of the aligned layout: cu_padded[b + 1] - cu_padded[b] is the length of
// sequence b rounded up to a multiple of `align` (a zero-length sequence stays empty).
// Returns InvalidArgument if `cu_seqlens` is not a valid cu_seqlens (see above), `align` < 1, or
// the padded total does not fit in int32.
absl::StatusOr<std::vector<int32_t>> AlignedCuSeqlens(absl::Span<const int32_t> cu_seqlens,
                                                      int64_t align);

// Re-lays a packed batch out so every sequence starts at a multiple of `align` rows (context
// parallelism, sequence parallelism and FP8 GEMMs need aligned segments), optionally followed by
// a tail up to `rows` rows (align_total_to). Pad slots and the tail are filled with `pad_value`
// converted to x's dtype (an integer dtype needs an integral value in range).
//
//   x_packed           [total, ...]        any element type
//   seqlens            real cu_seqlens; no tail
//   align              >= 1 (the plan's align_to)
//   rows               -1: total_padded = AlignedCuSeqlens(...).back() rows, no tail; else
//                      >= total_padded (the plan's MicroBatch::total): rows [total_padded, rows)
//                      are the tail
//   x_aligned          [rows, ...]         output, x_packed's dtype and trailing dims
//   cu_seqlens_padded  [B + 1]             output, int32: the padded offsets (the tail is not in
//                                          them: pass `rows` as Seqlens::rows to later calls)
//   seqused            [B]                 output, int32: the real length of each sequence
//
// Typical pad values: 0 (hidden states), the pad token id (input ids). Labels and positions of
// pad slots and the tail come from ShiftLabels (ignore_index) and PositionIds (the count
// continues in a pad slot, restarts at 0 in the tail) on the aligned layout.
absl::Status PackAligned(const DLTensor& x_packed, const Seqlens& seqlens, int64_t align,
                         int64_t rows, double pad_value, const DLTensor& x_aligned,
                         const DLTensor& cu_seqlens_padded, const DLTensor& seqused, Stream stream);

// Drops the pad slots and the tail of an aligned layout: x_packed rows of sequence b = the first
// (cu_seqlens[b+1] - cu_seqlens[b]) rows of its aligned segment.
//
//   x_aligned         [rows, ...]         any element type
//   seqlens           real cu_seqlens (total rows of x_packed); no tail
//   seqlens_padded    padded offsets (rows of x_aligned: total_padded, or its `rows` with a tail);
//                     every padded length must be >= the real length (any padding, not only a
//                     multiple of some align)
//   x_packed          [total, ...]        output, x_aligned's dtype and trailing dims
absl::Status UnpackAligned(const DLTensor& x_aligned, const Seqlens& seqlens,
                           const Seqlens& seqlens_padded, const DLTensor& x_packed, Stream stream);

// position_ids[t] = t - (start of t's segment), int64 [rows] (rows = cu_seqlens[B], or
// seqlens.rows). Pass the padded offsets for an aligned layout: pad slots then continue their
// sequence's count. Tail rows count from 0 again (t - cu_seqlens[B]).
absl::Status PositionIds(const Seqlens& seqlens, const DLTensor& position_ids, Stream stream);

// labels[t] = ids[t + 1] when t + 1 is a real token of t's sequence, else `ignore_index` (at
// each sequence's last real token, on every pad slot and on every tail row). Never reads across
// a boundary.
//
//   ids             [rows]  int32 or int64 token ids
//   seqlens         real cu_seqlens; for the packed layout rows = total (or seqlens.rows with a
//                   tail); with seqlens_padded: no tail
//   seqlens_padded  nullptr for the packed layout; for an aligned layout its padded offsets
//                   (rows = total_padded, or seqlens_padded->rows with a tail; padded lengths >=
//                   real lengths)
//   ignore_index    conventionally -100; must fit in ids' dtype
//   labels          [rows]  output, ids' dtype
absl::Status ShiftLabels(const DLTensor& ids, const Seqlens& seqlens, const Seqlens* seqlens_padded,
                         int64_t ignore_index, const DLTensor& labels, Stream stream);

// Per-token cross entropy over packed logits with already-shifted labels (ShiftLabels' output),
// and its per-sequence sums and counts:
//   per_token_loss[t]     = logsumexp(logits[t]) - logits[t, labels[t]], or 0 when
//                           labels[t] == ignore_index or t is a tail row (natural log, nats)
//   per_sequence_sum[b]   = sum of per_token_loss over rows of b (the stored, rounded values)
//   per_sequence_count[b] = number of rows of b whose label is not ignore_index
//
//   logits              [rows, V]  float16, bfloat16, float32 or float64; V >= 1
//   labels              [rows]     int32 or int64; ignore_index or in [0, V)
//   seqlens             cu_seqlens over the rows (real or padded offsets: pad slots carry
//                       ignore_index labels and so contribute nothing), seqlens.rows with a tail
//                       (tail labels are not read)
//   per_token_loss      [rows]     output, logits' dtype
//   per_sequence_sum    [B]        output, logits' dtype
//   per_sequence_count  [B]        output, int64
//
// float16/bfloat16/float32 accumulate in float32 (rounded once to the output dtype); float64
// accumulates in float64. Returns InvalidArgument on a bad argument; on the CPU backend also for
// a label outside [0, V) that is not ignore_index. The CUDA backend writes NaN for such a label.
absl::Status PackedCrossEntropy(const DLTensor& logits, const DLTensor& labels,
                                const Seqlens& seqlens, int64_t ignore_index,
                                const DLTensor& per_token_loss, const DLTensor& per_sequence_sum,
                                const DLTensor& per_sequence_count, Stream stream);

// True when this build contains the CUDA backend (it may still find no device at run time).
bool BuiltWithCuda();

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_KERNELS_H_
