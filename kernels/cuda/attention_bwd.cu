// The CUDA attention backward: pass 1 (dq per query tile) then pass 2 (dk, dv per key tile), both
// deterministic; 18 instantiations (2 kernels x fp16, bf16, fp32 x head-dim buckets 64, 128,
// 256). Device code in attention_device.cuh.

#include <cuda_runtime.h>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/attention_traits.h"
#include "kernels/cuda/launch.h"

namespace packsched::kernels::internal::cuda {

namespace {

template <typename T, int kD>
struct Backward {
  static cudaError_t Run(const AttentionArgs& a, cudaStream_t stream) {
    using Dq = AttnTraits<kD, AttnKernel::kBackwardDq>;
    using DkDv = AttnTraits<kD, AttnKernel::kBackwardDkDv>;
    if (a.total_q > 0) {
      const cudaError_t e = LaunchAttnKernel<Dq>(AttentionBackwardDqKernel<T, Dq>, a,
                                                 a.max_seqlen_q, Dq::kBr, a.heads,
                                                 /*keys=*/false, stream);
      if (e != cudaSuccess) return e;
    }
    if (a.total_k == 0) return cudaSuccess;
    return LaunchAttnKernel<DkDv>(AttentionBackwardDkDvKernel<T, DkDv>, a, a.max_seqlen_k,
                                  DkDv::kBc, a.kv_heads, /*keys=*/true, stream);
  }
};

}  // namespace

// With a query-row map: its runs uploaded first, dq of the rows outside it zeroed last
// (attention_query_runs.cuh).
LaunchResult LaunchAttentionBackward(const AttentionArgs& in, void* stream) {
  if (in.total_q == 0 && in.total_k == 0) return ResultOf(cudaSuccess);  // B = 0: maybe a tail
  const auto s = static_cast<cudaStream_t>(stream);
  AttentionArgs a = in;
  void* runs = nullptr;
  const cudaError_t uploaded = UploadQueryRuns(&a, s, &runs);
  if (uploaded != cudaSuccess) return ResultOf(uploaded);
  LaunchResult r = AttentionTcApplies(a)
                       ? LaunchAttentionTcBackward(TcAttnParams{a, a.subtree_end, a.positions}, s)
                       : ResultOf(DispatchAttention<Backward>(a, s));
  if (r.error == 0) r = ResultOf(EnqueueBlankRows(a, a.dq, nullptr, s));
  if (runs != nullptr) {
    const cudaError_t freed = cudaFreeAsync(runs, s);
    if (r.error == 0 && freed != cudaSuccess) r = ResultOf(freed);
  }
  return r;
}

}  // namespace packsched::kernels::internal::cuda
