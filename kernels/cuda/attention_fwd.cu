// The CUDA attention forward: launcher and its 9 instantiations (fp16, bf16, fp32 x head-dim
// buckets 64, 128, 256). Device code in attention_device.cuh.

#include <cuda_runtime.h>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/attention_traits.h"
#include "kernels/cuda/launch.h"

namespace packsched::kernels::internal::cuda {

namespace {

template <typename T, int kD>
struct Forward {
  static cudaError_t Run(const AttentionArgs& a, cudaStream_t stream) {
    using Tr = AttnTraits<kD, AttnKernel::kForward>;
    return LaunchAttnKernel<Tr>(AttentionForwardKernel<T, Tr>, a, a.max_seqlen_q, Tr::kBr, a.heads,
                                /*keys=*/false, stream);
  }
};

}  // namespace

// With a query-row map: its runs uploaded first, the rows outside it blanked last
// (attention_query_runs.cuh).
LaunchResult LaunchAttentionForward(const AttentionArgs& in, void* stream) {
  if (in.total_q == 0) return ResultOf(cudaSuccess);  // B = 0 may still have tail rows
  const auto s = static_cast<cudaStream_t>(stream);
  AttentionArgs a = in;
  void* runs = nullptr;
  const cudaError_t uploaded = UploadQueryRuns(&a, s, &runs);
  if (uploaded != cudaSuccess) return ResultOf(uploaded);
  LaunchResult r = AttentionTcApplies(a)
                       ? LaunchAttentionTcForward(TcAttnParams{a, a.subtree_end, a.positions}, s)
                       : ResultOf(DispatchAttention<Forward>(a, s));
  if (r.error == 0) r = ResultOf(EnqueueBlankRows(a, a.out, static_cast<float*>(a.lse), s));
  if (runs != nullptr) {
    const cudaError_t freed = cudaFreeAsync(runs, s);
    if (r.error == 0 && freed != cudaSuccess) r = ResultOf(freed);
  }
  return r;
}

}  // namespace packsched::kernels::internal::cuda
