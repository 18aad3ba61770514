#ifndef PACKSCHED_TESTS_KERNELS_ATTENTION_REFERENCE_H_
#define PACKSCHED_TESTS_KERNELS_ATTENTION_REFERENCE_H_

// The attention tests' fixtures: a packed (optionally padded) problem with random inputs, a naive
// quadratic reference written from the definition in attention.h (no code shared with the
// kernels), and the tolerance rule of docs/design.md §4.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/half.h"
#include "packsched/kernels/attention.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels::testing {

// B sequences: real lengths plus optional pad slots after them (the aligned layout, passed with
// seqused); H query heads, Hk kv heads, head dim D.
struct Problem {
  std::vector<int32_t> len_q, len_k;
  std::vector<int32_t> pad_q, pad_k;  // empty: no pad slots and no seqused
  // Rows after the last segment of q resp. k (the align_total_to tail, Seqlens::rows).
  int64_t tail_q = 0, tail_k = 0;
  int64_t heads = 2, kv_heads = 1, head_dim = 64;
  AttentionOptions options;
  // The max_seqlen_k passed to the kernels; -1: the longest key segment.
  int64_t max_seqlen_k = -1;
  // Tree packing (attention.h): per row of the self-attention layout, or empty: no tree.
  std::vector<int32_t> subtree_end, positions;

  bool tree() const { return !subtree_end.empty(); }

  int64_t batch() const { return static_cast<int64_t>(len_q.size()); }
  bool padded() const { return !pad_q.empty(); }
  std::vector<int32_t> Segments(bool q) const {
    std::vector<int32_t> seg = q ? len_q : len_k;
    const std::vector<int32_t>& pad = q ? pad_q : pad_k;
    for (size_t b = 0; b < seg.size() && !pad.empty(); ++b) seg[b] += pad[b];
    return seg;
  }
  std::vector<int32_t> CuQ() const { return CuSeqlens(Segments(true)); }
  std::vector<int32_t> CuK() const { return CuSeqlens(Segments(false)); }
  int64_t RowsQ() const { return CuQ().back() + tail_q; }
  int64_t RowsK() const { return CuK().back() + tail_k; }
  double Scale() const {
    return options.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
  }
  int64_t MaxSeqlenK() const {
    if (max_seqlen_k >= 0) return max_seqlen_k;
    const std::vector<int32_t> seg = Segments(false);
    return seg.empty() ? 0 : *std::max_element(seg.begin(), seg.end());
  }
  // attention.h: a window side >= max_seqlen_k is unbounded (FlashAttention's varlen rule).
  int64_t WindowLeft() const {
    return options.window_left >= MaxSeqlenK() ? -1 : options.window_left;
  }
  int64_t WindowRight() const {
    return options.window_right >= MaxSeqlenK() ? -1 : options.window_right;
  }
};

// Values of q, k, v, dout as doubles ([rows, heads, D] row-major); pad and tail rows hold NaN.
struct Inputs {
  std::vector<double> q, k, v, dout;
};

// Full-size outputs; pad and tail rows are 0 (lse +inf) as the contract requires.
struct Outputs {
  std::vector<double> out, lse, dq, dk, dv;
};

// Random inputs already representable in T (rounded through T), NaN in pad slots and the tail.
template <typename T>
Inputs RandomInputs(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](const std::vector<int32_t>& cu, const std::vector<int32_t>& len, int64_t heads,
                  int64_t rows) {
    std::vector<double> x(static_cast<size_t>(rows) * heads * p.head_dim,
                          std::numeric_limits<double>::quiet_NaN());
    for (int64_t b = 0; b < p.batch(); ++b) {
      for (int64_t t = cu[b]; t < cu[b + 1]; ++t) {
        const bool real = t - cu[b] < len[b];
        for (int64_t i = 0; i < heads * p.head_dim; ++i) {
          x[t * heads * p.head_dim + i] =
              real ? static_cast<double>(ToAcc(FromAcc<T>(static_cast<Acc<T>>(normal(rng)))))
                   : std::numeric_limits<double>::quiet_NaN();
        }
      }
    }
    return x;
  };
  Inputs in;
  in.q = fill(p.CuQ(), p.len_q, p.heads, p.RowsQ());
  in.k = fill(p.CuK(), p.len_k, p.kv_heads, p.RowsK());
  in.v = fill(p.CuK(), p.len_k, p.kv_heads, p.RowsK());
  in.dout = fill(p.CuQ(), p.len_q, p.heads, p.RowsQ());
  return in;
}

