// The CUDA packed cross entropy: per-token losses (one block per row) and per-sequence sums and
// counts (one block per sequence); instantiated by dtype x label type only.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/elementwise.h"
#include "kernels/common/half.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/row_copy.cuh"
#include "kernels/internal/args.h"

namespace packsched::kernels::internal::cuda {
namespace {

template <typename AccT>
__device__ LogSumExp<AccT> WarpCombine(LogSumExp<AccT> s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    LogSumExp<AccT> other;
    other.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
    s = LseCombine(s, other);
  }
  return s;
}

// One block per row (grid-stride): each thread folds a strided slice of the row into a running
// log-sum-exp (16-byte loads when the row is aligned), then warps and the block combine.
template <typename T, typename Label>
__global__ void CrossEntropyRows(const T* __restrict__ logits, int64_t vocab,
                                 const Label* __restrict__ labels, int64_t rows,
                                 const int32_t* __restrict__ cu, int64_t batch,
                                 int64_t ignore_index, T* __restrict__ loss) {
  using AccT = Acc<T>;
  constexpr int kPerVec = 16 / sizeof(T);
  __shared__ AccT warp_max[kThreads / 32];
  __shared__ AccT warp_sum[kThreads / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    if (InTail(cu, batch, t)) {  // tail rows: loss 0, labels not read (uniform across the block)
      if (threadIdx.x == 0) loss[t] = FromAcc<T>(AccT(0));
      continue;
    }
    const int64_t label = labels[t];
    if (label == ignore_index) {  // uniform across the block
      if (threadIdx.x == 0) loss[t] = FromAcc<T>(AccT(0));
      continue;
    }
    const T* row = logits + t * vocab;
    LogSumExp<AccT> s = LseEmpty<AccT>();
    if (vocab % kPerVec == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
      const uint4* vec = reinterpret_cast<const uint4*>(row);
      for (int64_t i = threadIdx.x; i < vocab / kPerVec; i += blockDim.x) {
        const uint4 chunk = vec[i];
        const T* elems = reinterpret_cast<const T*>(&chunk);
#pragma unroll
        for (int j = 0; j < kPerVec; ++j) LseAdd(s, ToAcc(elems[j]));
      }
    } else {
      for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) LseAdd(s, ToAcc(row[v]));
    }
    s = WarpCombine(s);
    if (lane == 0) {
      warp_max[warp] = s.max;
      warp_sum[warp] = s.sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      LogSumExp<AccT> all = LseEmpty<AccT>();
      for (int w = 0; w < kThreads / 32; ++w) {
        all = LseCombine(all, LogSumExp<AccT>{warp_max[w], warp_sum[w]});
      }
      const AccT value = label >= 0 && label < vocab ? CrossEntropy(all, ToAcc(row[label]))
                                                     : static_cast<AccT>(NAN);
      loss[t] = FromAcc<T>(value);
    }
    __syncthreads();  // warp_max/warp_sum are rewritten by the next row
  }
}

// One block per sequence: sums its stored per-token losses and counts its non-ignored labels.
template <typename T, typename Label>
__global__ void CrossEntropySequences(const T* __restrict__ loss, const Label* __restrict__ labels,
                                      const int32_t* __restrict__ cu, int64_t batch,
                                      int64_t ignore_index, T* __restrict__ seq_sum,
                                      int64_t* __restrict__ seq_count) {
  using AccT = Acc<T>;
  __shared__ AccT sums[kThreads];
  __shared__ int64_t counts[kThreads];
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    AccT sum = 0;
    int64_t count = 0;
    for (int64_t t = cu[b] + threadIdx.x; t < cu[b + 1]; t += blockDim.x) {
      sum += ToAcc(loss[t]);
      count += labels[t] != ignore_index;
    }
    sums[threadIdx.x] = sum;
    counts[threadIdx.x] = count;
    __syncthreads();
    for (int step = kThreads / 2; step > 0; step /= 2) {
      if (threadIdx.x < step) {
        sums[threadIdx.x] += sums[threadIdx.x + step];
        counts[threadIdx.x] += counts[threadIdx.x + step];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      seq_sum[b] = FromAcc<T>(sums[0]);
      seq_count[b] = counts[0];
    }
    __syncthreads();
  }
}

template <typename T, typename Label>
void LaunchCrossEntropyTyped(const CrossEntropyArgs& a, cudaStream_t stream) {
  const T* logits = static_cast<const T*>(a.logits);
  const Label* labels = static_cast<const Label*>(a.labels);
  T* loss = static_cast<T*>(a.per_token_loss);
  if (a.rows > 0) {
    CrossEntropyRows<T, Label><<<Blocks(a.rows, 1), kThreads, 0, stream>>>(
        logits, a.vocab, labels, a.rows, a.cu, a.batch, a.ignore_index, loss);
  }
  if (a.batch > 0) {
    CrossEntropySequences<T, Label><<<Blocks(a.batch, 1), kThreads, 0, stream>>>(
        loss, labels, a.cu, a.batch, a.ignore_index, static_cast<T*>(a.per_sequence_sum),
        a.per_sequence_count);
  }
}

template <typename Label>
void LaunchCrossEntropyByDtype(const CrossEntropyArgs& a, cudaStream_t stream) {
  switch (a.dtype) {
    case FloatType::kF16:
      return LaunchCrossEntropyTyped<Fp16, Label>(a, stream);
    case FloatType::kBf16:
      return LaunchCrossEntropyTyped<Bf16, Label>(a, stream);
    case FloatType::kF32:
      return LaunchCrossEntropyTyped<float, Label>(a, stream);
    case FloatType::kF64:
      return LaunchCrossEntropyTyped<double, Label>(a, stream);
  }
}

}  // namespace

LaunchResult LaunchPackedCrossEntropy(const CrossEntropyArgs& a, void* stream) {
  if (a.rows == 0 && a.batch == 0) return ResultOf(cudaSuccess);
  if (a.labels_64) {
    LaunchCrossEntropyByDtype<int64_t>(a, AsStream(stream));
  } else {
    LaunchCrossEntropyByDtype<int32_t>(a, AsStream(stream));
  }
  return LastError();
}

}  // namespace packsched::kernels::internal::cuda
