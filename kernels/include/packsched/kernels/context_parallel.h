#ifndef PACKSCHED_KERNELS_CONTEXT_PARALLEL_H_
#define PACKSCHED_KERNELS_CONTEXT_PARALLEL_H_

// Context parallelism (CP) and multimodal positions over packed micro-batches: the head-tail
// shard of a CP rank and its inverse, and Qwen2-VL-style 3-D rotary position ids. Conventions
// (DLPack views, caller-provided outputs, host metadata, no device sync, errors) are kernels.h's.
// See docs/design.md §4 (context parallelism, multimodal positions).
//
// Head-tail layout: with `cp` ranks, every sequence of the micro-batch (aligned offsets, each
// length a multiple of 2 * cp, e.g. the plan's cu_seqlens_aligned with align_to = 2 * cp * tp) is
// cut into 2 * cp equal chunks; rank c holds, for every sequence in order, chunk c followed by
// chunk 2 * cp - 1 - c. Its shard has total / cp rows; its local offsets are cu_seqlens / cp.

#include <cstdint>

#include "absl/status/status.h"
#include "dlpack/dlpack.h"
#include "packsched/kernels/kernels.h"

namespace packsched::kernels {

// shard = CP rank `rank`'s rows of x under the head-tail layout.
//
//   x        [total, ...]       any element type (rows are dimension 0)
//   seqlens  the aligned offsets of x: every length a multiple of 2 * cp; no tail
//   cp       >= 1; rank in [0, cp)
//   shard    [total / cp, ...]  output, x's dtype and trailing dims
//
// InvalidArgument on a bad argument, including a sequence length that is not a multiple of
// 2 * cp (checked on the host copy of the offsets, so on every backend).
absl::Status CpShard(const DLTensor& x, const Seqlens& seqlens, int64_t cp, int64_t rank,
                     const DLTensor& shard, Stream stream);

// The inverse for one rank: writes rank's rows of x from its shard (and no other row), so calling
// it for every rank in [0, cp) rebuilds x exactly. Arguments as CpShard's, with x the output.
absl::Status CpUnshard(const DLTensor& shard, const Seqlens& seqlens, int64_t cp, int64_t rank,
                       const DLTensor& x, Stream stream);

// 3-D rotary position ids (Qwen2-VL's "mrope", the rule of Hugging Face transformers'
// get_rope_index) of a packed micro-batch, restarting at 0 in every sequence; boundaries come
// from `seqlens` only, never from the positions.
//
//   token_types   [rows]      int32: 0 = text, nonzero = vision (image or video) token
//   seqlens       the micro-batch's offsets (real or padded: pad slots must be typed 0, text, and
//                 then continue their sequence's count); Seqlens::rows declares a tail, whose
//                 positions restart at 0 as text
//   grid_thw      [N, 3]      int32: the (t, h, w) patch grid of every image or video, in order
//                 of appearance over the micro-batch
//   grid_seqlens  offsets into grid_thw: sequence b owns grids [grid_cu[b], grid_cu[b + 1]); its
//                 B must be seqlens' B and its last value N; no tail
//   spatial_merge_size  >= 1 (Qwen2-VL: 2): a grid of (t, h, w) covers t * (h / m) * (w / m)
//                 tokens
//   position_ids  [3, rows]   output, int64: row 0 temporal, 1 height, 2 width
//
// In each sequence a text token takes position p on all three rows and the next one p + 1; a run
// of vision tokens takes the sequence's next grid: token k of a grid (t, h', w') placed at p gets
// (p + k / (h' w'), p + (k / w') % h', p + k % w'), and the text after it starts at p + max(t, h',
// w') (kernels/common/context_parallel.h). A text-only sequence gets 0, 1, 2, ... on every row.
//
// InvalidArgument on a bad argument; on the CPU backend also when the token types and the grids
// disagree (a grid past the sequence end or over a text token, grids missing or left over, h or
// w not a positive multiple of the merge size). The CUDA backend writes -1 from the first such
// token of that sequence on.
absl::Status MropePositionIds(const DLTensor& token_types, const Seqlens& seqlens,
                              const DLTensor& grid_thw, const Seqlens& grid_seqlens,
                              int64_t spatial_merge_size, const DLTensor& position_ids,
                              Stream stream);

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_CONTEXT_PARALLEL_H_
