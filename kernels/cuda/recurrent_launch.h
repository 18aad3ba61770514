#ifndef PACKSCHED_KERNELS_CUDA_RECURRENT_LAUNCH_H_
#define PACKSCHED_KERNELS_CUDA_RECURRENT_LAUNCH_H_

// Launchers of the recurrent kernels (recurrent.cu); plain C++ types only, like launch.h.

#include "kernels/cuda/launch.h"
#include "kernels/internal/recurrent_args.h"

namespace packsched::kernels::internal::cuda {

// The forward, or with `backward` the gradients (ConvArgs' / RecurrenceArgs' backward fields).
LaunchResult LaunchCausalConv1d(const ConvArgs& a, bool backward, void* stream);
LaunchResult LaunchGatedRecurrence(const RecurrenceArgs& a, bool backward, void* stream);

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_RECURRENT_LAUNCH_H_
