// The tensor-core attention backward: launcher (pass 1 dq, then pass 2 dk/dv, both
// deterministic) and its 8 instantiations (2 kernels x fp16, bf16 x head dims 64, 128). Device
// code in attention_tc_bwd.cuh.

#include <cuda_runtime.h>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_tc_bwd.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/attention_tc_traits.h"
#include "kernels/cuda/launch_result.cuh"

namespace packsched::kernels::internal::cuda {

namespace {

template <typename Tr>
cudaError_t Launch(void (*kernel)(TcAttnParams), const TcAttnParams& p, int64_t longest, int tile,
                   int64_t heads, bool keys, cudaStream_t stream) {
  dim3 grid;
  if (!TcGrid(p.args, longest, tile, heads, keys, &grid)) return cudaErrorInvalidConfiguration;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(Tr::kSharedBytes));
  if (e != cudaSuccess) return e;
  kernel<<<grid, Tr::kThreads, Tr::kSharedBytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int kD>
cudaError_t RunBackward(const TcAttnParams& p, cudaStream_t stream) {
  using Dq = TcTraits<kD, TcKernel::kBackwardDq>;
  using DkDv = TcTraits<kD, TcKernel::kBackwardDkDv>;
  const AttentionArgs& a = p.args;
  if (a.total_q > 0) {
    const cudaError_t e = Launch<Dq>(AttentionTcBackwardDqKernel<T, kD>, p, a.max_seqlen_q, Dq::kBr,
                                     a.heads, /*keys=*/false, stream);
    if (e != cudaSuccess) return e;
  }
  if (a.total_k == 0) return cudaSuccess;
  return Launch<DkDv>(AttentionTcBackwardDkDvKernel<T, kD>, p, a.max_seqlen_k, DkDv::kBc,
                      a.kv_heads, /*keys=*/true, stream);
}

template <typename T>
cudaError_t BackwardHeadDim(const TcAttnParams& p, cudaStream_t stream) {
  return p.args.head_dim == 64 ? RunBackward<T, 64>(p, stream) : RunBackward<T, 128>(p, stream);
}

}  // namespace

LaunchResult LaunchAttentionTcBackward(const TcAttnParams& p, void* stream) {
  if (p.args.total_q == 0 && p.args.total_k == 0) return ResultOf(cudaSuccess);
  if (AttentionTcOnePassRequested()) return LaunchAttentionTcBackwardOnePass(p, stream);
  const auto s = static_cast<cudaStream_t>(stream);
  return ResultOf(p.args.dtype == FloatType::kBf16 ? BackwardHeadDim<Bf16>(p, s)
                                                   : BackwardHeadDim<Fp16>(p, s));
}

}  // namespace packsched::kernels::internal::cuda
