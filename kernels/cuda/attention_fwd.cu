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

LaunchResult LaunchAttentionForward(const AttentionArgs& a, void* stream) {
  if (a.total_q == 0) return ResultOf(cudaSuccess);  // B = 0 may still have tail rows
  if (AttentionTcApplies(a))
    return LaunchAttentionTcForward(TcAttnParams{a, a.subtree_end, a.positions}, stream);
  return ResultOf(DispatchAttention<Forward>(a, static_cast<cudaStream_t>(stream)));
}

}  // namespace packsched::kernels::internal::cuda
