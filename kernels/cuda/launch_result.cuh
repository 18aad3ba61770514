#ifndef PACKSCHED_KERNELS_CUDA_LAUNCH_RESULT_CUH_
#define PACKSCHED_KERNELS_CUDA_LAUNCH_RESULT_CUH_

// cudaError_t -> LaunchResult, for the .cu translation units (the kernel families and the
// attention launchers) and cuda_backend.cc's device guard; launch.h stays free of CUDA headers.

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

namespace packsched::kernels::internal::cuda {

// The launch status; no_device when the runtime found no usable GPU or driver.
inline LaunchResult ResultOf(cudaError_t e) {
  LaunchResult r;
  r.error = static_cast<int>(e);
  r.no_device = e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
                e == cudaErrorInitializationError;
  r.message = cudaGetErrorString(e);
  return r;
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_LAUNCH_RESULT_CUH_
