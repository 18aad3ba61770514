// The one-pass tensor-core attention backward (attention_tc_bwd_onepass.cuh): launcher, its
// switch (PACKSCHED_ATTENTION_TC_BWD=onepass) and its 6 instantiations (the kernel and the dq
// conversion x fp16, bf16; the kernel x head dims 64, 128).

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_tc_bwd_onepass.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/launch_result.cuh"

namespace packsched::kernels::internal::cuda {

namespace {

// The memory pool of the dq accumulators on `device`, created on first use. Its release threshold
// is the largest accumulator asked for so far (`bytes` raises it): what a call frees stays
// reserved up to that size, so the next call gets its accumulator without mapping memory again
// (as torch's caching allocator serves FlashAttention's), instead of the default pool's return of
// everything to the driver at each synchronisation. Created pools live as long as the process.
cudaError_t AccumulatorPool(size_t bytes, cudaMemPool_t* pool) {
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

// Zeroes `acc` (n floats), runs the one-pass kernel over the keys, then rounds `acc` into dq.
template <typename T, int kD>
cudaError_t RunOnePass(const TcAttnParams& p, float* acc, int64_t n, cudaStream_t stream) {
  using Tr = TcOnePassTraits<kD>;
  const AttentionArgs& a = p.args;
  if (n > 0) {
    const cudaError_t e = cudaMemsetAsync(acc, 0, static_cast<size_t>(n) * sizeof(float), stream);
    if (e != cudaSuccess) return e;
  }
  if (a.total_k > 0) {
    dim3 grid;
    if (!TcGrid(a, a.max_seqlen_k, Tr::kBc, a.kv_heads, /*keys=*/true, &grid)) {
      return cudaErrorInvalidConfiguration;
    }
    auto* kernel = AttentionTcBackwardOnePassKernel<T, kD>;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(Tr::kSharedBytes));
    if (e != cudaSuccess) return e;
    kernel<<<grid, Tr::kThreads, Tr::kSharedBytes, stream>>>(p, acc);
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) return launched;
  }
  if (n == 0) return cudaSuccess;
  const int64_t n4 = n / 4;  // n is a multiple of the head dim
  const int64_t blocks = (n4 + kDqConvertThreads - 1) / kDqConvertThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  DqFromAccumKernel<T><<<static_cast<unsigned>(blocks), kDqConvertThreads, 0, stream>>>(
      acc, static_cast<T*>(a.dq), n4);
  return cudaGetLastError();
}

template <typename T>
cudaError_t OnePassHeadDim(const TcAttnParams& p, float* acc, int64_t n, cudaStream_t stream) {
  return p.args.head_dim == 64 ? RunOnePass<T, 64>(p, acc, n, stream)
                               : RunOnePass<T, 128>(p, acc, n, stream);
}

}  // namespace

bool AttentionTcOnePassRequested() {
  const char* v = std::getenv("PACKSCHED_ATTENTION_TC_BWD");
  return v != nullptr && std::strcmp(v, "onepass") == 0;
}

LaunchResult LaunchAttentionTcBackwardOnePass(const TcAttnParams& p, void* stream) {
  const AttentionArgs& a = p.args;
  if (a.total_q == 0 && a.total_k == 0) return ResultOf(cudaSuccess);
  const auto s = static_cast<cudaStream_t>(stream);
  // The float32 dq accumulator, stream-ordered: taken from its pool (AccumulatorPool) here and
  // handed back after the conversion has been enqueued.
  const int64_t n = a.total_q * a.heads * a.head_dim;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  float* acc = nullptr;
  if (n > 0) {
    cudaMemPool_t pool;
    cudaError_t e = AccumulatorPool(bytes, &pool);
    if (e == cudaSuccess) {
      e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&acc), bytes, pool, s);
    }
    if (e != cudaSuccess) return ResultOf(e);
  }
  const cudaError_t e = a.dtype == FloatType::kBf16 ? OnePassHeadDim<Bf16>(p, acc, n, s)
                                                    : OnePassHeadDim<Fp16>(p, acc, n, s);
  const cudaError_t freed = acc != nullptr ? cudaFreeAsync(acc, s) : cudaSuccess;
  return ResultOf(e != cudaSuccess ? e : freed);
}

}  // namespace packsched::kernels::internal::cuda
