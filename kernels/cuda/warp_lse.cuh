#ifndef PACKSCHED_KERNELS_CUDA_WARP_LSE_CUH_
#define PACKSCHED_KERNELS_CUDA_WARP_LSE_CUH_

// The warp step of the CUDA row log-sum-exp reductions (cross_entropy.cu, tree_kernels.cu).

#include <cuda_runtime.h>

#include "kernels/common/elementwise.h"

namespace packsched::kernels::internal::cuda {

// Every lane of a full warp gets the log-sum-exp combine of all 32 lanes' partials `s`.
template <typename AccT>
__device__ LogSumExp<AccT> WarpLseCombine(LogSumExp<AccT> s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    LogSumExp<AccT> other;
    other.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
    s = LseCombine(s, other);
  }
  return s;
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_WARP_LSE_CUH_