// Naive attention and its gradients in arithmetic type R. `round` is applied to P before P·V and
// to every output (identity for the float64 reference; rounding to the kernel's dtype for the
// "naive reference in the kernel's dtype" of the tolerance rule).
template <typename R>
Outputs NaiveAttention(const Problem& p, const Inputs& in,
                       const std::function<double(double)>& round) {
  const std::vector<int32_t> cu_q = p.CuQ(), cu_k = p.CuK();
  const int64_t H = p.heads, Hk = p.kv_heads, D = p.head_dim, tq = p.RowsQ(), tk = p.RowsK();
  const R scale = static_cast<R>(p.Scale());
  const R cap = static_cast<R>(p.options.softcap);
  const AttentionOptions& o = p.options;
  Outputs r;
  r.out.assign(tq * H * D, 0.0);
  r.lse.assign(H * tq, std::numeric_limits<double>::infinity());
  r.dq.assign(tq * H * D, 0.0);
  r.dk.assign(tk * Hk * D, 0.0);
  r.dv.assign(tk * Hk * D, 0.0);
  std::vector<R> dk(tk * Hk * D, 0), dv(tk * Hk * D, 0);
  for (int64_t b = 0; b < p.batch(); ++b) {
    const int64_t sq = p.len_q[b], sk = p.len_k[b];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hk);
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t qi = ((cu_q[b] + i) * H + h) * D;
        const int64_t diag = i + sk - sq;
        // In __int128: windows may be as large as INT64_MAX.
        const __int128 left = p.WindowLeft(), right = p.WindowRight();
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < sk; ++j) {
          if (o.causal && j > diag) continue;
          if (p.tree()) {
            const int64_t qi_row = cu_q[b] + i, kj_row = cu_k[b] + j;
            if (qi_row >= p.subtree_end[kj_row]) continue;
            if (left >= 0 && p.positions[qi_row] - p.positions[kj_row] > left) continue;
            keys.push_back(j);
            continue;
          }
          if (left >= 0 && j < diag - left) continue;
          if (right >= 0 && j > diag + right) continue;
          keys.push_back(j);
        }
        if (keys.empty()) continue;
        auto kv_at = [&](int64_t j) { return ((cu_k[b] + j) * Hk + hk) * D; };
        std::vector<R> s(keys.size()), dscore(keys.size());
        R m = -std::numeric_limits<R>::infinity();
        for (size_t n = 0; n < keys.size(); ++n) {
          R dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += static_cast<R>(in.q[qi + d]) * static_cast<R>(in.k[kv_at(keys[n]) + d]);
          }
          R x = dot * scale;
          dscore[n] = scale;
          if (cap > 0) {
            const R t = std::tanh(x / cap);
            x = cap * t;
            dscore[n] = scale * (1 - t * t);
          }
          s[n] = x;
          m = std::max(m, x);
        }
        R l = 0;
        for (R x : s) l += std::exp(x - m);
        r.lse[h * tq + cu_q[b] + i] = static_cast<double>(m + std::log(l));
        std::vector<R> P(keys.size());
        for (size_t n = 0; n < keys.size(); ++n) {
          P[n] = static_cast<R>(round(static_cast<double>(std::exp(s[n] - m) / l)));
        }
        std::vector<R> out(D, 0);
        for (size_t n = 0; n < keys.size(); ++n) {
          for (int64_t d = 0; d < D; ++d) out[d] += P[n] * static_cast<R>(in.v[kv_at(keys[n]) + d]);
        }
        for (int64_t d = 0; d < D; ++d) r.out[qi + d] = round(static_cast<double>(out[d]));
        // Backward: dP = dout·v, D_i = sum_j P dP, dS = P (dP - D_i), through the cap and scale.
        std::vector<R> dp(keys.size(), 0);
        R d_row = 0;
        for (size_t n = 0; n < keys.size(); ++n) {
          for (int64_t d = 0; d < D; ++d) {
            dp[n] += static_cast<R>(in.dout[qi + d]) * static_cast<R>(in.v[kv_at(keys[n]) + d]);
          }
          d_row += P[n] * dp[n];
        }
        std::vector<R> dq(D, 0);
        for (size_t n = 0; n < keys.size(); ++n) {
          const R ds = P[n] * (dp[n] - d_row) * dscore[n];
          const int64_t kj = kv_at(keys[n]);
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += ds * static_cast<R>(in.k[kj + d]);
            dk[kj + d] += ds * static_cast<R>(in.q[qi + d]);
            dv[kj + d] += P[n] * static_cast<R>(in.dout[qi + d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) r.dq[qi + d] = round(static_cast<double>(dq[d]));
      }
    }
  }
  for (size_t i = 0; i < dk.size(); ++i) {
    r.dk[i] = round(static_cast<double>(dk[i]));
    r.dv[i] = round(static_cast<double>(dv[i]));
  }
  return r;
}

