// absl::Status adapters over the CUDA launchers (kept out of the .cu file so nvcc never parses
// absl), each run under a DeviceGuard for the tensors' device.

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/recurrent_launch.h"
#include "kernels/cuda/tree_launch.h"
#include "kernels/internal/backend.h"

namespace packsched::kernels::internal::cuda {
namespace {

absl::Status ToStatus(absl::string_view op, const LaunchResult& r) {
  if (r.error == 0) return absl::OkStatus();
  if (r.no_device) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": no usable CUDA device (", r.message, ")"));
  }
  return absl::InternalError(absl::StrCat(op, ": CUDA error ", r.error, " (", r.message, ")"));
}

// Kernel launches (and cudaFuncSetAttribute) act on the calling thread's current device, which
// need not be the one the tensors live on (a trainer thread on cuda:0 handing over cuda:1
// tensors). The guard makes `device` current for its lifetime and restores the previous device,
// so the caller's thread state is unchanged. Not copyable. Known cost: since CUDA 12 cudaSetDevice
// initialises the device's primary context, so restoring a previous device that had none (a thread
// never pointed at its device) creates one there; torch's MaybeSetDevice avoids that through the
// driver API, which this library does not link.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    error_ = cudaGetDevice(&previous_);
    if (error_ != cudaSuccess || previous_ == device) return;
    error_ = cudaSetDevice(device);
    restore_ = error_ == cudaSuccess;
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }

  // cudaSuccess when `device` is current.
  cudaError_t error() const { return error_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  cudaError_t error_ = cudaSuccess;
};

// Runs launch() with `device` current. A guard failure reads like a launch failure (no device:
// FailedPrecondition; a bad device id: Internal).
template <typename Launch>
absl::Status OnDevice(absl::string_view op, int device, Launch launch) {
  const DeviceGuard guard(device);
  if (guard.error() != cudaSuccess) return ToStatus(op, ResultOf(guard.error()));
  return ToStatus(op, launch());
}

}  // namespace

absl::Status Unpad(const UnpadArgs& a, int device, void* stream) {
  return OnDevice("Unpad", device, [&] { return LaunchUnpad(a, stream); });
}
absl::Status Pad(const PadArgs& a, int device, void* stream) {
  return OnDevice("Pad", device, [&] { return LaunchPad(a, stream); });
}
absl::Status PackAligned(const PackAlignedArgs& a, int device, void* stream) {
  return OnDevice("PackAligned", device, [&] { return LaunchPackAligned(a, stream); });
}
absl::Status UnpackAligned(const UnpackAlignedArgs& a, int device, void* stream) {
  return OnDevice("UnpackAligned", device, [&] { return LaunchUnpackAligned(a, stream); });
}
absl::Status PositionIds(const PositionIdsArgs& a, int device, void* stream) {
  return OnDevice("PositionIds", device, [&] { return LaunchPositionIds(a, stream); });
}
absl::Status ShiftLabels(const ShiftLabelsArgs& a, int device, void* stream) {
  return OnDevice("ShiftLabels", device, [&] { return LaunchShiftLabels(a, stream); });
}
absl::Status PackedCrossEntropy(const CrossEntropyArgs& a, int device, void* stream) {
  return OnDevice("PackedCrossEntropy", device,
                  [&] { return LaunchPackedCrossEntropy(a, stream); });
}
absl::Status CpShard(const CpShardArgs& a, int device, void* stream) {
  return OnDevice("CpShard", device, [&] { return LaunchCpShard(a, stream); });
}
absl::Status CpUnshard(const CpShardArgs& a, int device, void* stream) {
  return OnDevice("CpUnshard", device, [&] { return LaunchCpUnshard(a, stream); });
}
absl::Status MropePositionIds(const MropeArgs& a, int device, void* stream) {
  return OnDevice("MropePositionIds", device, [&] { return LaunchMropePositionIds(a, stream); });
}
absl::Status AttentionForward(const AttentionArgs& a, int device, void* stream) {
  return OnDevice("VarlenAttentionForward", device,
                  [&] { return LaunchAttentionForward(a, stream); });
}
absl::Status AttentionBackward(const AttentionArgs& a, int device, void* stream) {
  return OnDevice("VarlenAttentionBackward", device,
                  [&] { return LaunchAttentionBackward(a, stream); });
}

}  // namespace packsched::kernels::internal::cuda

// Tree packing (tree.h).
namespace packsched::kernels::internal::cuda {

absl::Status TreePositionIds(const TreePositionsArgs& a, int device, void* stream) {
  return OnDevice("TreePositionIds", device, [&] { return LaunchTreePositionIds(a, stream); });
}
absl::Status MultiTargetCrossEntropy(const MultiTargetArgs& a, int device, void* stream) {
  return OnDevice("MultiTargetCrossEntropy", device,
                  [&] { return LaunchMultiTargetCrossEntropy(a, stream); });
}
absl::Status MultiTargetCrossEntropyBackward(const MultiTargetArgs& a, int device, void* stream) {
  return OnDevice("MultiTargetCrossEntropyBackward", device,
                  [&] { return LaunchMultiTargetCrossEntropyBackward(a, stream); });
}

}  // namespace packsched::kernels::internal::cuda

// Recurrent layers (recurrent.h).
namespace packsched::kernels::internal::cuda {

absl::Status CausalConv1dForward(const ConvArgs& a, int device, void* stream) {
  return OnDevice("CausalConv1dForward", device,
                  [&] { return LaunchCausalConv1d(a, /*backward=*/false, stream); });
}
absl::Status CausalConv1dBackward(const ConvArgs& a, int device, void* stream) {
  return OnDevice("CausalConv1dBackward", device,
                  [&] { return LaunchCausalConv1d(a, /*backward=*/true, stream); });
}
absl::Status GatedRecurrenceForward(const RecurrenceArgs& a, int device, void* stream) {
  return OnDevice("GatedRecurrenceForward", device,
                  [&] { return LaunchGatedRecurrence(a, /*backward=*/false, stream); });
}
absl::Status GatedRecurrenceBackward(const RecurrenceArgs& a, int device, void* stream) {
  return OnDevice("GatedRecurrenceBackward", device,
                  [&] { return LaunchGatedRecurrence(a, /*backward=*/true, stream); });
}

}  // namespace packsched::kernels::internal::cuda
