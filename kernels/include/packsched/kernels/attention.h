#ifndef PACKSCHED_KERNELS_ATTENTION_H_
#define PACKSCHED_KERNELS_ATTENTION_H_

// Varlen (packed) attention, forward and backward, with FlashAttention's varlen semantics so a
// trainer can swap it for flash_attn_varlen_func. Conventions of kernels.h apply: DLPack views,
// compact row-major, caller-provided outputs, one stream per call, host metadata passed in.
//
// Per sequence b (B sequences):
//   queries are rows [cu_seqlens_q[b], cu_seqlens_q[b] + sq) of q, keys and values rows
//   [cu_seqlens_k[b], cu_seqlens_k[b] + sk) of k and v, where sq = seqused_q[b] (or the whole
//   segment length cu_seqlens_q[b+1] - cu_seqlens_q[b] without seqused_q), likewise sk. Rows of a
//   segment beyond its seqused length are pad slots (PackAligned's layout): they are never keys,
//   and as queries they see no key.
//
//   Query i (0-based within its sequence) sees key j (0 <= j < sk) iff, with off = sk - sq
//   (bottom-right alignment):
//     causal:              j <= i + off
//     window_left >= 0:    j >= i + off - window_left
//     window_right >= 0:   j <= i + off + window_right
//   (causal together with a window is the window with window_right = min(window_right, 0)).
//   As in FlashAttention's varlen API, a window side >= max_seqlen_k counts as -1 (unbounded)
//   before the rule above applies. On the left this changes nothing; on the right it lets a
//   non-causal sequence with sq > sk see all its keys from every row: with sq = 4, sk = 2,
//   max_seqlen_k = 2 and window (-1, 2), query 0 sees both keys, not only key 0.
//
//   s_ij  = softmax_scale * (q_i . k_j), capped to softcap * tanh(s_ij / softcap) when softcap > 0
//   lse_i = log(sum over visible j of exp(s_ij))     (natural log; the scale and cap included)
//   out_i = sum over visible j of exp(s_ij - lse_i) v_j
//   A query that sees no key (including every pad slot) gets out_i = 0 and lse_i = +inf.
//
//   Tail (kernels.h): rows of q beyond cu_seqlens_q[B] (declared by seqlens.q.rows) and of k, v
//   beyond cu_seqlens_k[B] (seqlens.k.rows) belong to no sequence: they are never keys, and as
//   queries they see no key (out = 0, lse = +inf); the backward writes 0 to their dq, dk, dv.
//
//   Tree packing (docs/design.md, "Tree packing"): with seqlens.subtree_end, each sequence is a
//   piece of a forest (nodes in depth-first preorder, rows of the same rollout prefix shared),
//   and query row i sees key row j of the same sequence iff
//     j <= i  &&  i < subtree_end[j]      (j's node is i's node or one of its ancestors)
//     window_left >= 0:    positions[i] - positions[j] <= window_left
//   (positions[t] = the depth of row t: its index within every rollout through it). This equals
//   running each rollout on its own with causal attention; a flat sequence (subtree_end[j] = the
//   end of the sequence for every j) is plain causal attention. A tree needs causal = true and
//   the self-attention layout: q and k have the same rows and cu_seqlens (and seqused, when
//   given); window_right changes nothing there (causal). Softcap, GQA, pad slots and the tail
//   as without a tree.
//
//   GQA/MQA: q has H heads, k and v Hk heads, H % Hk == 0; query head h reads kv head
//   h / (H / Hk). The backward sums dk and dv over each group of H / Hk query heads.
//
// Dtypes: q, k, v, out (and dout, dq, dk, dv) share one dtype: float16, bfloat16 or float32; the
// CPU backend also float64. Products accumulate in float32 (float64 for float64); lse is float32
// (float64 for float64 inputs). Head dim D: a multiple of 8 in [8, 256] (the CUDA backend pads it
// up to 64, 128 or 256 internally).
//
// The CPU backend runs the tiled FlashAttention-2 algorithm (query tiles x key tiles, running max
// and sum; the backward recomputes the probabilities from lse) on a few threads. Both backends'
// backward passes are deterministic: the same inputs give bitwise the same dq, dk, dv on every
// call (no atomics; on the CPU independent of the thread count).

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "dlpack/dlpack.h"
#include "packsched/kernels/kernels.h"