template <typename T>
double RoundTo(double x) {
  return static_cast<double>(ToAcc(FromAcc<T>(static_cast<Acc<T>>(x))));
}

// Max |a - ref| over entries where ref is finite; infinite entries must be equal (+inf lse rows).
inline double MaxError(const std::vector<double>& a, const std::vector<double>& ref,
                       const char* what) {
  EXPECT_EQ(a.size(), ref.size()) << what;
  double err = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_EQ(a[i], ref[i]) << what << "[" << i << "] must be " << ref[i];
      continue;
    }
    if (std::isnan(a[i])) {
      ADD_FAILURE() << what << "[" << i << "] is NaN";
      return std::numeric_limits<double>::infinity();
    }
    err = std::max(err, std::abs(a[i] - ref[i]));
  }
  return err;
}

// docs/design.md §4: |kernel - fp64 ref| <= factor x |naive ref in dtype - fp64 ref| + atol.
inline void ExpectWithinTolerance(const std::vector<double>& kernel,
                                  const std::vector<double>& naive, const std::vector<double>& ref,
                                  double factor, const char* what, double atol = 1e-6) {
  const double kernel_err = MaxError(kernel, ref, what);
  const double naive_err = MaxError(naive, ref, what);
  EXPECT_LE(kernel_err, factor * naive_err + atol)
      << what << ": kernel error " << kernel_err << ", naive error " << naive_err;
}

// The gradients' atol. Kernels take D = dO·O from a pre-pass (FlashAttention's) and dP = dO·V
// from the products, two float32 sums in different orders; where every visible row sees one key
// only (dS exactly 0, and exactly 0 in the naive reference, whose D is its own sum of P dP), their
// difference leaves dq and dk at float32 noise: up to 3.0e-6 seen over random problems.
inline constexpr double kGradientAtol = 1e-5;

// A problem of the given query and key lengths (the other fields at their defaults).
inline Problem MakeProblem(std::vector<int32_t> len_q, std::vector<int32_t> len_k,
                           bool causal = false) {
  Problem p;
  p.len_q = std::move(len_q);
  p.len_k = std::move(len_k);
  p.options.causal = causal;
  return p;
}

