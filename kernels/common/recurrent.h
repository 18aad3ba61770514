#ifndef PACKSCHED_KERNELS_COMMON_RECURRENT_H_
#define PACKSCHED_KERNELS_COMMON_RECURRENT_H_

// Per-row math of the recurrent kernels (recurrent.h), for host and device: one convolution
// output, one step of the gated recurrence of one head and its backward. States are row-major
// K x V arrays of Acc; a null state stands for zero (a sequence start or a root).

#include <cmath>
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

// One step: s_out = Ŝ + k δᵀ with Ŝ = exp(g) s_in, δ = beta (v - Ŝᵀk) (has_beta) or v;
// out = s_outᵀ q. `s_in` may be null (zero); it may not alias s_out.
template <typename T, typename Acc>
PACKSCHED_HD_INLINE void RecurrenceStep(const Acc* s_in, Acc* s_out, const T* q, const T* k,
                                        const T* v, Acc g, bool has_beta, Acc beta, int kd, int vd,
                                        T* out) {
  const Acc a = exp(g);
  for (int j = 0; j < vd; ++j) {
    Acc u = 0;  // (Ŝᵀk)_j
    if (s_in != nullptr && has_beta) {
      for (int i = 0; i < kd; ++i) u += a * s_in[i * vd + j] * Acc(k[i]);
    }
    const Acc delta = has_beta ? beta * (Acc(v[j]) - u) : Acc(v[j]);
    Acc o = 0;
    for (int i = 0; i < kd; ++i) {
      const Acc s = (s_in != nullptr ? a * s_in[i * vd + j] : Acc(0)) + Acc(k[i]) * delta;
      s_out[i * vd + j] = s;
      o += s * Acc(q[i]);
    }
    out[j] = T(o);
  }
}

// The backward of RecurrenceStep. In: the step's inputs, its state s (= s_out) and ds, the
// gradient reaching s from later rows (updated in place to ds + q doᵀ). Out: dq, dk, dv (Acc [kd],
// [kd], [vd]), *dg, *d_beta, and ds_in += exp(g) dŜ (skipped when s_in is null).
template <typename T, typename Acc>
PACKSCHED_HD_INLINE void RecurrenceStepBackward(const Acc* s_in, const Acc* s, const T* q,
                                                const T* k, const T* v, Acc g, bool has_beta,
                                                Acc beta, const T* d_out, int kd, int vd, Acc* ds,
                                                Acc* ds_in, Acc* dq, Acc* dk, Acc* dv, Acc* dg,
                                                Acc* d_beta) {
  const Acc a = exp(g);
  for (int i = 0; i < kd; ++i) {
    Acc acc = 0;  // dq = S do
    for (int j = 0; j < vd; ++j) {
      acc += s[i * vd + j] * Acc(d_out[j]);
      ds[i * vd + j] += Acc(q[i]) * Acc(d_out[j]);
    }
    dq[i] = acc;
    dk[i] = 0;
  }
  Acc sum_dg = 0, sum_db = 0;
  for (int j = 0; j < vd; ++j) {
    Acc u = 0, d_delta = 0;  // u = (Ŝᵀk)_j, dδ = (dSᵀk)_j
    for (int i = 0; i < kd; ++i) {
      if (s_in != nullptr && has_beta) u += a * s_in[i * vd + j] * Acc(k[i]);
      d_delta += ds[i * vd + j] * Acc(k[i]);
    }
    const Acc delta = has_beta ? beta * (Acc(v[j]) - u) : Acc(v[j]);
    const Acc du = has_beta ? -beta * d_delta : Acc(0);
    dv[j] = has_beta ? beta * d_delta : d_delta;
    if (has_beta) sum_db += d_delta * (Acc(v[j]) - u);
    for (int i = 0; i < kd; ++i) {
      const Acc s_hat = s_in != nullptr ? a * s_in[i * vd + j] : Acc(0);
      const Acc d_hat = ds[i * vd + j] + Acc(k[i]) * du;  // dŜ
      dk[i] += ds[i * vd + j] * delta + s_hat * du;
      sum_dg += d_hat * s_hat;
      if (ds_in != nullptr) ds_in[i * vd + j] += a * d_hat;
    }
  }
  *dg = sum_dg;
  *d_beta = sum_db;
}

}  // namespace packsched::kernels::common

#endif  // PACKSCHED_KERNELS_COMMON_RECURRENT_H_
