// The tensor-core backward's workspace pool and the launch of its pre-pass (2 dtypes x head dims
// 64, 96, 128); attention_tc_workspace.cuh describes them.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_tc_bwd.cuh"
#include "kernels/cuda/attention_tc_workspace.cuh"

namespace packsched::kernels::internal::cuda {

namespace {

// The pool of `device`, created on first use, with its release threshold raised to `bytes` when
// that is the largest so far.
cudaError_t WorkspacePool(size_t bytes, cudaMemPool_t* pool) {
  struct Pool {
    cudaMemPool_t pool;
    uint64_t threshold;
  };
  static auto* mu = new std::mutex;
  static auto* pools = new std::map<int, Pool>;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const std::lock_guard<std::mutex> lock(*mu);
  auto it = pools->find(device);
  if (it == pools->end()) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t created;
    e = cudaMemPoolCreate(&created, &props);
    if (e != cudaSuccess) return e;
    it = pools->emplace(device, Pool{created, 0}).first;
  }
  if (bytes > it->second.threshold) {
    uint64_t threshold = bytes;
    e = cudaMemPoolSetAttribute(it->second.pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (e != cudaSuccess) return e;
    it->second.threshold = threshold;
  }
  *pool = it->second.pool;
  return cudaSuccess;
}

template <typename T, int kD>
cudaError_t DotOut(const AttentionArgs& a, float* dot_out, cudaStream_t stream) {
  const int64_t rows = a.total_q * a.heads;
  const int64_t blocks = DotOutBlocks(rows, kD);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  AttentionTcDotOutKernel<T, kD>
      <<<static_cast<unsigned>(blocks), kDotOutThreads, 0, stream>>>(a.out, a.dout, dot_out, rows);
  return cudaGetLastError();
}

template <typename T>
cudaError_t DotOutHeadDim(const AttentionArgs& a, float* dot_out, cudaStream_t stream) {
  return WithTcHeadDim(a.head_dim,
                       [&](auto d) { return DotOut<T, decltype(d)::value>(a, dot_out, stream); });
}

}  // namespace

cudaError_t TcWorkspaceAllocate(size_t bytes, cudaStream_t stream, void** ptr) {
  cudaMemPool_t pool;
  const cudaError_t e = WorkspacePool(bytes, &pool);
  if (e != cudaSuccess) return e;
  return cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
}

size_t TcDotOutBytes(const AttentionArgs& a) {
  const size_t bytes = static_cast<size_t>(a.total_q * a.heads) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

cudaError_t EnqueueTcDotOut(const TcAttnParams& p, float* dot_out, cudaStream_t stream) {
  const AttentionArgs& a = p.args;
  if (a.total_q == 0) return cudaSuccess;
  return a.dtype == FloatType::kBf16 ? DotOutHeadDim<Bf16>(a, dot_out, stream)
                                     : DotOutHeadDim<Fp16>(a, dot_out, stream);
}

}  // namespace packsched::kernels::internal::cuda
