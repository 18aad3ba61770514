#ifndef PACKSCHED_KERNELS_RECURRENT_H_
#define PACKSCHED_KERNELS_RECURRENT_H_

// Kernels of hybrid models' recurrent layers over packed and tree-packed rows (docs/design.md,
// "Hybrid layers"): the short causal depthwise convolution and the gated linear recurrence (the
// gated delta rule of Gated DeltaNet; without beta, the Mamba-2 selective scan's state update).
//
// One int32 array carries the layout, `prev_row` [T]: prev_row[t] is the row whose state row t
// continues, -1 for zero state. Flat packing: t - 1 inside a sequence, -1 at each sequence start
// (the cu_seqlens offsets). Tree packing: t - 1 inside a node, the parent node's last row at a
// node's first row, -1 at a root. Row t's token history is then t, prev_row[t],
// prev_row[prev_row[t]], ... (its rollout's earlier tokens, newest first), so both kernels equal
// running every rollout on its own. REQUIRES: -1 <= prev_row[t] < t (parents before children).
// Conventions of kernels.h apply (outputs caller-provided, a stream per call). The CPU backend
// checks every prev_row value; the CUDA backend (experimental: compiled, not yet run on a GPU)
// trusts them and takes a workspace of rows x heads x K x V doubles (two for the backward) from
// its device pool.

#include <cstdint>

#include "absl/status/status.h"
#include "dlpack/dlpack.h"
#include "packsched/kernels/kernels.h"

namespace packsched::kernels {

// pre[t, c] = bias[c] + sum_{i < W} weight[c, W - 1 - i] * x[r_i(t), c], r_0 = t,
// r_{i+1} = prev_row[r_i] (x = 0 once the history ends), out = silu(pre) if `silu` else pre:
// transformers' causal_conv1d (weight [C, 1, W] squeezed), windows never leaving the history.
//
//   x        [T, C]  float32 or float64
//   weight   [C, W]  x's dtype, 1 <= W <= 8
//   bias     [C]     x's dtype, or nullptr (0)
//   prev_row [T]     int32, see above
//   out      [T, C]  output, x's dtype
//
// Accumulates in float64. Returns InvalidArgument naming the argument on a bad shape, dtype or
// device, or (CPU) a prev_row value outside [-1, t) (naming the row).
absl::Status CausalConv1dForward(const DLTensor& x, const DLTensor& weight, const DLTensor* bias,
                                 const DLTensor& prev_row, bool silu, const DLTensor& out,
                                 Stream stream);

// The gradients of sum(d_out * out): dx [T, C], d_weight [C, W], d_bias [C] (nullptr when bias
// was nullptr); outputs in x's dtype. Errors as in the forward.
absl::Status CausalConv1dBackward(const DLTensor& x, const DLTensor& weight, const DLTensor* bias,
                                  const DLTensor& prev_row, bool silu, const DLTensor& d_out,
                                  const DLTensor& dx, const DLTensor& d_weight,
                                  const DLTensor* d_bias, Stream stream);

// Per head h, with S_{-1} = 0 (a K x V matrix) and S_in = S_{prev_row[t]} (0 for -1):
//   a = exp(g[t, h]);  Ŝ = a * S_in
//   with beta:   S_t = Ŝ + k_t (beta[t, h] (v_t - Ŝᵀ k_t))ᵀ      (the gated delta rule)
//   without:     S_t = Ŝ + k_t v_tᵀ                              (gated linear attention / SSD)
//   out_t = S_tᵀ q_t
// q and k are taken as given (scale and L2 normalisation are the caller's).
//
//   q, k     [T, H, K]  float32 or float64, 1 <= K <= 512
//   v        [T, H, V]  q's dtype, 1 <= V <= 512
//   g        [T, H]     q's dtype, the log decay (<= 0 in the models; not checked)
//   beta     [T, H]     q's dtype, or nullptr (no delta rule)
//   prev_row [T]        int32, see above
//   out      [T, H, V]  output, q's dtype
//
// Accumulates in float64. Errors as CausalConv1dForward's.
absl::Status GatedRecurrenceForward(const DLTensor& q, const DLTensor& k, const DLTensor& v,
                                    const DLTensor& g, const DLTensor* beta,
                                    const DLTensor& prev_row, const DLTensor& out, Stream stream);

// The gradients of sum(d_out * out): dq, dk, dv, dg and d_beta (nullptr without beta), each
// shaped as its input. The gradient of a branch point's state is the sum over its children.
// Recomputes the states (T x K x V doubles of host memory per head at a time). Errors as the
// forward's.
absl::Status GatedRecurrenceBackward(const DLTensor& q, const DLTensor& k, const DLTensor& v,
                                     const DLTensor& g, const DLTensor* beta,
                                     const DLTensor& prev_row, const DLTensor& d_out,
                                     const DLTensor& dq, const DLTensor& dk, const DLTensor& dv,
                                     const DLTensor& dg, const DLTensor* d_beta, Stream stream);

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_RECURRENT_H_
