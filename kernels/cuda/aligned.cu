// The CUDA aligned (THD) packing: the padded offsets, then a row gather each way between the
// packed and the aligned layout (pad slots and the tail filled with the pad value).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/elementwise.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/row_copy.cuh"
#include "kernels/internal/args.h"

namespace packsched::kernels::internal::cuda {
namespace {

// PackAligned: aligned row r is real token `off` of sequence b, or a pad slot (tail rows too).
struct AlignedFromPacked {
  const int32_t* cu;
  const int32_t* cu_padded;
  int64_t batch;
  __device__ int64_t operator()(int64_t r) const {
    if (InTail(cu_padded, batch, r)) return -1;
    const int64_t b = SegmentOf(cu_padded, batch, r);
    const int64_t off = r - cu_padded[b];
    return off < cu[b + 1] - cu[b] ? cu[b] + off : -1;
  }
};

// UnpackAligned: packed row r sits at the same offset of its aligned segment.
struct PackedFromAligned {
  const int32_t* cu;
  const int32_t* cu_padded;
  int64_t batch;
  __device__ int64_t operator()(int64_t r) const {
    const int64_t b = SegmentOf(cu, batch, r);
    return cu_padded[b] + (r - cu[b]);
  }
};

// One block: cu_padded = exclusive scan of AlignUp(len_b, align); seqused = len_b. Each thread
// sums a contiguous chunk, the block scans the chunk sums, each thread then writes its chunk.
__global__ void AlignedOffsets(const int32_t* __restrict__ cu, int64_t batch, int64_t align,
                               int32_t* __restrict__ cu_padded, int32_t* __restrict__ seqused) {
  __shared__ int64_t sums[kThreads];
  const int64_t per_thread = (batch + kThreads - 1) / kThreads;
  const int64_t lo = threadIdx.x * per_thread;
  const int64_t hi = lo + per_thread < batch ? lo + per_thread : batch;
  int64_t local = 0;
  for (int64_t b = lo; b < hi; ++b) local += AlignUp(cu[b + 1] - cu[b], align);
  sums[threadIdx.x] = local;
  __syncthreads();
  // Inclusive Hillis-Steele scan over the chunk sums.
  for (int step = 1; step < kThreads; step *= 2) {
    const int64_t add = threadIdx.x >= step ? sums[threadIdx.x - step] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  int64_t offset = sums[threadIdx.x] - local;
  if (threadIdx.x == 0) cu_padded[0] = 0;
  for (int64_t b = lo; b < hi; ++b) {
    const int64_t len = cu[b + 1] - cu[b];
    offset += AlignUp(len, align);
    cu_padded[b + 1] = static_cast<int32_t>(offset);
    seqused[b] = static_cast<int32_t>(len);
  }
}

}  // namespace

LaunchResult LaunchPackAligned(const PackAlignedArgs& a, void* stream) {
  if (a.batch == 0) {
    // cu_seqlens_padded = {0}, then only the tail (if any) to fill.
    const cudaError_t e = cudaMemsetAsync(a.cu_padded, 0, sizeof(int32_t), AsStream(stream));
    if (e != cudaSuccess || a.rows == 0) return ResultOf(e);
  } else {
    AlignedOffsets<<<1, kThreads, 0, AsStream(stream)>>>(a.cu, a.batch, a.align, a.cu_padded,
                                                         a.seqused);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return ResultOf(e);
  }
  // The gather reads the offsets just written, in stream order; tail rows map to the pad value.
  return LaunchGather(a.x_packed, a.x_aligned, a.rows, a.row_bytes, a.elem_bytes,
                      AlignedFromPacked{a.cu, a.cu_padded, a.batch}, a.pad_pattern,
                      AsStream(stream));
}

LaunchResult LaunchUnpackAligned(const UnpackAlignedArgs& a, void* stream) {
  return LaunchGather(a.x_aligned, a.x_packed, a.total, a.row_bytes, 1,
                      PackedFromAligned{a.cu, a.cu_padded, a.batch}, nullptr, AsStream(stream));
}

}  // namespace packsched::kernels::internal::cuda
