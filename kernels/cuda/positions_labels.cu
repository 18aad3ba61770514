// The CUDA position ids and shifted labels of a packed (or aligned) layout, tail included.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/elementwise.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/row_copy.cuh"
#include "kernels/internal/args.h"

namespace packsched::kernels::internal::cuda {
namespace {

__global__ void PositionIdsKernel(const int32_t* __restrict__ cu, int64_t batch, int64_t rows,
                                  int64_t* __restrict__ pos) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    pos[t] = PositionId(t, SegmentStart(cu, batch, t));
  }
}

template <typename Id>
__global__ void ShiftLabelsKernel(const Id* __restrict__ ids, const int32_t* __restrict__ cu,
                                  const int32_t* __restrict__ layout, int64_t batch, int64_t rows,
                                  Id ignore, Id* __restrict__ labels) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (InTail(layout, batch, t)) {  // a segment without real tokens
      labels[t] = ShiftedLabel<Id>(ids, t, layout[batch], /*real_len=*/0, ignore);
      continue;
    }
    const int64_t b = SegmentOf(layout, batch, t);
    labels[t] = ShiftedLabel<Id>(ids, t, layout[b], cu[b + 1] - cu[b], ignore);
  }
}

}  // namespace

LaunchResult LaunchPositionIds(const PositionIdsArgs& a, void* stream) {
  if (a.rows == 0) return ResultOf(cudaSuccess);
  PositionIdsKernel<<<Blocks(a.rows), kThreads, 0, AsStream(stream)>>>(a.cu, a.batch, a.rows,
                                                                       a.position_ids);
  return LastError();
}

LaunchResult LaunchShiftLabels(const ShiftLabelsArgs& a, void* stream) {
  if (a.rows == 0) return ResultOf(cudaSuccess);
  const int32_t* layout = a.cu_padded != nullptr ? a.cu_padded : a.cu;
  if (a.ids_64) {
    ShiftLabelsKernel<int64_t><<<Blocks(a.rows), kThreads, 0, AsStream(stream)>>>(
        static_cast<const int64_t*>(a.ids), a.cu, layout, a.batch, a.rows, a.ignore_index,
        static_cast<int64_t*>(a.labels));
  } else {
    ShiftLabelsKernel<int32_t><<<Blocks(a.rows), kThreads, 0, AsStream(stream)>>>(
        static_cast<const int32_t*>(a.ids), a.cu, layout, a.batch, a.rows,
        static_cast<int32_t>(a.ignore_index), static_cast<int32_t*>(a.labels));
  }
  return LastError();
}

}  // namespace packsched::kernels::internal::cuda
