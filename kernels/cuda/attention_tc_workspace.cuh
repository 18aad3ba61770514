#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_WORKSPACE_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_WORKSPACE_CUH_

// What both tensor-core backwards (attention_tc_bwd.cu, attention_tc_bwd_onepass.cu) set up before
// their kernels: a workspace in device memory, taken stream-ordered from a memory pool of the
// device's own, and in it the D buffer that the pre-pass (AttentionTcDotOutKernel,
// attention_tc_bwd.cuh) fills.

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/attention_tc_launch.h"

namespace packsched::kernels::internal::cuda {

// Takes `bytes` (> 0) of device memory of the current device, stream-ordered on `stream`
// (cudaMallocFromPoolAsync), into *ptr; the caller hands it back with cudaFreeAsync on the same
// stream after its last kernel. The pool, created on the device's first call, keeps up to the
// largest workspace asked for so far reserved (its release threshold), so that the next call
// gets its memory without mapping it again (as torch's caching allocator serves
// FlashAttention's), instead of the default pool's return of everything to the driver at each
// synchronisation. Pools live as long as the process. Thread-safe.
cudaError_t TcWorkspaceAllocate(size_t bytes, cudaStream_t stream, void** ptr);

// Bytes of the D buffer of `a` (total_q x heads floats), rounded up to 256 so that what follows it
// in a workspace stays aligned.
size_t TcDotOutBytes(const AttentionArgs& a);

// Enqueues the pre-pass on `stream`: dot_out [total_q, heads] = dO · O of every packed row and
// head of p.args (bf16 or fp16, head dim 64, 96 or 128). Nothing for total_q = 0.
cudaError_t EnqueueTcDotOut(const TcAttnParams& p, float* dot_out, cudaStream_t stream);

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_WORKSPACE_CUH_