// The align_total_to tail cases shared by the CPU and CUDA tests: padded causal segments (one
// empty) with `tail_q` query and 5 key rows past cu[B]; and a layout that is all tail (B = 0).
inline Problem TailProblem(int64_t tail_q) {
  Problem p = MakeProblem({97, 0, 40}, {60, 13, 128}, true);
  p.pad_q = {3, 8, 0};
  p.pad_k = {4, 3, 0};
  p.tail_q = tail_q;
  p.tail_k = 5;
  return p;
}
// A problem over a packed forest (tree_forest.h): one causal self-attention sequence per piece.
inline Problem TreeProblem(const std::vector<int32_t>& cu, const std::vector<int32_t>& subtree_end,
                           const std::vector<int32_t>& positions) {
  std::vector<int32_t> len;
  for (size_t b = 0; b + 1 < cu.size(); ++b) len.push_back(cu[b + 1] - cu[b]);
  Problem p = MakeProblem(len, len, true);
  p.subtree_end = subtree_end;
  p.positions = positions;
  return p;
}

inline Problem OnlyTailProblem() {
  Problem p = MakeProblem({}, {});
  p.tail_q = 3;
  p.tail_k = 3;
  return p;
}

// The tolerance rule applied to a backend's results in dtype T: out and lse within 2x, the
// gradients within 3x, the error of the naive reference computed in T (float64: the reference
// itself). `prefix` starts each check's name ("cuda " gives "cuda out", ...).
template <typename T>
void ExpectMatchesReference(const Problem& p, const Inputs& in, const Outputs& got,
                            const std::string& prefix = "") {
  const Outputs ref = NaiveAttention<double>(p, in, [](double x) { return x; });
  const Outputs naive = std::is_same_v<T, double> ? ref : NaiveAttention<float>(p, in, RoundTo<T>);
  ExpectWithinTolerance(got.out, naive.out, ref.out, 2, (prefix + "out").c_str());
  ExpectWithinTolerance(got.lse, naive.lse, ref.lse, 2, (prefix + "lse").c_str());
  ExpectWithinTolerance(got.dq, naive.dq, ref.dq, 3, (prefix + "dq").c_str(), kGradientAtol);
  ExpectWithinTolerance(got.dk, naive.dk, ref.dk, 3, (prefix + "dk").c_str(), kGradientAtol);
  ExpectWithinTolerance(got.dv, naive.dv, ref.dv, 3, (prefix + "dv").c_str(), kGradientAtol);
}

// Host tensors of one problem in dtype T, with the kernels' outputs.
template <typename T>
struct AttentionTensors {
  AttentionTensors(const Problem& p, const Inputs& in)
      : cu_q_values(p.CuQ()),
        cu_k_values(p.CuK()),
        q(Make(in.q, {p.RowsQ(), p.heads, p.head_dim})),
        k(Make(in.k, {p.RowsK(), p.kv_heads, p.head_dim})),
        v(Make(in.v, {p.RowsK(), p.kv_heads, p.head_dim})),
        dout(Make(in.dout, {p.RowsQ(), p.heads, p.head_dim})),
        out(Make(in.q, {p.RowsQ(), p.heads, p.head_dim})),
        lse(std::vector<int64_t>{p.heads, p.RowsQ()},
            DLDataType{kDLFloat, static_cast<uint8_t>(sizeof(Acc<T>) * 8), 1}),
        dq(Make(in.q, {p.RowsQ(), p.heads, p.head_dim})),
        dk(Make(in.k, {p.RowsK(), p.kv_heads, p.head_dim})),
        dv(Make(in.v, {p.RowsK(), p.kv_heads, p.head_dim})),
        cu_q(CuTensor(cu_q_values)),
        cu_k(CuTensor(cu_k_values)),
        seqused_q(HostTensor::Of<int32_t>({p.batch()}, p.len_q)),
        seqused_k(HostTensor::Of<int32_t>({p.batch()}, p.len_k)),
        subtree_end(
            HostTensor::Of<int32_t>({static_cast<int64_t>(p.subtree_end.size())}, p.subtree_end)),
        positions(
            HostTensor::Of<int32_t>({static_cast<int64_t>(p.positions.size())}, p.positions)) {
    if (p.tree()) seqlens.subtree_end = &subtree_end.view();
    if (!p.positions.empty()) seqlens.positions = &positions.view();
    seqlens.q = {&cu_q.view(), {}, p.tail_q > 0 ? p.RowsQ() : -1};
    seqlens.k = {&cu_k.view(), {}, p.tail_k > 0 ? p.RowsK() : -1};
    for (size_t b = 0; b + 1 < cu_q_values.size(); ++b) {
      seqlens.max_seqlen_q =
          std::max<int64_t>(seqlens.max_seqlen_q, cu_q_values[b + 1] - cu_q_values[b]);
      seqlens.max_seqlen_k =
          std::max<int64_t>(seqlens.max_seqlen_k, cu_k_values[b + 1] - cu_k_values[b]);
    }
    if (p.max_seqlen_k >= 0) seqlens.max_seqlen_k = p.max_seqlen_k;
    if (p.padded()) {
      seqlens.seqused_q = &seqused_q.view();
      seqlens.seqused_k = &seqused_k.view();
    }
  }

