#ifndef PACKSCHED_KERNELS_CUDA_ROW_COPY_CUH_
#define PACKSCHED_KERNELS_CUDA_ROW_COPY_CUH_

// What the CUDA backend's packing kernels share (unpad_pad.cu, aligned.cu, positions_labels.cu,
// cross_entropy.cu, context_parallel.cu): the block size, the grid size, the launch status, and
// the row gather that unpad, the aligned layouts and the CP shard are made of.
//
// Copy kernels treat rows as arrays of vectors of W bytes (W = 16, 8, 4, 2 or 1, the widest that
// divides the row size and the base pointers), so a warp moves 512 contiguous bytes per step.
// Rows of at least 32 vectors get a warp each (the row's source is looked up once); shorter rows
// are copied element by element over the flattened output, so 1-D tensors stay coalesced too.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"

namespace packsched::kernels::internal::cuda {

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 1 << 16;

// Blocks for `work` items at `per_block` a block, clamped to [1, kMaxBlocks] (the kernels loop
// grid-stride over the rest).
inline int64_t Blocks(int64_t work, int64_t per_block = kThreads) {
  const int64_t b = (work + per_block - 1) / per_block;
  return b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b);
}

inline LaunchResult LastError() { return ResultOf(cudaGetLastError()); }

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// out[r] = in[map(r)] (or `fill` for a pad slot), for `rows` rows of `vecs` vectors.
template <typename V, typename Map>
__global__ void GatherRows(const V* __restrict__ in, V* __restrict__ out, int64_t rows,
                           int64_t vecs, Map map, V fill) {
  if (vecs >= 32) {
    const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
         r += warps) {
      const int64_t src = map(r);
      V* dst = out + r * vecs;
      if (src < 0) {
        for (int64_t c = lane; c < vecs; c += 32) dst[c] = fill;
      } else {
        const V* from = in + src * vecs;
        for (int64_t c = lane; c < vecs; c += 32) dst[c] = from[c];
      }
    }
    return;
  }
  const int64_t n = rows * vecs;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / vecs;
    const int64_t src = map(r);
    out[e] = src < 0 ? fill : in[src * vecs + (e - r * vecs)];
  }
}

// The widest vector (bytes) that divides the row size and aligns every pointer.
inline int VectorWidth(int64_t row_bytes, int64_t min_width, const void* p0, const void* p1) {
  for (int w = 16; w > 1; w /= 2) {
    if (w < min_width) break;
    if (row_bytes % w == 0 && reinterpret_cast<uintptr_t>(p0) % w == 0 &&
        reinterpret_cast<uintptr_t>(p1) % w == 0) {
      return w;
    }
  }
  return static_cast<int>(min_width);
}

template <typename V, typename Map>
void LaunchGatherTyped(const void* in, void* out, int64_t rows, int64_t row_bytes, Map map,
                       const unsigned char* pattern, cudaStream_t stream) {
  const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
  V fill{};
  if (pattern != nullptr) memcpy(&fill, pattern, sizeof(V));
  const int64_t threads_needed = vecs >= 32 ? rows * 32 : rows * vecs;
  GatherRows<V, Map><<<Blocks(threads_needed), kThreads, 0, stream>>>(
      static_cast<const V*>(in), static_cast<V*>(out), rows, vecs, map, fill);
}

template <typename Map>
LaunchResult LaunchGather(const void* in, void* out, int64_t rows, int64_t row_bytes,
                          int64_t min_width, Map map, const unsigned char* pattern,
                          cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return ResultOf(cudaSuccess);
  switch (VectorWidth(row_bytes, min_width, in, out)) {
    case 16:
      LaunchGatherTyped<uint4>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    case 8:
      LaunchGatherTyped<uint2>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    case 4:
      LaunchGatherTyped<uint32_t>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    case 2:
      LaunchGatherTyped<uint16_t>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    default:
      LaunchGatherTyped<uint8_t>(in, out, rows, row_bytes, map, pattern, stream);
  }
  return LastError();
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ROW_COPY_CUH_
