#ifndef PACKSCHED_KERNELS_CUDA_TREE_LAUNCH_H_
#define PACKSCHED_KERNELS_CUDA_TREE_LAUNCH_H_

// Launchers of the tree-packing kernels (tree_kernels.cu); plain C++ types only, like launch.h.

#include "kernels/cuda/launch.h"
#include "kernels/internal/tree_args.h"

namespace packsched::kernels::internal::cuda {

LaunchResult LaunchTreePositionIds(const TreePositionsArgs& a, void* stream);
LaunchResult LaunchMultiTargetCrossEntropy(const MultiTargetArgs& a, void* stream);
LaunchResult LaunchMultiTargetCrossEntropyBackward(const MultiTargetArgs& a, void* stream);

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_TREE_LAUNCH_H_