  // Filled with the inputs' values (NaN in pads) so unwritten output rows show up.
  static HostTensor Make(const std::vector<double>& values, std::vector<int64_t> shape) {
    HostTensor t(std::move(shape), DTypeOf<T>());
    T* data = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      data[i] = FromAcc<T>(static_cast<Acc<T>>(values.empty() ? 0.0 : values[i]));
    }
    return t;
  }
  static std::vector<double> Values(const HostTensor& t) {
    std::vector<double> out(t.numel());
    const std::vector<T> v = t.values<T>();
    for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(ToAcc(v[i]));
    return out;
  }
  absl::Status Forward(const AttentionOptions& o) {
    return VarlenAttentionForward(q.view(), k.view(), v.view(), seqlens, o, out.view(), lse.view(),
                                  nullptr);
  }
  absl::Status Backward(const AttentionOptions& o) {
    return VarlenAttentionBackward(dout.view(), q.view(), k.view(), v.view(), out.view(),
                                   lse.view(), seqlens, o, dq.view(), dk.view(), dv.view(),
                                   nullptr);
  }
  Outputs Results() const {
    Outputs r{Values(out), {}, Values(dq), Values(dk), Values(dv)};
    const std::vector<Acc<T>> l = lse.values<Acc<T>>();
    r.lse.assign(l.begin(), l.end());
    return r;
  }

  std::vector<int32_t> cu_q_values, cu_k_values;
  HostTensor q, k, v, dout, out, lse, dq, dk, dv, cu_q, cu_k, seqused_q, seqused_k, subtree_end,
      positions;
  AttentionSeqlens seqlens;
};

// Scales the keys by 1 + j / 4 at position j of their sequence (rounded back to T), so that each
// query row's largest score keeps rising from key tile to key tile: an online softmax has to
// rescale its output after it has accumulated, and one that never did would overflow.
template <typename T>
void RisingKeys(const Problem& p, Inputs* in) {
  const std::vector<int32_t> cu = p.CuK();
  const int64_t row = p.kv_heads * p.head_dim;
  for (int64_t b = 0; b < p.batch(); ++b) {
    for (int64_t j = 0; j < p.len_k[b]; ++j) {
      for (int64_t i = 0; i < row; ++i) {
        double& x = in->k[(cu[b] + j) * row + i];
        x = RoundTo<T>(x * (1.0 + j / 4.0));
      }
    }
  }
}

// Runs the public forward and backward (the backend of the tensors' device, the CPU for host
// tensors) on random inputs in dtype T (changed by `adjust` when given) and applies
// ExpectMatchesReference.
template <typename T>
void CheckAgainstReference(const Problem& p, uint32_t seed = 1,
                           void (*adjust)(const Problem&, Inputs*) = nullptr) {
  Inputs in = RandomInputs<T>(p, seed);
  if (adjust != nullptr) adjust(p, &in);
  AttentionTensors<T> t(p, in);
  ASSERT_TRUE(t.Forward(p.options).ok()) << t.Forward(p.options);
  ASSERT_TRUE(t.Backward(p.options).ok()) << t.Backward(p.options);
  ExpectMatchesReference<T>(p, in, t.Results());
}

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_ATTENTION_REFERENCE_H_
