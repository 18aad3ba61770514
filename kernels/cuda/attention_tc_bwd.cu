// The tensor-core attention backward: launcher (the D pre-pass, pass 1 dq, then pass 2 dk/dv, all
// deterministic) and the passes' 18 instantiations (pass 1, pass 2 without and with a query-row
// map x fp16, bf16 x head dims 64, 96, 128).
// Device code in attention_tc_bwd.cuh (pre-pass, pass 1) and attention_tc_bwd_keys.cuh (pass 2).

#include <cuda_runtime.h>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_tc_bwd.cuh"
#include "kernels/cuda/attention_tc_bwd_keys.cuh"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/attention_tc_traits.h"
#include "kernels/cuda/attention_tc_workspace.cuh"
#include "kernels/cuda/launch_result.cuh"

namespace packsched::kernels::internal::cuda {

namespace {

// Both passes' grids must also have fewer than 2^32 blocks (TcGridFits32: their heaviest-first
// orders are computed in 32 bits).
template <typename Tr>
cudaError_t Launch(void (*kernel)(TcAttnParams), const TcAttnParams& p, int64_t longest, int tile,
                   int64_t heads, bool keys, cudaStream_t stream) {
  dim3 grid;
  if (!TcGrid(p.args, longest, tile, heads, keys, &grid) || !TcGridFits32(grid)) {
    return cudaErrorInvalidConfiguration;
  }
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
  // Pass 2 with a query-row map is an instantiation of its own (attention_tc_bwd_keys.cuh).
  auto* dkdv = a.query_runs != nullptr ? AttentionTcBackwardDkDvKernel<T, kD, true>
                                       : AttentionTcBackwardDkDvKernel<T, kD, false>;
  return Launch<DkDv>(dkdv, p, a.max_seqlen_k, DkDv::kBc, a.kv_heads, /*keys=*/true, stream);
}

template <typename T>
cudaError_t BackwardHeadDim(const TcAttnParams& p, cudaStream_t stream) {
  return WithTcHeadDim(p.args.head_dim,
                       [&](auto d) { return RunBackward<T, decltype(d)::value>(p, stream); });
}

}  // namespace

LaunchResult LaunchAttentionTcBackward(const TcAttnParams& p, void* stream) {
  if (p.args.total_q == 0 && p.args.total_k == 0) return ResultOf(cudaSuccess);
  // The one-pass backward takes no query-row map: with one, the two passes run.
  if (AttentionTcOnePassRequested() && p.args.query_runs == nullptr) {
    return LaunchAttentionTcBackwardOnePass(p, stream);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  // The D buffer, stream-ordered: taken from the workspace pool here, filled by the pre-pass,
  // handed back after pass 2 has been enqueued.
  TcAttnParams with_d = p;
  void* workspace = nullptr;
  if (p.args.total_q > 0) {
    cudaError_t e = TcWorkspaceAllocate(TcDotOutBytes(p.args), s, &workspace);
    if (e != cudaSuccess) return ResultOf(e);
    with_d.dout_dot_out = static_cast<const float*>(workspace);
    e = EnqueueTcDotOut(p, static_cast<float*>(workspace), s);
    if (e != cudaSuccess) {
      cudaFreeAsync(workspace, s);
      return ResultOf(e);
    }
  }
  const cudaError_t e = p.args.dtype == FloatType::kBf16 ? BackwardHeadDim<Bf16>(with_d, s)
                                                         : BackwardHeadDim<Fp16>(with_d, s);
  const cudaError_t freed = workspace != nullptr ? cudaFreeAsync(workspace, s) : cudaSuccess;
  return ResultOf(e != cudaSuccess ? e : freed);
}

}  // namespace packsched::kernels::internal::cuda
