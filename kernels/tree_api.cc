// The front end of the tree-packing kernels (tree.h): validates every argument on the host, fills
// internal::TreePositionsArgs / MultiTargetArgs and dispatches on the device type.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/internal/backend.h"
#include "kernels/internal/validate.h"
#include "packsched/kernels/tree.h"
#include "server/base/status_macros.h"

namespace packsched::kernels {
namespace {

using internal::Backend;
using internal::CallDevice;
using internal::CheckedSeqlens;
using internal::CheckShape;
using internal::CheckTensor;
using internal::Data;
using internal::FloatType;
using internal::Invalid;
using internal::MultiTargetArgs;

// logits [R, V], rows and labels [T] (one integer dtype), loss-like tensors [T] and [R] in the
// accumulation type: what the forward and backward share.
absl::StatusOr<MultiTargetArgs> CheckTargets(absl::string_view op, const DLTensor& logits,
                                             const DLTensor& rows, const DLTensor& labels,
                                             const CallDevice& call) {
  MultiTargetArgs a{};
  RETURN_IF_ERROR(CheckTensor(op, "logits", &logits, call));
  ASSIGN_OR_RETURN(a.dtype, internal::FloatTypeOf(op, "logits", logits));
  if (logits.ndim != 2 || logits.shape[1] < 1) {
    return Invalid(op, absl::StrCat("logits must have shape [R, V] with V >= 1, got ",
                                    internal::ShapeString(logits)));
  }
  RETURN_IF_ERROR(CheckTensor(op, "rows", &rows, call));
  ASSIGN_OR_RETURN(a.index_64, internal::IsInt64Ids(op, "rows", rows));
  if (rows.ndim != 1) {
    return Invalid(op, absl::StrCat("rows must be [T], got ", internal::ShapeString(rows)));
  }
  RETURN_IF_ERROR(CheckTensor(op, "labels", &labels, call));
  RETURN_IF_ERROR(internal::CheckSameDType(op, "labels", labels, "rows", rows));
  RETURN_IF_ERROR(CheckShape(op, "labels", labels, {rows.shape[0]}, "[T] (rows' length)"));
  a.logits = Data(logits);
  a.num_rows = logits.shape[0];
  a.vocab = logits.shape[1];
  a.targets = rows.shape[0];
  a.rows = Data(rows);
  a.labels = Data(labels);
  return a;
}

absl::Status CheckAcc(absl::string_view op, absl::string_view name, const DLTensor& t,
                      int64_t length, absl::string_view meaning, const MultiTargetArgs& a,
                      const CallDevice& call) {
  RETURN_IF_ERROR(CheckTensor(op, name, &t, call));
  RETURN_IF_ERROR(
      internal::CheckDType(op, name, t, kDLFloat, a.dtype == FloatType::kF64 ? 64 : 32));
  return CheckShape(op, name, t, {length}, meaning);
}

}  // namespace

absl::Status TreePositionIds(const Seqlens& seqlens, const DLTensor& subtree_end,
                             const DLTensor& position_ids, Stream stream) {
  constexpr absl::string_view op = "TreePositionIds";
  ASSIGN_OR_RETURN(const Backend backend, internal::BackendOf(op, "subtree_end", &subtree_end));
  const CallDevice call{subtree_end.device, "subtree_end"};
  ASSIGN_OR_RETURN(const CheckedSeqlens cu,
                   internal::CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckTensor(op, "subtree_end", &subtree_end, call));
  RETURN_IF_ERROR(internal::CheckDType(op, "subtree_end", subtree_end, kDLInt, 32));
  RETURN_IF_ERROR(CheckShape(op, "subtree_end", subtree_end, {cu.rows}, "[rows]"));
  RETURN_IF_ERROR(CheckTensor(op, "position_ids", &position_ids, call));
  RETURN_IF_ERROR(internal::CheckDType(op, "position_ids", position_ids, kDLInt, 64));
  RETURN_IF_ERROR(CheckShape(op, "position_ids", position_ids, {cu.rows}, "[rows]"));
  internal::TreePositionsArgs a{};
  a.cu = cu.device;
  a.subtree_end = static_cast<const int32_t*>(Data(subtree_end));
  a.batch = cu.batch;
  a.rows = cu.rows;
  a.position_ids = static_cast<int64_t*>(Data(position_ids));
  return backend == Backend::kHost
             ? internal::cpu::TreePositionIds(a)
             : internal::cuda::TreePositionIds(a, call.device.device_id, stream);
}

absl::Status MultiTargetCrossEntropy(const DLTensor& logits, const DLTensor& rows,
                                     const DLTensor& labels, const DLTensor& loss,
                                     const DLTensor& row_lse, Stream stream) {
  constexpr absl::string_view op = "MultiTargetCrossEntropy";
  ASSIGN_OR_RETURN(const Backend backend, internal::BackendOf(op, "logits", &logits));
  const CallDevice call{logits.device, "logits"};
  ASSIGN_OR_RETURN(MultiTargetArgs a, CheckTargets(op, logits, rows, labels, call));
  RETURN_IF_ERROR(CheckAcc(op, "loss", loss, a.targets, "[T]", a, call));
  RETURN_IF_ERROR(CheckAcc(op, "row_lse", row_lse, a.num_rows, "[R]", a, call));
  a.loss = Data(loss);
  a.row_lse = Data(row_lse);
  return backend == Backend::kHost
             ? internal::cpu::MultiTargetCrossEntropy(a)
             : internal::cuda::MultiTargetCrossEntropy(a, call.device.device_id, stream);
}

absl::Status MultiTargetCrossEntropyBackward(const DLTensor& logits, const DLTensor& row_lse,
                                             const DLTensor& rows, const DLTensor& labels,
                                             const DLTensor& d_loss, const DLTensor& d_logits,
                                             Stream stream) {
  constexpr absl::string_view op = "MultiTargetCrossEntropyBackward";
  ASSIGN_OR_RETURN(const Backend backend, internal::BackendOf(op, "logits", &logits));
  const CallDevice call{logits.device, "logits"};
  ASSIGN_OR_RETURN(MultiTargetArgs a, CheckTargets(op, logits, rows, labels, call));
  RETURN_IF_ERROR(CheckAcc(op, "row_lse", row_lse, a.num_rows, "[R]", a, call));
  RETURN_IF_ERROR(CheckAcc(op, "d_loss", d_loss, a.targets, "[T]", a, call));
  RETURN_IF_ERROR(CheckTensor(op, "d_logits", &d_logits, call));
  RETURN_IF_ERROR(internal::CheckSameDType(op, "d_logits", d_logits, "logits", logits));
  RETURN_IF_ERROR(CheckShape(op, "d_logits", d_logits, {a.num_rows, a.vocab}, "[R, V]"));
  a.row_lse = Data(row_lse);
  a.d_loss = Data(d_loss);
  a.d_logits = Data(d_logits);
  return backend == Backend::kHost
             ? internal::cpu::MultiTargetCrossEntropyBackward(a)
             : internal::cuda::MultiTargetCrossEntropyBackward(a, call.device.device_id, stream);
}

}  // namespace packsched::kernels
