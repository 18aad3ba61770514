#ifndef PACKSCHED_KERNELS_CUDA_RECURRENT_DEVICE_CUH_
#define PACKSCHED_KERNELS_CUDA_RECURRENT_DEVICE_CUH_

// Device code of the recurrent kernels (launched by recurrent.cu), correctness first: the per-row
// math of common/recurrent.h, shared with the CPU backend, accumulated in double as there. Blocks
// of kBlock threads. Also compiled as plain C++ under the tests' CUDA emulation
// (tests/kernels/recurrent_emulated_test.cc), hence no CUDA-only syntax besides the qualifiers.
//
// Convolution: the forward one thread per (row, channel); the backward one thread per channel
// walking the rows in order (it scatters into its own channel only: no atomics, deterministic).
// Gated recurrence: one block per head walking the rows in order, a thread per state column
// (columns evolve independently); every row's state is kept in a workspace [rows, heads, K, V]
// (so a child reads its branch point's state directly), and the backward adds each row's dS into
// its prev_row's accumulator (the children of a branch point sum there), then reduces dq, dk, dg
// and d_beta over the block in a fixed order.

#include <cmath>
#include <cstdint>

#include "kernels/common/recurrent.h"
#include "kernels/internal/recurrent_args.h"

namespace packsched::kernels::internal::cuda {

using common::ColumnGrad;
using common::ConvDPre;
using common::ConvPre;
using common::RecurrenceColumn;
using common::RecurrenceColumnBackward;
using common::RecurrenceRowBackward;

constexpr int kBlock = 128;
constexpr int kMaxWidth = 8;  // recurrent_api.cc's conv width bound
constexpr int kMaxDim = 512;  // recurrent_api.cc's head-dim bound

template <typename T>
__global__ void ConvForwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                                  const T* __restrict__ bias, const int32_t* __restrict__ prev,
                                  int64_t rows, int64_t channels, int width, bool silu,
                                  T* __restrict__ out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(kBlock) + threadIdx.x; e < rows * channels;
       e += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t t = e / channels, c = e % channels;
    const double pre = ConvPre<T, double>(x, channels, c, w + c * width, width, bias, prev, t);
    out[e] = T(silu ? pre * common::Sigmoid(pre) : pre);
  }
}

// dx_acc [rows, channels] doubles, zeroed.
template <typename T>
__global__ void ConvBackwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                                   const T* __restrict__ bias, const int32_t* __restrict__ prev,
                                   int64_t rows, int64_t channels, int width, bool silu,
                                   const T* __restrict__ d_out, double* __restrict__ dx_acc,
                                   T* __restrict__ dx, T* __restrict__ dw, T* __restrict__ db) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(kBlock) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * kBlock) {
    double dw_c[kMaxWidth] = {};
    double db_c = 0;
    const T* wc = w + c * width;
    for (int64_t t = 0; t < rows; ++t) {
      const double pre = ConvPre<T, double>(x, channels, c, wc, width, bias, prev, t);
      const double dp = ConvDPre<double>(pre, double(d_out[t * channels + c]), silu);
      db_c += dp;
      int64_t r = t;
      for (int i = 0; i < width && r >= 0; ++i, r = prev[r]) {
        dw_c[width - 1 - i] += dp * double(x[r * channels + c]);
        dx_acc[r * channels + c] += dp * double(wc[width - 1 - i]);
      }
    }
    for (int i = 0; i < width; ++i) dw[c * width + i] = T(dw_c[i]);
    if (db != nullptr) db[c] = T(db_c);
    for (int64_t t = 0; t < rows; ++t) dx[t * channels + c] = T(dx_acc[t * channels + c]);
  }
}

struct Head {
  int64_t rows, heads;
  int kd, vd;
  int64_t h;
  __device__ int64_t State(int64_t t) const { return (t * heads + h) * int64_t{kd} * vd; }
  __device__ int64_t At(int64_t t, int width) const { return (t * heads + h) * width; }
};

template <typename T>
__device__ double Beta(const T* beta, const Head& hd, int64_t t) {
  return beta != nullptr ? double(beta[t * hd.heads + hd.h]) : 1.0;
}

