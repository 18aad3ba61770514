// The CPU backend of the recurrent kernels (recurrent.h): rows in order, the heads on a few
// threads, the per-row math of common/recurrent.h in double. The forward keeps only the states a
// later row jumps back to (branch points: prev_row[t] = r with t != r + 1), each freed after its
// last child; the backward stores every state of the head once (T x K x V) and walks the rows
// backwards, carrying dS to prev_row[t] and summing a branch point's dS over its children.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/recurrent.h"
#include "kernels/internal/recurrent_args.h"

namespace packsched::kernels::internal::cpu {
namespace {

using common::ColumnGrad;
using common::ConvDPre;
using common::ConvPre;
using common::RecurrenceColumn;
using common::RecurrenceColumnBackward;
using common::RecurrenceRowBackward;

// Runs body(h) for every head h in [0, heads) on up to hardware_concurrency threads, heads
// claimed in order from a shared counter. Heads write disjoint outputs, so results do not depend
// on the thread count.
void ParallelFor(int64_t heads, const std::function<void(int64_t)>& body) {
  const int64_t workers =
      std::min<int64_t>(heads, std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  if (workers <= 1) {
    for (int64_t h = 0; h < heads; ++h) body(h);
    return;
  }
  std::atomic<int64_t> next{0};
  auto run = [&] {
    for (int64_t h = next.fetch_add(1); h < heads; h = next.fetch_add(1)) body(h);
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
}

// For each row, how many later rows jump back to it (not counting its direct successor).
std::vector<int32_t> JumpCounts(const int32_t* prev_row, int64_t rows) {
  std::vector<int32_t> jumps(rows, 0);
  for (int64_t t = 0; t < rows; ++t) {
    if (prev_row[t] >= 0 && prev_row[t] != t - 1) ++jumps[prev_row[t]];
  }
  return jumps;
}

template <typename T>
void ConvForward(const ConvArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  T* out = static_cast<T*>(a.out);
  for (int64_t t = 0; t < a.rows; ++t) {
    for (int64_t c = 0; c < a.channels; ++c) {
      const double pre =
          ConvPre<T, double>(x, a.channels, c, w + c * a.width, a.width, bias, a.prev_row, t);
      out[t * a.channels + c] = T(a.silu ? pre * common::Sigmoid(pre) : pre);
    }
  }
}

template <typename T>
void ConvBackward(const ConvArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  const T* d_out = static_cast<const T*>(a.d_out);
  const int64_t c_n = a.channels;
  std::vector<double> dx(a.rows * c_n, 0.0), dw(c_n * a.width, 0.0), db(c_n, 0.0);
  for (int64_t t = 0; t < a.rows; ++t) {
    for (int64_t c = 0; c < c_n; ++c) {
      const double pre =
          ConvPre<T, double>(x, c_n, c, w + c * a.width, a.width, bias, a.prev_row, t);
      const double dp = ConvDPre<double>(pre, double(d_out[t * c_n + c]), a.silu);
      db[c] += dp;
      int64_t r = t;
      for (int i = 0; i < a.width && r >= 0; ++i, r = a.prev_row[r]) {
        dw[c * a.width + a.width - 1 - i] += dp * double(x[r * c_n + c]);
        dx[r * c_n + c] += dp * double(w[c * a.width + a.width - 1 - i]);
      }
    }
  }
  T* out_dx = static_cast<T*>(a.dx);
  T* out_dw = static_cast<T*>(a.d_weight);
  for (int64_t i = 0; i < a.rows * c_n; ++i) out_dx[i] = T(dx[i]);
  for (int64_t i = 0; i < c_n * a.width; ++i) out_dw[i] = T(dw[i]);
  if (a.d_bias != nullptr) {
    T* out_db = static_cast<T*>(a.d_bias);
    for (int64_t c = 0; c < c_n; ++c) out_db[c] = T(db[c]);
  }
}

template <typename T>
struct HeadView {
  const RecurrenceArgs& a;
  int64_t h;
  const T* q(int64_t t) const { return static_cast<const T*>(a.q) + (t * a.heads + h) * a.kd; }
  const T* k(int64_t t) const { return static_cast<const T*>(a.k) + (t * a.heads + h) * a.kd; }
  const T* v(int64_t t) const { return static_cast<const T*>(a.v) + (t * a.heads + h) * a.vd; }
  double g(int64_t t) const { return double(static_cast<const T*>(a.g)[t * a.heads + h]); }
  double beta(int64_t t) const {
    return a.beta != nullptr ? double(static_cast<const T*>(a.beta)[t * a.heads + h]) : 1.0;
  }
  int64_t at(int64_t t, int64_t width) const { return (t * a.heads + h) * width; }

  // Row t's step: s_out from s_in (null: zero), out [vd].
  void Step(int64_t t, const double* s_in, double* s_out, T* out) const {
    const double decay = std::exp(g(t));
    for (int j = 0; j < a.vd; ++j) {
      out[j] = T(RecurrenceColumn<T, double>(s_in != nullptr ? s_in + j : nullptr, s_out + j, a.vd,
                                             q(t), k(t), double(v(t)[j]), decay, a.beta != nullptr,
                                             beta(t), a.kd));
    }
  }
};

template <typename T>
void RecurrenceForward(const RecurrenceArgs& a) {
  const int64_t size = int64_t{a.kd} * a.vd;
  const std::vector<int32_t> jumps = JumpCounts(a.prev_row, a.rows);
  ParallelFor(a.heads, [&](int64_t h) {
    const HeadView<T> view{a, h};
    std::vector<int32_t> left = jumps;
    // saved[r]: the state after row r while a jump to r is pending (a branch point).
    std::vector<std::vector<double>> saved(a.rows);
    std::vector<double> cur(size, 0.0), next(size, 0.0);
    for (int64_t t = 0; t < a.rows; ++t) {
      const int32_t p = a.prev_row[t];
      const double* s_in = p < 0 ? nullptr : p == t - 1 ? cur.data() : saved[p].data();
      view.Step(t, s_in, next.data(), static_cast<T*>(a.out) + view.at(t, a.vd));
      if (p >= 0 && p != t - 1 && --left[p] == 0) std::vector<double>().swap(saved[p]);
      cur.swap(next);
      if (jumps[t] > 0) saved[t] = cur;
    }
  });
}

template <typename T>
void RecurrenceBackward(const RecurrenceArgs& a) {
  const int64_t size = int64_t{a.kd} * a.vd;
  const std::vector<int32_t> jumps = JumpCounts(a.prev_row, a.rows);
  const bool has_beta = a.beta != nullptr;
  ParallelFor(a.heads, [&](int64_t h) {
    std::vector<double> states(a.rows * size);
    std::vector<T> out_row(a.vd);
    std::vector<double> delta(a.vd), du(a.vd), d_out_acc(a.vd);
    const HeadView<T> view{a, h};
    for (int64_t t = 0; t < a.rows; ++t) {
      const int32_t p = a.prev_row[t];
      view.Step(t, p < 0 ? nullptr : &states[p * size], &states[t * size], out_row.data());
    }
    // d_saved[r]: the summed dS of a branch point's children that jumped back to it.
    std::vector<std::vector<double>> d_saved(a.rows);
    std::vector<double> ds(size, 0.0), ds_in(size, 0.0);
    bool carried = false;  // ds holds the dS of row t (from row t + 1)
    for (int64_t t = a.rows - 1; t >= 0; --t) {
      if (!carried) std::fill(ds.begin(), ds.end(), 0.0);
      if (jumps[t] > 0 && !d_saved[t].empty()) {
        for (int64_t i = 0; i < size; ++i) ds[i] += d_saved[t][i];
        std::vector<double>().swap(d_saved[t]);
      }
      const int32_t p = a.prev_row[t];
      double* into = nullptr;
      if (p == t - 1 && p >= 0) {
        std::fill(ds_in.begin(), ds_in.end(), 0.0);
        into = ds_in.data();
      } else if (p >= 0) {
        if (d_saved[p].empty()) d_saved[p].assign(size, 0.0);
        into = d_saved[p].data();
      }
      const double* s_in = p < 0 ? nullptr : &states[p * size];
      const double* s = &states[t * size];
      const double decay = std::exp(view.g(t));
      const T* d_out = static_cast<const T*>(a.d_out) + view.at(t, a.vd);
      T* dv_out = static_cast<T*>(a.dv) + view.at(t, a.vd);
      double d_beta = 0, dg = 0;
      for (int j = 0; j < a.vd; ++j) {
        d_out_acc[j] = double(d_out[j]);
        const ColumnGrad<double> c = RecurrenceColumnBackward<T, double>(
            s_in != nullptr ? s_in + j : nullptr, a.vd, view.q(t), view.k(t), double(view.v(t)[j]),
            decay, has_beta, view.beta(t), d_out_acc[j], a.kd, &ds[j],
            into != nullptr ? into + j : nullptr);
        delta[j] = c.delta;
        du[j] = c.du;
        dv_out[j] = T(c.dv);
        d_beta += c.d_beta;
      }
      T* dq_out = static_cast<T*>(a.dq) + view.at(t, a.kd);
      T* dk_out = static_cast<T*>(a.dk) + view.at(t, a.kd);
      for (int i = 0; i < a.kd; ++i) {
        double dq = 0, dk = 0;
        const std::ptrdiff_t row = std::ptrdiff_t{i} * a.vd;
        RecurrenceRowBackward<double>(s_in != nullptr ? s_in + row : nullptr, s + row, &ds[row],
                                      delta.data(), du.data(), d_out_acc.data(),
                                      double(view.k(t)[i]), decay, a.vd, &dq, &dk, &dg);
        dq_out[i] = T(dq);
        dk_out[i] = T(dk);
      }
      static_cast<T*>(a.dg)[t * a.heads + h] = T(dg);
      if (has_beta) static_cast<T*>(a.d_beta)[t * a.heads + h] = T(d_beta);
      carried = p == t - 1 && p >= 0;
      if (carried) ds.swap(ds_in);
    }
  });
}

}  // namespace

absl::Status CausalConv1dForward(const ConvArgs& a) {
  a.dtype == FloatType::kF64 ? ConvForward<double>(a) : ConvForward<float>(a);
  return absl::OkStatus();
}

absl::Status CausalConv1dBackward(const ConvArgs& a) {
  a.dtype == FloatType::kF64 ? ConvBackward<double>(a) : ConvBackward<float>(a);
  return absl::OkStatus();
}

absl::Status GatedRecurrenceForward(const RecurrenceArgs& a) {
  a.dtype == FloatType::kF64 ? RecurrenceForward<double>(a) : RecurrenceForward<float>(a);
  return absl::OkStatus();
}

absl::Status GatedRecurrenceBackward(const RecurrenceArgs& a) {
  a.dtype == FloatType::kF64 ? RecurrenceBackward<double>(a) : RecurrenceBackward<float>(a);
  return absl::OkStatus();
}

}  // namespace packsched::kernels::internal::cpu
