#ifndef PACKSCHED_KERNELS_CUDA_LAUNCH_H_
#define PACKSCHED_KERNELS_CUDA_LAUNCH_H_

// Launchers of the CUDA backend, one .cu file per kernel family. Plain C++ types only: the .cu
// translation units include no absl; cuda_backend.cc turns a LaunchResult into an absl::Status.

#include "kernels/internal/args.h"
#include "kernels/internal/attention_args.h"

namespace packsched::kernels::internal::cuda {

struct LaunchResult {
  int error = 0;             // cudaError_t; 0 = success
  bool no_device = false;    // the runtime found no usable GPU / driver
  const char* message = "";  // cudaGetErrorString(error)
};

// Each enqueues its kernels on `stream` (a cudaStream_t) and returns the launch status.

// unpad_pad.cu
LaunchResult LaunchUnpad(const UnpadArgs& a, void* stream);
LaunchResult LaunchPad(const PadArgs& a, void* stream);
// aligned.cu
LaunchResult LaunchPackAligned(const PackAlignedArgs& a, void* stream);
LaunchResult LaunchUnpackAligned(const UnpackAlignedArgs& a, void* stream);
// positions_labels.cu
LaunchResult LaunchPositionIds(const PositionIdsArgs& a, void* stream);
LaunchResult LaunchShiftLabels(const ShiftLabelsArgs& a, void* stream);
// cross_entropy.cu
LaunchResult LaunchPackedCrossEntropy(const CrossEntropyArgs& a, void* stream);
// context_parallel.cu
LaunchResult LaunchCpShard(const CpShardArgs& a, void* stream);
LaunchResult LaunchCpUnshard(const CpShardArgs& a, void* stream);
LaunchResult LaunchMropePositionIds(const MropeArgs& a, void* stream);
// attention_fwd.cu, attention_bwd.cu (the backward enqueues two kernels).
LaunchResult LaunchAttentionForward(const AttentionArgs& a, void* stream);
LaunchResult LaunchAttentionBackward(const AttentionArgs& a, void* stream);

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_LAUNCH_H_
