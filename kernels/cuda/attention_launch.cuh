#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_

// Launch helpers shared by attention_fwd.cu and attention_bwd.cu: the dtype x head-dim-bucket
// dispatch (the only instantiations: 3 dtypes x 3 buckets per kernel) and the launch itself.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_traits.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/internal/attention_args.h"

namespace packsched::kernels::internal::cuda {

// Grid (tiles over the longest segment, heads, sequences); gridDim.y and .z are limited to 65535.
inline bool AttnGrid(int64_t longest, int tile, int64_t heads, int64_t batch, dim3* grid) {
  const int64_t tiles = (longest + tile - 1) / tile;
  if (heads > 65535 || batch > 65535 || tiles > 0x7fffffff) return false;
  *grid = dim3(static_cast<unsigned>(tiles < 1 ? 1 : tiles), static_cast<unsigned>(heads),
               static_cast<unsigned>(batch));
  return true;
}

// Launches kernel<<<grid, Tr::kThreads, Tr::kSharedBytes>>>(a) after opting into its shared
// memory (over the 48 KiB default). The grid covers a tail too (LaunchSpan).
template <typename Tr>
cudaError_t LaunchAttnKernel(void (*kernel)(AttentionArgs), const AttentionArgs& a, int64_t longest,
                             int tile, int64_t heads, bool keys, cudaStream_t stream) {
  const AttnLaunchSpan span = LaunchSpan(a, longest, keys);
  dim3 grid;
  if (!AttnGrid(span.longest, tile, heads, span.sequences, &grid)) {
    return cudaErrorInvalidConfiguration;
  }
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(Tr::kSharedBytes));
  if (e != cudaSuccess) return e;
  kernel<<<grid, Tr::kThreads, Tr::kSharedBytes, stream>>>(a);
  return cudaGetLastError();
}

// The query-row map on the device (attention_query_runs.cuh), for both launchers. Without a map
// (a->query_rows null) nothing. Else takes device memory from the workspace pool
// (TcWorkspaceAllocate) into *workspace, which the caller hands back with cudaFreeAsync on
// `stream` after its last kernel, copies the map's runs there (from pageable host memory: the
// copy may wait for the stream) and sets a->query_runs and a->num_query_runs.
cudaError_t UploadQueryRuns(AttentionArgs* a, cudaStream_t stream, void** workspace);

// With a map, enqueues AttentionBlankRowsKernel: every row outside it written as a query that
// sees no key (`rows`, out or dq, to 0; `lse` to +inf when not null). Nothing without a map.
cudaError_t EnqueueBlankRows(const AttentionArgs& a, void* rows, float* lse, cudaStream_t stream);

// Runs Launcher<T, kHeadDimBucket>::Run(a, stream) for the call's dtype and head dim (padded up to
// 64, 128 or 256). float64 never reaches the CUDA backend (the front end rejects it).
template <template <typename, int> class Launcher, typename T>
cudaError_t DispatchHeadDim(const AttentionArgs& a, cudaStream_t stream) {
  if (a.head_dim <= 64) return Launcher<T, 64>::Run(a, stream);
  if (a.head_dim <= 128) return Launcher<T, 128>::Run(a, stream);
  return Launcher<T, 256>::Run(a, stream);
}

template <template <typename, int> class Launcher>
cudaError_t DispatchAttention(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.dtype) {
    case FloatType::kF16:
      return DispatchHeadDim<Launcher, Fp16>(a, stream);
    case FloatType::kBf16:
      return DispatchHeadDim<Launcher, Bf16>(a, stream);
    case FloatType::kF32:
      return DispatchHeadDim<Launcher, float>(a, stream);
    case FloatType::kF64:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_LAUNCH_CUH_
