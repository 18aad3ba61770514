#ifndef PACKSCHED_KERNELS_COMMON_RECURRENT_H_
#define PACKSCHED_KERNELS_COMMON_RECURRENT_H_

// Per-row math of the recurrent kernels (recurrent.h), for host and device: one convolution
// output, one step of the gated recurrence of one head and its backward. States are row-major
// K x V arrays of Acc; a null state stands for zero (a sequence start or a root).

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/common/macros.h"

namespace packsched::kernels::common {

template <typename Acc>
PACKSCHED_HD_INLINE Acc Sigmoid(Acc x) {
  return Acc(1) / (Acc(1) + exp(-x));
}

// pre = bias + sum_i w[W - 1 - i] * x[r_i]: the rows of the history, newest first (prev_row).
template <typename T, typename Acc>
PACKSCHED_HD_INLINE Acc ConvPre(const T* x, int64_t channels, int64_t c, const T* w, int width,
                                const T* bias, const int32_t* prev_row, int64_t t) {
  Acc pre = bias != nullptr ? Acc(bias[c]) : Acc(0);
  int64_t r = t;
  for (int i = 0; i < width && r >= 0; ++i, r = prev_row[r]) {
    pre += Acc(w[width - 1 - i]) * Acc(x[r * channels + c]);
  }
  return pre;
}

// d pre from d out: silu'(p) = s (1 + p (1 - s)), s = sigmoid(p).
template <typename Acc>
PACKSCHED_HD_INLINE Acc ConvDPre(Acc pre, Acc d_out, bool silu) {
  if (!silu) return d_out;
  const Acc s = Sigmoid(pre);
  return d_out * s * (Acc(1) + pre * (Acc(1) - s));
}

// Column j of one step (state columns evolve independently): s_in / s_out point at the column's
// first element, `stride` apart (the state's vd). With Ŝ = a s_in: δ = beta (v - Ŝᵀk) (has_beta)
// or v; s_out = Ŝ + k δ; returns out_j = s_outᵀ q. `s_in` may be null (zero); not aliasing s_out.
template <typename T, typename Acc>
PACKSCHED_HD_INLINE Acc RecurrenceColumn(const Acc* s_in, Acc* s_out, std::ptrdiff_t stride,
                                         const T* q, const T* k, Acc v, Acc a, bool has_beta,
                                         Acc beta, int kd) {
  Acc u = 0;  // (Ŝᵀk)_j
  if (s_in != nullptr && has_beta) {
    for (int i = 0; i < kd; ++i) u += a * s_in[i * stride] * Acc(k[i]);
  }
  const Acc delta = has_beta ? beta * (v - u) : v;
  Acc o = 0;
  for (int i = 0; i < kd; ++i) {
    const Acc s = (s_in != nullptr ? a * s_in[i * stride] : Acc(0)) + Acc(k[i]) * delta;
    s_out[i * stride] = s;
    o += s * Acc(q[i]);
  }
  return o;
}

// What the backward's row phase needs from column j.
template <typename Acc>
struct ColumnGrad {
  Acc delta;   // δ_j
  Acc du;      // d(Ŝᵀk)_j = -beta dδ_j (0 without beta)
  Acc dv;      // d v_j
  Acc d_beta;  // column j's share of d beta: dδ_j (v_j - u_j)
};

// The backward's column phase for column j (pointers as in RecurrenceColumn): ds, the gradient
// reaching s_out from later rows, becomes dS = ds + q do_j in place; ds_in (null: skipped) gets
// a (dS + k du_j), the gradient of s_in through this row.
template <typename T, typename Acc>
PACKSCHED_HD_INLINE ColumnGrad<Acc> RecurrenceColumnBackward(const Acc* s_in, std::ptrdiff_t stride,
                                                             const T* q, const T* k, Acc v, Acc a,
                                                             bool has_beta, Acc beta, Acc d_out,
                                                             int kd, Acc* ds, Acc* ds_in) {
  Acc u = 0, d_delta = 0;  // u = (Ŝᵀk)_j, dδ = (dSᵀk)_j
  for (int i = 0; i < kd; ++i) {
    if (s_in != nullptr && has_beta) u += a * s_in[i * stride] * Acc(k[i]);
    ds[i * stride] += Acc(q[i]) * d_out;
    d_delta += ds[i * stride] * Acc(k[i]);
  }
  ColumnGrad<Acc> c;
  c.delta = has_beta ? beta * (v - u) : v;
  c.du = has_beta ? -beta * d_delta : Acc(0);
  c.dv = has_beta ? beta * d_delta : d_delta;
  c.d_beta = has_beta ? d_delta * (v - u) : Acc(0);
  if (ds_in != nullptr) {
    for (int i = 0; i < kd; ++i) ds_in[i * stride] += a * (ds[i * stride] + Acc(k[i]) * c.du);
  }
  return c;
}

// The backward's row phase for row i of the state (s_in_row, s_row, ds_row: row i's vd entries,
// ds after the column phase; delta, du, d_out: per column). Returns dq_i = Σ_j S[i,j] do_j and
// dk_i = Σ_j dS[i,j] δ_j + Ŝ[i,j] du_j, and adds Σ_j dŜ[i,j] Ŝ[i,j] (row i's share of dg) to *dg.
template <typename Acc>
PACKSCHED_HD_INLINE void RecurrenceRowBackward(const Acc* s_in_row, const Acc* s_row,
                                               const Acc* ds_row, const Acc* delta, const Acc* du,
                                               const Acc* d_out, Acc k_i, Acc a, int vd, Acc* dq,
                                               Acc* dk, Acc* dg) {
  Acc q_acc = 0, k_acc = 0, g_acc = 0;
  for (int j = 0; j < vd; ++j) {
    const Acc s_hat = s_in_row != nullptr ? a * s_in_row[j] : Acc(0);
    q_acc += s_row[j] * d_out[j];
    k_acc += ds_row[j] * delta[j] + s_hat * du[j];
    g_acc += (ds_row[j] + k_i * du[j]) * s_hat;
  }
  *dq = q_acc;
  *dk = k_acc;
  *dg += g_acc;
}

}  // namespace packsched::kernels::common

#endif  // PACKSCHED_KERNELS_COMMON_RECURRENT_H_