namespace packsched::kernels {

// The sequence layout of one attention call.
struct AttentionSeqlens {
  // int32 [B + 1] each (the same B): the segment offsets of the query rows and of the key/value
  // rows. For PackAligned's layout these are the padded offsets, with `rows` = the plan's total
  // when the layout has a tail.
  Seqlens q;
  Seqlens k;
  // Host integers (from the plan): at least the longest segment of q resp. k (checked); they size
  // the CUDA launch grid.
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;
  // Optional int32 [B] on the call's device: the real lengths, each in [0, segment length]
  // (checked on the CPU backend; the CUDA backend clamps them into that range). nullptr: the whole
  // segment is real.
  const DLTensor* seqused_q = nullptr;
  const DLTensor* seqused_k = nullptr;
  // Tree packing (see above), or nullptr: no tree.
  //   subtree_end: int32 [tk] on the call's device: one past the last row of the subtree of the
  //     row's node, a row index of the call (the index space of cu_seqlens). For every real row
  //     t of sequence b: t < subtree_end[t] <= cu_seqlens[b] + (seqused[b] or the segment
  //     length). Pad-slot and tail rows are not read.
  //   positions: int32 [tq] on the call's device: each real row's depth, in [0, its index in the
  //     sequence]; required with a tree and a left window (after the max_seqlen_k rule), read
  //     only then.
  // The value ranges are checked on the CPU backend; the CUDA backend trusts them (an
  // out-of-range subtree_end changes which keys a row sees, never what memory it reads).
  const DLTensor* subtree_end = nullptr;  // int32 [tk]
  const DLTensor* positions = nullptr;    // int32 [tq], needed with a tree and a left window
  // Query-row map (context parallelism: a CP rank computes only the queries it holds), or
  // nullptr: every row. int32 [nq] in host memory, strictly ascending rows of q in [0, tq). Only
  // these rows are computed as queries; every other row of q is written as a query that sees no
  // key (out = 0, lse = +inf, dq = 0) but stays a key. The mapped rows' out, lse and dq are
  // bitwise those of the call without the map, and dk, dv are the mapped rows' share: bitwise
  // the call's without the map when dout is 0 on every other row (the other rows' lse, out and
  // dout do not change the gradients; on CUDA their dout must be finite). In host memory on both
  // backends (a CPU tensor; on CUDA also pinned host memory; InvalidArgument on device memory);
  // the CUDA backend copies the map's runs to the device (stream-ordered, from pageable memory).
  // q, out, dout, dq and lse keep all tq rows.
  const DLTensor* query_rows = nullptr;  // int32 [nq], host
};

struct AttentionOptions {
  // Multiplies q . k; default D^-0.5. Must be finite as a float32 (|scale| <= FLT_MAX): the
  // kernels compute in float.
  std::optional<double> softmax_scale;
  bool causal = false;
  // Sliding window (left, right) in keys around the aligned diagonal; -1 = unbounded. Each >= -1;
  // any larger value is allowed, and a side >= max_seqlen_k is unbounded (see above).
  int64_t window_left = -1;
  int64_t window_right = -1;
  // > 0 caps the scores to softcap * tanh(s / softcap); 0 = off. Otherwise a normal positive
  // float32: in [FLT_MIN, FLT_MAX] (a subnormal cap would round to 0 and silently turn capping
  // off).
  double softcap = 0.0;
  // CPU backend: worker threads; 0 = std::thread::hardware_concurrency(). Results do not depend on
  // it. Ignored by the CUDA backend.
  int num_threads = 0;
};

// out = attention(q, k, v) and its log-sum-exp, as defined above.
//
//   q    [tq, H, D]    tq = cu_seqlens_q[B] (or seqlens.q.rows: a tail)
//   k    [tk, Hk, D]   tk = cu_seqlens_k[B] (or seqlens.k.rows: a tail), q's dtype
//   v    [tk, Hk, D]   q's dtype
//   out  [tq, H, D]    output, q's dtype (pad-slot and tail rows written as 0)
//   lse  [H, tq]       output, float32 (float64 for float64 q), natural log
//
// Returns InvalidArgument naming the argument for a bad dtype, shape, device, head count,
// head dim, cu_seqlens, max_seqlen, seqused (value checks on the CPU backend only), window,
// softcap or softmax_scale, subtree_end or positions (a tree without causal, without the
// self-attention layout, or with out-of-range values on the CPU backend; a left window without
// positions), for float64 CUDA tensors, and for CUDA calls beyond the launch grid:
// more than 65535 sequences (B) or query heads (H), or a max_seqlen above 2^31 - 1;
// Unimplemented / FailedPrecondition / Internal as described in kernels.h. Nothing is written when
// validation fails.
absl::Status VarlenAttentionForward(const DLTensor& q, const DLTensor& k, const DLTensor& v,
                                    const AttentionSeqlens& seqlens,
                                    const AttentionOptions& options, const DLTensor& out,
                                    const DLTensor& lse, Stream stream);

// Gradients of sum(dout * out) with respect to q, k and v, for the out and lse that
// VarlenAttentionForward returned for the same q, k, v, seqlens and options (the probabilities
// are recomputed from lse). Shapes and dtypes as in the forward; dout, dq: [tq, H, D];
// dk, dv: [tk, Hk, D] (summed over each GQA group). Pad-slot and tail rows of dq, dk, dv are
// written as 0.
// Deterministic. Errors as in the forward.
absl::Status VarlenAttentionBackward(const DLTensor& dout, const DLTensor& q, const DLTensor& k,
                                     const DLTensor& v, const DLTensor& out, const DLTensor& lse,
                                     const AttentionSeqlens& seqlens,
                                     const AttentionOptions& options, const DLTensor& dq,
                                     const DLTensor& dk, const DLTensor& dv, Stream stream);

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_ATTENTION_H_
