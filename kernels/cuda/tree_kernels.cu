// The CUDA backend of the tree-packing kernels (tree.h). Per-element math in common/tree.h and
// common/elementwise.h, shared with the CPU backend (cpu/tree_cpu.cc).
//
// TreePositionIds: one thread per row counts the open rows before it in its sequence (the
// definition; O(row index) per row, no inter-thread dependency). The cross entropy: one block per
// row folds the row into a log-sum-exp; the backward's block finds the row's targets by binary
// search in the sorted rows, writes the softmax term, then its first thread subtracts each
// target's one-hot term in order.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/elementwise.h"
#include "kernels/common/half.h"
#include "kernels/common/tree.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/tree_launch.h"

namespace packsched::kernels::internal::cuda {
namespace {

constexpr int kTreeThreads = 256;
constexpr int64_t kTreeMaxBlocks = 1 << 16;

int64_t TreeBlocks(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return b < 1 ? 1 : (b > kTreeMaxBlocks ? kTreeMaxBlocks : b);
}

__global__ void TreePositionsKernel(const int32_t* __restrict__ cu,
                                    const int32_t* __restrict__ subtree_end, int64_t batch,
                                    int64_t rows, int64_t* __restrict__ out) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < rows;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (InTail(cu, batch, t)) {
      out[t] = t - cu[batch];
      continue;
    }
    const int64_t start = cu[SegmentOf(cu, batch, t)];
    int64_t depth = 0;
    for (int64_t j = start; j < t; ++j) depth += OpenAt(subtree_end[j], t) ? 1 : 0;
    out[t] = depth;
  }
}

template <typename AccT>
__device__ LogSumExp<AccT> TreeWarpCombine(LogSumExp<AccT> s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    LogSumExp<AccT> other;
    other.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
    s = LseCombine(s, other);
  }
  return s;
}

// The log-sum-exp of one row over the block (every thread gets it).
template <typename T>
__device__ Acc<T> RowLse(const T* row, int64_t vocab) {
  using AccT = Acc<T>;
  __shared__ AccT warp_max[kTreeThreads / 32];
  __shared__ AccT warp_sum[kTreeThreads / 32];
  __shared__ AccT result;
  LogSumExp<AccT> s = LseEmpty<AccT>();
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) LseAdd(s, ToAcc(row[v]));
  s = TreeWarpCombine(s);
  if (threadIdx.x % 32 == 0) {
    warp_max[threadIdx.x / 32] = s.max;
    warp_sum[threadIdx.x / 32] = s.sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    LogSumExp<AccT> all = LseEmpty<AccT>();
    for (int w = 0; w < kTreeThreads / 32; ++w) {
      all = LseCombine(all, LogSumExp<AccT>{warp_max[w], warp_sum[w]});
    }
    result = LseValue(all);
  }
  __syncthreads();
  const AccT value = result;
  __syncthreads();  // result and the warp slots are rewritten by the next row
  return value;
}

template <typename T>
__global__ void MultiTargetLseKernel(const T* __restrict__ logits, int64_t num_rows, int64_t vocab,
                                     Acc<T>* __restrict__ lse) {
  for (int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const Acc<T> value = RowLse(logits + r * vocab, vocab);
    if (threadIdx.x == 0) lse[r] = value;
  }
}

template <typename T, typename Index>
__global__ void MultiTargetLossKernel(const T* __restrict__ logits, int64_t vocab,
                                      const Index* __restrict__ rows,
                                      const Index* __restrict__ labels, int64_t targets,
                                      const Acc<T>* __restrict__ lse, Acc<T>* __restrict__ loss) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < targets;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t label = labels[i];
    loss[i] = label >= 0 && label < vocab ? lse[rows[i]] - ToAcc(logits[rows[i] * vocab + label])
                                          : static_cast<Acc<T>>(NAN);
  }
}