// Every row's state of head blockIdx.x into states; out (may be null) gets the outputs.
template <typename T>
__device__ void ForwardRows(const RecurrenceArgs& a, const Head& hd, double* states, T* out) {
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const T* g = static_cast<const T*>(a.g);
  const T* beta = static_cast<const T*>(a.beta);
  for (int64_t t = 0; t < a.rows; ++t) {
    const int32_t p = a.prev_row[t];
    const double decay = exp(double(g[t * a.heads + hd.h]));
    for (int j = threadIdx.x; j < a.vd; j += kBlock) {
      const double o = RecurrenceColumn<T, double>(
          p < 0 ? nullptr : states + hd.State(p) + j, states + hd.State(t) + j, a.vd,
          q + hd.At(t, a.kd), k + hd.At(t, a.kd), double(v[hd.At(t, a.vd) + j]), decay,
          beta != nullptr, Beta(beta, hd, t), a.kd);
      if (out != nullptr) out[hd.At(t, a.vd) + j] = T(o);
    }
  }
}

template <typename T>
__global__ void RecurrenceForwardKernel(RecurrenceArgs a, double* __restrict__ states) {
  const Head hd{a.rows, a.heads, a.kd, a.vd, static_cast<int64_t>(blockIdx.x)};
  ForwardRows<T>(a, hd, states, static_cast<T*>(a.out));
}

// The sum of every thread's `value` (thread 0 adds them in order: deterministic).
__device__ inline double BlockSum(double value, double* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  double sum = 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBlock; ++i) sum += scratch[i];
  }
  __syncthreads();
  return sum;
}

// ds_acc [rows, heads, K, V] doubles, zeroed: row t's dS, summed from its successors.
template <typename T>
__global__ void RecurrenceBackwardKernel(RecurrenceArgs a, double* __restrict__ states,
                                         double* __restrict__ ds_acc) {
  static __shared__ double delta[kMaxDim], du[kMaxDim], d_out[kMaxDim], scratch[kBlock];
  const Head hd{a.rows, a.heads, a.kd, a.vd, static_cast<int64_t>(blockIdx.x)};
  ForwardRows<T>(a, hd, states, nullptr);
  __syncthreads();
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const T* g = static_cast<const T*>(a.g);
  const T* beta = static_cast<const T*>(a.beta);
  const T* dout = static_cast<const T*>(a.d_out);
  for (int64_t t = a.rows - 1; t >= 0; --t) {
    const int32_t p = a.prev_row[t];
    const double decay = exp(double(g[t * a.heads + hd.h]));
    double* ds = ds_acc + hd.State(t);
    const double* s_in = p < 0 ? nullptr : states + hd.State(p);
    double d_beta = 0;
    for (int j = threadIdx.x; j < a.vd; j += kBlock) {
      d_out[j] = double(dout[hd.At(t, a.vd) + j]);
      const ColumnGrad<double> c = RecurrenceColumnBackward<T, double>(
          s_in != nullptr ? s_in + j : nullptr, a.vd, q + hd.At(t, a.kd), k + hd.At(t, a.kd),
          double(v[hd.At(t, a.vd) + j]), decay, beta != nullptr, Beta(beta, hd, t), d_out[j], a.kd,
          ds + j, p < 0 ? nullptr : ds_acc + hd.State(p) + j);
      delta[j] = c.delta;
      du[j] = c.du;
      static_cast<T*>(a.dv)[hd.At(t, a.vd) + j] = T(c.dv);
      d_beta += c.d_beta;
    }
    __syncthreads();
    double dg = 0;
    for (int i = threadIdx.x; i < a.kd; i += kBlock) {
      double dq_i = 0, dk_i = 0;
      RecurrenceRowBackward<double>(s_in != nullptr ? s_in + i * a.vd : nullptr,
                                    states + hd.State(t) + i * a.vd, ds + i * a.vd, delta, du,
                                    d_out, double(k[hd.At(t, a.kd) + i]), decay, a.vd, &dq_i, &dk_i,
                                    &dg);
      static_cast<T*>(a.dq)[hd.At(t, a.kd) + i] = T(dq_i);
      static_cast<T*>(a.dk)[hd.At(t, a.kd) + i] = T(dk_i);
    }
    const double dg_sum = BlockSum(dg, scratch);
    const double d_beta_sum = BlockSum(d_beta, scratch);
    if (threadIdx.x == 0) {
      static_cast<T*>(a.dg)[t * a.heads + hd.h] = T(dg_sum);
      if (a.d_beta != nullptr) static_cast<T*>(a.d_beta)[t * a.heads + hd.h] = T(d_beta_sum);
    }
  }
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_RECURRENT_DEVICE_CUH_
