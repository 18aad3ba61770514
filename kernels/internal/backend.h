#ifndef PACKSCHED_KERNELS_INTERNAL_BACKEND_H_
#define PACKSCHED_KERNELS_INTERNAL_BACKEND_H_

// The interface between the validating front end (kernels.cc) and the backends (cpu/, cuda/).
// Arguments arrive checked: pointers already include the DLTensor byte offset, sizes agree, and
// host metadata is consistent. Pointers are device pointers on the CUDA backend. A backend
// function returns only the errors its own doc comment names.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/internal/args.h"
#include "kernels/internal/attention_args.h"
#include "kernels/internal/tree_args.h"

namespace packsched::kernels::internal {

namespace cpu {
// Return InvalidArgument only for the data-dependent checks named in kernels.h.
absl::Status Unpad(const UnpadArgs& a);
absl::Status Pad(const PadArgs& a);
absl::Status PackAligned(const PackAlignedArgs& a);
absl::Status UnpackAligned(const UnpackAlignedArgs& a);
absl::Status PositionIds(const PositionIdsArgs& a);
absl::Status ShiftLabels(const ShiftLabelsArgs& a);
absl::Status PackedCrossEntropy(const CrossEntropyArgs& a);
absl::Status CpShard(const CpShardArgs& a);
absl::Status CpUnshard(const CpShardArgs& a);
// Returns InvalidArgument when token types and grids disagree (context_parallel.h).
absl::Status MropePositionIds(const MropeArgs& a);
// Return InvalidArgument only for seqused values outside [0, segment length] and tree values
// out of range (attention.h).
absl::Status AttentionForward(const AttentionArgs& a);
absl::Status AttentionBackward(const AttentionArgs& a);
}  // namespace cpu

namespace cuda {
// Launch asynchronously on `stream` with `device` (the tensors' DLDevice::device_id) as the calling
// thread's current CUDA device, restoring the previous current device before returning; return
// FailedPrecondition when the CUDA runtime has no usable device and Internal for any other error
// (including a `device` the runtime cannot select).
absl::Status Unpad(const UnpadArgs& a, int device, void* stream);
absl::Status Pad(const PadArgs& a, int device, void* stream);
absl::Status PackAligned(const PackAlignedArgs& a, int device, void* stream);
absl::Status UnpackAligned(const UnpackAlignedArgs& a, int device, void* stream);
absl::Status PositionIds(const PositionIdsArgs& a, int device, void* stream);
absl::Status ShiftLabels(const ShiftLabelsArgs& a, int device, void* stream);
absl::Status PackedCrossEntropy(const CrossEntropyArgs& a, int device, void* stream);
absl::Status CpShard(const CpShardArgs& a, int device, void* stream);
absl::Status CpUnshard(const CpShardArgs& a, int device, void* stream);
absl::Status MropePositionIds(const MropeArgs& a, int device, void* stream);
absl::Status AttentionForward(const AttentionArgs& a, int device, void* stream);
absl::Status AttentionBackward(const AttentionArgs& a, int device, void* stream);
}  // namespace cuda

// Tree packing (tree.h), with the same contracts as above: the CPU functions return
// InvalidArgument only for the value checks tree.h names.
namespace cpu {
absl::Status TreePositionIds(const TreePositionsArgs& a);
absl::Status MultiTargetCrossEntropy(const MultiTargetArgs& a);
absl::Status MultiTargetCrossEntropyBackward(const MultiTargetArgs& a);
}  // namespace cpu
namespace cuda {
absl::Status TreePositionIds(const TreePositionsArgs& a, int device, void* stream);
absl::Status MultiTargetCrossEntropy(const MultiTargetArgs& a, int device, void* stream);
absl::Status MultiTargetCrossEntropyBackward(const MultiTargetArgs& a, int device, void* stream);
}  // namespace cuda

}  // namespace packsched::kernels::internal

#endif  // PACKSCHED_KERNELS_INTERNAL_BACKEND_H_
