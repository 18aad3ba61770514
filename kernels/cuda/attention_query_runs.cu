// The query-row map's host side on the CUDA attention (attention_launch.cuh): its runs uploaded
// to the device, and the rows outside it written as queries that see no key.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/attention_query_runs.cuh"
#include "kernels/cuda/attention_tc_workspace.cuh"

namespace packsched::kernels::internal::cuda {

cudaError_t UploadQueryRuns(AttentionArgs* a, cudaStream_t stream, void** workspace) {
  *workspace = nullptr;
  if (a->query_rows == nullptr) return cudaSuccess;
  const std::vector<int32_t> runs = QueryRunsOf(a->query_rows, a->num_query_rows);
  // At least one pair, so that an empty map still has a pointer (no row is listed).
  const size_t bytes = (runs.empty() ? 2 : runs.size()) * sizeof(int32_t);
  cudaError_t e = TcWorkspaceAllocate(bytes, stream, workspace);
  if (e != cudaSuccess) return e;
  if (!runs.empty()) {
    e = cudaMemcpyAsync(*workspace, runs.data(), runs.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) {
      cudaFreeAsync(*workspace, stream);
      *workspace = nullptr;
      return e;
    }
  }
  a->query_runs = static_cast<const int32_t*>(*workspace);
  a->num_query_runs = static_cast<int64_t>(runs.size() / 2);
  return cudaSuccess;
}

cudaError_t EnqueueBlankRows(const AttentionArgs& a, void* rows, float* lse, cudaStream_t stream) {
  if (a.query_runs == nullptr || a.total_q == 0) return cudaSuccess;
  AttentionBlankRowsKernel<uint16_t>
      <<<BlankRowsGrid(a), kBlankRowsThreads, 0, stream>>>(a, rows, lse);
  return cudaGetLastError();
}

}  // namespace packsched::kernels::internal::cuda
