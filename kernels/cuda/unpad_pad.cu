// The CUDA unpad and pad: the mask's token rows gathered into the packed layout, and scattered
// back into a zeroed padded batch.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/row_copy.cuh"
#include "kernels/internal/args.h"

namespace packsched::kernels::internal::cuda {
namespace {

// Unpad: x_packed[r] = x.flat[indices[r]]. An index outside the input (only possible when the
// mask disagrees with cu_seqlens, which the CUDA backend does not check) yields a zero row
// instead of a wild read.
struct IndexMap {
  const int64_t* indices;
  int64_t rows_in;
  __device__ int64_t operator()(int64_t r) const {
    const int64_t i = indices[r];
    return i >= 0 && i < rows_in ? i : -1;
  }
};

// x[indices[r]] = x_packed[r]; out-of-range indices are skipped (the CPU backend rejects them).
template <typename V>
__global__ void ScatterRows(const V* __restrict__ in, const int64_t* __restrict__ indices,
                            V* __restrict__ out, int64_t rows, int64_t vecs, int64_t rows_out) {
  const int64_t n = rows * vecs;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / vecs;
    const int64_t dst = indices[r];
    if (dst >= 0 && dst < rows_out) out[dst * vecs + (e - r * vecs)] = in[e];
  }
}

// One block per batch row: ranks the row's tokens with warp ballots and writes their flat
// indices to indices[cu[b] + rank]. Tokens beyond the row's cu_seqlens length are dropped.
__global__ void MaskToIndices(const void* __restrict__ mask, int mask_bytes,
                              const int32_t* __restrict__ cu, int64_t batch, int64_t seqlen,
                              int64_t* __restrict__ indices) {
  __shared__ int warp_counts[kThreads / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const int64_t start = cu[b];
    const int64_t len = cu[b + 1] - start;
    int64_t base = 0;  // tokens of this row seen in earlier chunks
    for (int64_t s0 = 0; s0 < seqlen && base < len; s0 += kThreads) {
      const int64_t s = s0 + threadIdx.x;
      bool token = false;
      if (s < seqlen) {
        const int64_t i = b * seqlen + s;
        token = mask_bytes == 1   ? static_cast<const uint8_t*>(mask)[i] != 0
                : mask_bytes == 4 ? static_cast<const int32_t*>(mask)[i] != 0
                                  : static_cast<const int64_t*>(mask)[i] != 0;
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, token);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int before = 0;  // tokens in earlier warps of this chunk
      int chunk = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        before += w < warp ? warp_counts[w] : 0;
        chunk += warp_counts[w];
      }
      const int64_t rank = base + before + __popc(ballot & ((1u << lane) - 1u));
      if (token && rank < len) indices[start + rank] = b * seqlen + s;
      base += chunk;
      __syncthreads();  // warp_counts is rewritten by the next chunk
    }
  }
}

}  // namespace

LaunchResult LaunchUnpad(const UnpadArgs& a, void* stream) {
  if (a.total == 0) return ResultOf(cudaSuccess);
  MaskToIndices<<<Blocks(a.batch, 1), kThreads, 0, AsStream(stream)>>>(
      a.mask, a.mask_bytes, a.cu, a.batch, a.seqlen, a.indices);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return ResultOf(e);
  return LaunchGather(a.x, a.x_packed, a.total, a.row_bytes, 1,
                      IndexMap{a.indices, a.batch * a.seqlen}, nullptr, AsStream(stream));
}

LaunchResult LaunchPad(const PadArgs& a, void* stream) {
  const int64_t bytes = a.rows_out * a.row_bytes;
  if (bytes == 0) return ResultOf(cudaSuccess);
  if (cudaError_t e = cudaMemsetAsync(a.x, 0, bytes, AsStream(stream)); e != cudaSuccess) {
    return ResultOf(e);
  }
  if (a.total == 0) return ResultOf(cudaSuccess);
  const int w = VectorWidth(a.row_bytes, 1, a.x_packed, a.x);
  const int64_t vecs = a.row_bytes / w;
  const int64_t blocks = Blocks(a.total * vecs);
  switch (w) {
#define PACKSCHED_SCATTER_CASE(W, V)                                                             \
  case W:                                                                                        \
    ScatterRows<V><<<blocks, kThreads, 0, AsStream(stream)>>>(static_cast<const V*>(a.x_packed), \
                                                              a.indices, static_cast<V*>(a.x),   \
                                                              a.total, vecs, a.rows_out);        \
    break;
    PACKSCHED_SCATTER_CASE(16, uint4)
    PACKSCHED_SCATTER_CASE(8, uint2)
    PACKSCHED_SCATTER_CASE(4, uint32_t)
    PACKSCHED_SCATTER_CASE(2, uint16_t)
    PACKSCHED_SCATTER_CASE(1, uint8_t)
#undef PACKSCHED_SCATTER_CASE
  }
  return LastError();
}

}  // namespace packsched::kernels::internal::cuda