template <typename T, typename Index>
__global__ void MultiTargetGradKernel(const T* __restrict__ logits, int64_t num_rows, int64_t vocab,
                                      const Index* __restrict__ rows,
                                      const Index* __restrict__ labels, int64_t targets,
                                      const Acc<T>* __restrict__ lse,
                                      const Acc<T>* __restrict__ d_loss, T* __restrict__ d_logits) {
  using AccT = Acc<T>;
  for (int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const int64_t lo = LowerBound(rows, 0, targets, r);
    const int64_t hi = LowerBound(rows, lo, targets, r + 1);
    AccT sum = 0;
    for (int64_t i = lo; i < hi; ++i) sum += d_loss[i];
    const T* row = logits + r * vocab;
    T* out = d_logits + r * vocab;
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      AccT g = MultiTargetSoftmaxGrad(sum, ToAcc(row[v]), lse[r]);
      for (int64_t i = lo; i < hi; ++i) g -= labels[i] == v ? d_loss[i] : AccT(0);
      out[v] = FromAcc<T>(g);
    }
  }
}

template <typename T, typename Index>
void LaunchTyped(const MultiTargetArgs& a, bool backward, cudaStream_t stream) {
  using AccT = Acc<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const Index* rows = static_cast<const Index*>(a.rows);
  const Index* labels = static_cast<const Index*>(a.labels);
  if (backward) {
    if (a.num_rows == 0) return;
    MultiTargetGradKernel<T, Index><<<TreeBlocks(a.num_rows, 1), kTreeThreads, 0, stream>>>(
        logits, a.num_rows, a.vocab, rows, labels, a.targets, static_cast<const AccT*>(a.row_lse),
        static_cast<const AccT*>(a.d_loss), static_cast<T*>(a.d_logits));
    return;
  }
  if (a.num_rows > 0) {
    MultiTargetLseKernel<T><<<TreeBlocks(a.num_rows, 1), kTreeThreads, 0, stream>>>(
        logits, a.num_rows, a.vocab, static_cast<AccT*>(a.row_lse));
  }
  if (a.targets > 0) {
    MultiTargetLossKernel<T, Index>
        <<<TreeBlocks(a.targets, kTreeThreads), kTreeThreads, 0, stream>>>(
            logits, a.vocab, rows, labels, a.targets, static_cast<const AccT*>(a.row_lse),
            static_cast<AccT*>(a.loss));
  }
}

template <typename T>
void LaunchByIndex(const MultiTargetArgs& a, bool backward, cudaStream_t stream) {
  if (a.index_64) {
    LaunchTyped<T, int64_t>(a, backward, stream);
  } else {
    LaunchTyped<T, int32_t>(a, backward, stream);
  }
}

LaunchResult LaunchMultiTarget(const MultiTargetArgs& a, bool backward, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case FloatType::kF16:
      LaunchByIndex<Fp16>(a, backward, s);
      break;
    case FloatType::kBf16:
      LaunchByIndex<Bf16>(a, backward, s);
      break;
    case FloatType::kF32:
      LaunchByIndex<float>(a, backward, s);
      break;
    case FloatType::kF64:
      LaunchByIndex<double>(a, backward, s);
      break;
  }
  return ResultOf(cudaGetLastError());
}

}  // namespace

LaunchResult LaunchTreePositionIds(const TreePositionsArgs& a, void* stream) {
  if (a.rows == 0) return ResultOf(cudaSuccess);
  TreePositionsKernel<<<TreeBlocks(a.rows, kTreeThreads), kTreeThreads, 0,
                        static_cast<cudaStream_t>(stream)>>>(a.cu, a.subtree_end, a.batch, a.rows,
                                                             a.position_ids);
  return ResultOf(cudaGetLastError());
}

LaunchResult LaunchMultiTargetCrossEntropy(const MultiTargetArgs& a, void* stream) {
  return LaunchMultiTarget(a, /*backward=*/false, stream);
}

LaunchResult LaunchMultiTargetCrossEntropyBackward(const MultiTargetArgs& a, void* stream) {
  return LaunchMultiTarget(a, /*backward=*/true, stream);
}

}  // namespace packsched::kernels::internal::cuda
