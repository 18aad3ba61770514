// The CUDA entry points of a build without CUDA (PACKSCHED_WITH_CUDA=OFF or no nvcc): CUDA
// tensors are still recognised, and rejected with a clear message instead of a link error.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/internal/backend.h"
#include "kernels/internal/recurrent_args.h"

namespace packsched::kernels::internal::cuda {
namespace {

absl::Status NotBuilt(absl::string_view op) {
  return absl::UnimplementedError(
      absl::StrCat(op,
                   ": the tensors are CUDA tensors but packsched was built without CUDA "
                   "(PACKSCHED_WITH_CUDA=OFF or nvcc not found)"));
}

}  // namespace

absl::Status Unpad(const UnpadArgs&, int, void*) { return NotBuilt("Unpad"); }
absl::Status Pad(const PadArgs&, int, void*) { return NotBuilt("Pad"); }
absl::Status PackAligned(const PackAlignedArgs&, int, void*) { return NotBuilt("PackAligned"); }
absl::Status UnpackAligned(const UnpackAlignedArgs&, int, void*) {
  return NotBuilt("UnpackAligned");
}
absl::Status PositionIds(const PositionIdsArgs&, int, void*) { return NotBuilt("PositionIds"); }
absl::Status ShiftLabels(const ShiftLabelsArgs&, int, void*) { return NotBuilt("ShiftLabels"); }
absl::Status PackedCrossEntropy(const CrossEntropyArgs&, int, void*) {
  return NotBuilt("PackedCrossEntropy");
}
absl::Status CpShard(const CpShardArgs&, int, void*) { return NotBuilt("CpShard"); }
absl::Status CpUnshard(const CpShardArgs&, int, void*) { return NotBuilt("CpUnshard"); }
absl::Status MropePositionIds(const MropeArgs&, int, void*) { return NotBuilt("MropePositionIds"); }
absl::Status AttentionForward(const AttentionArgs&, int, void*) {
  return NotBuilt("VarlenAttentionForward");
}
absl::Status AttentionBackward(const AttentionArgs&, int, void*) {
  return NotBuilt("VarlenAttentionBackward");
}

}  // namespace packsched::kernels::internal::cuda

// Tree packing (tree.h).
namespace packsched::kernels::internal::cuda {

absl::Status TreePositionIds(const TreePositionsArgs&, int, void*) {
  return NotBuilt("TreePositionIds");
}
absl::Status MultiTargetCrossEntropy(const MultiTargetArgs&, int, void*) {
  return NotBuilt("MultiTargetCrossEntropy");
}
absl::Status MultiTargetCrossEntropyBackward(const MultiTargetArgs&, int, void*) {
  return NotBuilt("MultiTargetCrossEntropyBackward");
}

}  // namespace packsched::kernels::internal::cuda

// Recurrent layers (recurrent.h).
namespace packsched::kernels::internal::cuda {

absl::Status CausalConv1dForward(const ConvArgs&, int, void*) {
  return NotBuilt("CausalConv1dForward");
}
absl::Status CausalConv1dBackward(const ConvArgs&, int, void*) {
  return NotBuilt("CausalConv1dBackward");
}
absl::Status GatedRecurrenceForward(const RecurrenceArgs&, int, void*) {
  return NotBuilt("GatedRecurrenceForward");
}
absl::Status GatedRecurrenceBackward(const RecurrenceArgs&, int, void*) {
  return NotBuilt("GatedRecurrenceBackward");
}

}  // namespace packsched::kernels::internal::cuda
