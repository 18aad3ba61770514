// absl::Status adapters over the CUDA launchers (kept out of the .cu file so nvcc never parses
// absl).

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/launch.h"
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

}  // namespace

absl::Status Unpad(const UnpadArgs& a, void* stream) {
  return ToStatus("Unpad", LaunchUnpad(a, stream));
}
absl::Status Pad(const PadArgs& a, void* stream) { return ToStatus("Pad", LaunchPad(a, stream)); }
absl::Status PackAligned(const PackAlignedArgs& a, void* stream) {
  return ToStatus("PackAligned", LaunchPackAligned(a, stream));
}
absl::Status UnpackAligned(const UnpackAlignedArgs& a, void* stream) {
  return ToStatus("UnpackAligned", LaunchUnpackAligned(a, stream));
}
absl::Status PositionIds(const PositionIdsArgs& a, void* stream) {
  return ToStatus("PositionIds", LaunchPositionIds(a, stream));
}
absl::Status ShiftLabels(const ShiftLabelsArgs& a, void* stream) {
  return ToStatus("ShiftLabels", LaunchShiftLabels(a, stream));
}
absl::Status PackedCrossEntropy(const CrossEntropyArgs& a, void* stream) {
  return ToStatus("PackedCrossEntropy", LaunchPackedCrossEntropy(a, stream));
}
absl::Status AttentionForward(const AttentionArgs& a, void* stream) {
  return ToStatus("VarlenAttentionForward", LaunchAttentionForward(a, stream));
}
absl::Status AttentionBackward(const AttentionArgs& a, void* stream) {
  return ToStatus("VarlenAttentionBackward", LaunchAttentionBackward(a, stream));
}

}  // namespace packsched::kernels::internal::cuda
