// The one-pass tensor-core attention backward (attention_tc_bwd_onepass.cuh): launcher, its
// switch (PACKSCHED_ATTENTION_TC_BWD=onepass) and its 8 instantiations (the kernel and the dq
// conversion x fp16, bf16; the kernel x head dims 64, 96, 128).

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_tc_bwd_onepass.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/attention_tc_workspace.cuh"
#include "kernels/cuda/launch_result.cuh"

namespace packsched::kernels::internal::cuda {

namespace {

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
    if (!TcGrid(a, a.max_seqlen_k, Tr::kBc, a.kv_heads, /*keys=*/true, &grid) ||
        !TcGridFits32(grid)) {  // the heaviest-first order is computed in 32 bits
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
      acc, static_cast<T*>(a.dq), n4, static_cast<float>(a.scale));
  return cudaGetLastError();
}

template <typename T>
cudaError_t OnePassHeadDim(const TcAttnParams& p, float* acc, int64_t n, cudaStream_t stream) {
  return WithTcHeadDim(p.args.head_dim, [&](auto d) {
    return RunOnePass<T, decltype(d)::value>(p, acc, n, stream);
  });
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
  // One workspace, stream-ordered (TcWorkspaceAllocate): the D buffer, then the float32 dq
  // accumulator; handed back after the conversion has been enqueued.
  const int64_t n = a.total_q * a.heads * a.head_dim;
  const size_t d_bytes = TcDotOutBytes(a);
  TcAttnParams with_d = p;
  void* workspace = nullptr;
  float* acc = nullptr;
  if (n > 0) {
    cudaError_t e =
        TcWorkspaceAllocate(d_bytes + static_cast<size_t>(n) * sizeof(float), s, &workspace);
    if (e != cudaSuccess) return ResultOf(e);
    with_d.dout_dot_out = static_cast<const float*>(workspace);
    acc = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + d_bytes);
    e = EnqueueTcDotOut(p, static_cast<float*>(workspace), s);
    if (e != cudaSuccess) {
      cudaFreeAsync(workspace, s);
      return ResultOf(e);
    }
  }
  const cudaError_t e = a.dtype == FloatType::kBf16 ? OnePassHeadDim<Bf16>(with_d, acc, n, s)
                                                    : OnePassHeadDim<Fp16>(with_d, acc, n, s);
  const cudaError_t freed = workspace != nullptr ? cudaFreeAsync(workspace, s) : cudaSuccess;
  return ResultOf(e != cudaSuccess ? e : freed);
}

}  // namespace packsched::kernels::internal::cuda
