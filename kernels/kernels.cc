// The front end of the kernel API: validates every argument on the host (so no backend ever sees
// an inconsistent call and no check needs a device sync), turns DLTensor views into the plain
// pointers of internal/args.h, and dispatches on the device type.

#include "packsched/kernels/kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/common/elementwise.h"
#include "kernels/common/half.h"
#include "kernels/internal/backend.h"
#include "kernels/internal/validate.h"
#include "server/base/status_macros.h"

namespace packsched::kernels {
namespace {

using internal::Backend;
using internal::BackendOf;
using internal::CallDevice;
using internal::CheckCopyableDType;
using internal::CheckCuValues;
using internal::CheckDType;
using internal::CheckedSeqlens;
using internal::CheckNoTail;
using internal::CheckPaddedCovers;
using internal::CheckRows;
using internal::CheckSameDType;
using internal::CheckSeqlens;
using internal::CheckShape;
using internal::CheckTensor;
using internal::Data;
using internal::DTypeName;
using internal::ElementBytes;
using internal::FillPattern;
using internal::FloatType;
using internal::FloatTypeOf;
using internal::Invalid;
using internal::Is;
using internal::IsInt64Ids;
using internal::kDLBoolCode;
using internal::RowBytes;
using internal::ShapeString;
using internal::WithTrailing;

}  // namespace

bool BuiltWithCuda() {
#if PACKSCHED_KERNELS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::Status Unpad(const DLTensor& x, const DLTensor& mask, const Seqlens& seqlens,
                   const DLTensor& x_packed, const DLTensor& indices, Stream stream) {
  constexpr absl::string_view op = "Unpad";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "x", &x));
  const CallDevice call{x.device, "x"};
  RETURN_IF_ERROR(CheckTensor(op, "x", &x, call));
  RETURN_IF_ERROR(CheckCopyableDType(op, "x", x));
  if (x.ndim < 2) {
    return Invalid(op, absl::StrCat("x must have shape [B, S, ...], got ", ShapeString(x)));
  }
  const int64_t batch = x.shape[0];
  const int64_t seqlen = x.shape[1];
  RETURN_IF_ERROR(CheckTensor(op, "mask", &mask, call));
  RETURN_IF_ERROR(CheckShape(op, "mask", mask, {batch, seqlen}, "[B, S]"));
  int mask_bytes = 0;
  if (Is(mask.dtype, kDLBoolCode, 8) || Is(mask.dtype, kDLUInt, 8) || Is(mask.dtype, kDLInt, 8)) {
    mask_bytes = 1;
  } else if (Is(mask.dtype, kDLInt, 32)) {
    mask_bytes = 4;
  } else if (Is(mask.dtype, kDLInt, 64)) {
    mask_bytes = 8;
  } else {
    return Invalid(op, absl::StrCat("unsupported dtype for mask: ", DTypeName(mask.dtype),
                                    " (bool, int8, uint8, int32 or int64)"));
  }
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckNoTail(op, "cu_seqlens", cu));
  if (cu.batch != batch) {
    return Invalid(
        op, absl::StrCat("cu_seqlens has B = ", cu.batch, " sequences but x has B = ", batch));
  }
  if (cu.max_len > seqlen) {
    return Invalid(op, absl::StrCat("cu_seqlens has a sequence of ", cu.max_len,
                                    " tokens, more than the mask's row length S = ", seqlen));
  }
  RETURN_IF_ERROR(CheckTensor(op, "x_packed", &x_packed, call));
  RETURN_IF_ERROR(CheckSameDType(op, "x_packed", x_packed, "x", x));
  RETURN_IF_ERROR(
      CheckShape(op, "x_packed", x_packed, WithTrailing({cu.total}, x, 2), "[total, ...]"));
  RETURN_IF_ERROR(CheckTensor(op, "indices", &indices, call));
  RETURN_IF_ERROR(CheckDType(op, "indices", indices, kDLInt, 64));
  RETURN_IF_ERROR(CheckShape(op, "indices", indices, {cu.total}, "[total]"));

  internal::UnpadArgs a;
  a.x = Data(x);
  a.mask = Data(mask);
  a.mask_bytes = mask_bytes;
  a.cu = cu.device;
  a.cu_host = cu.host;
  a.batch = batch;
  a.seqlen = seqlen;
  a.row_bytes = RowBytes(x, 2);
  a.total = cu.total;
  a.x_packed = Data(x_packed);
  a.indices = static_cast<int64_t*>(Data(indices));
  return backend == Backend::kHost ? internal::cpu::Unpad(a)
                                   : internal::cuda::Unpad(a, call.device.device_id, stream);
}

absl::Status Pad(const DLTensor& x_packed, const DLTensor& indices, const DLTensor& x,
                 Stream stream) {
  constexpr absl::string_view op = "Pad";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "x_packed", &x_packed));
  const CallDevice call{x_packed.device, "x_packed"};
  RETURN_IF_ERROR(CheckTensor(op, "x_packed", &x_packed, call));
  RETURN_IF_ERROR(CheckCopyableDType(op, "x_packed", x_packed));
  if (x_packed.ndim < 1) {
    return Invalid(
        op, absl::StrCat("x_packed must have shape [total, ...], got ", ShapeString(x_packed)));
  }
  const int64_t total = x_packed.shape[0];
  RETURN_IF_ERROR(CheckTensor(op, "indices", &indices, call));
  RETURN_IF_ERROR(CheckDType(op, "indices", indices, kDLInt, 64));
  RETURN_IF_ERROR(CheckShape(op, "indices", indices, {total}, "[total]"));
  RETURN_IF_ERROR(CheckTensor(op, "x", &x, call));
  RETURN_IF_ERROR(CheckSameDType(op, "x", x, "x_packed", x_packed));
  if (x.ndim != x_packed.ndim + 1) {
    return Invalid(op, absl::StrCat("x must have shape [B, S, ...] with x_packed's trailing "
                                    "dimensions, got ",
                                    ShapeString(x), " for x_packed ", ShapeString(x_packed)));
  }
  RETURN_IF_ERROR(
      CheckShape(op, "x", x, WithTrailing({x.shape[0], x.shape[1]}, x_packed, 1), "[B, S, ...]"));

  internal::PadArgs a;
  a.x_packed = Data(x_packed);
  a.indices = static_cast<const int64_t*>(Data(indices));
  a.total = total;
  a.row_bytes = RowBytes(x_packed, 1);
  a.rows_out = x.shape[0] * x.shape[1];
  a.x = Data(x);
  return backend == Backend::kHost ? internal::cpu::Pad(a)
                                   : internal::cuda::Pad(a, call.device.device_id, stream);
}

absl::StatusOr<std::vector<int32_t>> AlignedCuSeqlens(absl::Span<const int32_t> cu_seqlens,
                                                      int64_t align) {
  constexpr absl::string_view op = "AlignedCuSeqlens";
  RETURN_IF_ERROR(CheckCuValues(op, "cu_seqlens", cu_seqlens));
  if (align < 1 || align > std::numeric_limits<int32_t>::max()) {
    return Invalid(op, absl::StrCat("align must be in [1, 2^31), got ", align));
  }
  std::vector<int32_t> out(cu_seqlens.size());
  int64_t offset = 0;
  for (size_t b = 0; b + 1 < cu_seqlens.size(); ++b) {
    offset += AlignUp(cu_seqlens[b + 1] - cu_seqlens[b], align);
    if (offset > std::numeric_limits<int32_t>::max()) {
      return Invalid(op, absl::StrCat("the padded total exceeds int32 at sequence ", b));
    }
    out[b + 1] = static_cast<int32_t>(offset);
  }
  return out;
}

absl::Status PackAligned(const DLTensor& x_packed, const Seqlens& seqlens, int64_t align,
                         int64_t rows, double pad_value, const DLTensor& x_aligned,
                         const DLTensor& cu_seqlens_padded, const DLTensor& seqused,
                         Stream stream) {
  constexpr absl::string_view op = "PackAligned";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "x_packed", &x_packed));
  const CallDevice call{x_packed.device, "x_packed"};
  RETURN_IF_ERROR(CheckTensor(op, "x_packed", &x_packed, call));
  RETURN_IF_ERROR(CheckCopyableDType(op, "x_packed", x_packed));
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckNoTail(op, "cu_seqlens", cu));
  RETURN_IF_ERROR(CheckRows(op, "x_packed", x_packed, cu, "cu_seqlens"));
  if (align < 1) return Invalid(op, absl::StrCat("align must be >= 1, got ", align));
  ASSIGN_OR_RETURN(const std::vector<int32_t> padded,
                   AlignedCuSeqlens(absl::MakeConstSpan(cu.host, cu.batch + 1), align));
  if (rows != -1 && rows < padded.back()) {
    return Invalid(op, absl::StrCat("rows = ", rows,
                                    " must be -1 (no tail) or at least the "
                                    "padded total ",
                                    padded.back()));
  }
  const int64_t aligned_rows = rows == -1 ? padded.back() : rows;
  RETURN_IF_ERROR(CheckTensor(op, "x_aligned", &x_aligned, call));
  RETURN_IF_ERROR(CheckSameDType(op, "x_aligned", x_aligned, "x_packed", x_packed));
  RETURN_IF_ERROR(CheckShape(op, "x_aligned", x_aligned, WithTrailing({aligned_rows}, x_packed, 1),
                             rows == -1 ? "[total_padded, ...]" : "[rows, ...]"));
  RETURN_IF_ERROR(CheckTensor(op, "cu_seqlens_padded", &cu_seqlens_padded, call));
  RETURN_IF_ERROR(CheckDType(op, "cu_seqlens_padded", cu_seqlens_padded, kDLInt, 32));
  RETURN_IF_ERROR(
      CheckShape(op, "cu_seqlens_padded", cu_seqlens_padded, {cu.batch + 1}, "[B + 1]"));
  RETURN_IF_ERROR(CheckTensor(op, "seqused", &seqused, call));
  RETURN_IF_ERROR(CheckDType(op, "seqused", seqused, kDLInt, 32));
  RETURN_IF_ERROR(CheckShape(op, "seqused", seqused, {cu.batch}, "[B]"));

  internal::PackAlignedArgs a;
  RETURN_IF_ERROR(FillPattern(op, pad_value, x_packed.dtype, a.pad_pattern));
  a.x_packed = Data(x_packed);
  a.cu = cu.device;
  a.cu_padded_host = padded.data();
  a.batch = cu.batch;
  a.total = cu.total;
  a.total_padded = padded.back();
  a.rows = aligned_rows;
  a.row_bytes = RowBytes(x_packed, 1);
  a.elem_bytes = ElementBytes(x_packed.dtype);
  a.align = align;
  a.x_aligned = Data(x_aligned);
  a.cu_padded = static_cast<int32_t*>(Data(cu_seqlens_padded));
  a.seqused = static_cast<int32_t*>(Data(seqused));
  return backend == Backend::kHost ? internal::cpu::PackAligned(a)
                                   : internal::cuda::PackAligned(a, call.device.device_id, stream);
}

absl::Status UnpackAligned(const DLTensor& x_aligned, const Seqlens& seqlens,
                           const Seqlens& seqlens_padded, const DLTensor& x_packed, Stream stream) {
  constexpr absl::string_view op = "UnpackAligned";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "x_aligned", &x_aligned));
  const CallDevice call{x_aligned.device, "x_aligned"};
  RETURN_IF_ERROR(CheckTensor(op, "x_aligned", &x_aligned, call));
  RETURN_IF_ERROR(CheckCopyableDType(op, "x_aligned", x_aligned));
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  ASSIGN_OR_RETURN(const CheckedSeqlens cu_padded,
                   CheckSeqlens(op, "cu_seqlens_padded", seqlens_padded, call, backend));
  RETURN_IF_ERROR(CheckNoTail(op, "cu_seqlens", cu));
  RETURN_IF_ERROR(CheckPaddedCovers(op, cu, cu_padded));
  RETURN_IF_ERROR(CheckRows(op, "x_aligned", x_aligned, cu_padded, "cu_seqlens_padded"));
  RETURN_IF_ERROR(CheckTensor(op, "x_packed", &x_packed, call));
  RETURN_IF_ERROR(CheckSameDType(op, "x_packed", x_packed, "x_aligned", x_aligned));
  RETURN_IF_ERROR(
      CheckShape(op, "x_packed", x_packed, WithTrailing({cu.total}, x_aligned, 1), "[total, ...]"));

  internal::UnpackAlignedArgs a;
  a.x_aligned = Data(x_aligned);
  a.cu = cu.device;
  a.cu_padded = cu_padded.device;
  a.batch = cu.batch;
  a.total = cu.total;
  a.row_bytes = RowBytes(x_aligned, 1);
  a.x_packed = Data(x_packed);
  return backend == Backend::kHost
             ? internal::cpu::UnpackAligned(a)
             : internal::cuda::UnpackAligned(a, call.device.device_id, stream);
}

absl::Status PositionIds(const Seqlens& seqlens, const DLTensor& position_ids, Stream stream) {
  constexpr absl::string_view op = "PositionIds";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "cu_seqlens", seqlens.cu_seqlens));
  const CallDevice call{seqlens.cu_seqlens->device, "cu_seqlens"};
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckTensor(op, "position_ids", &position_ids, call));
  RETURN_IF_ERROR(CheckDType(op, "position_ids", position_ids, kDLInt, 64));
  RETURN_IF_ERROR(CheckShape(op, "position_ids", position_ids, {cu.rows}, "[total]"));

  internal::PositionIdsArgs a;
  a.cu = cu.device;
  a.batch = cu.batch;
  a.rows = cu.rows;
  a.position_ids = static_cast<int64_t*>(Data(position_ids));
  return backend == Backend::kHost ? internal::cpu::PositionIds(a)
                                   : internal::cuda::PositionIds(a, call.device.device_id, stream);
}

absl::Status ShiftLabels(const DLTensor& ids, const Seqlens& seqlens, const Seqlens* seqlens_padded,
                         int64_t ignore_index, const DLTensor& labels, Stream stream) {
  constexpr absl::string_view op = "ShiftLabels";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "ids", &ids));
  const CallDevice call{ids.device, "ids"};
  RETURN_IF_ERROR(CheckTensor(op, "ids", &ids, call));
  ASSIGN_OR_RETURN(const bool ids_64, IsInt64Ids(op, "ids", ids));
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  CheckedSeqlens layout = cu;
  if (seqlens_padded != nullptr) {
    ASSIGN_OR_RETURN(layout, CheckSeqlens(op, "cu_seqlens_padded", *seqlens_padded, call, backend));
    RETURN_IF_ERROR(CheckNoTail(op, "cu_seqlens", cu));
    RETURN_IF_ERROR(CheckPaddedCovers(op, cu, layout));
  }
  const absl::string_view layout_name =
      seqlens_padded != nullptr ? "cu_seqlens_padded" : "cu_seqlens";
  if (ids.ndim != 1) {
    return Invalid(op, absl::StrCat("ids must have shape [rows], got ", ShapeString(ids)));
  }
  RETURN_IF_ERROR(CheckRows(op, "ids", ids, layout, layout_name));
  if (!ids_64 && (ignore_index < std::numeric_limits<int32_t>::min() ||
                  ignore_index > std::numeric_limits<int32_t>::max())) {
    return Invalid(op, absl::StrCat("ignore_index ", ignore_index, " does not fit in int32 ids"));
  }
  RETURN_IF_ERROR(CheckTensor(op, "labels", &labels, call));
  RETURN_IF_ERROR(CheckSameDType(op, "labels", labels, "ids", ids));
  RETURN_IF_ERROR(CheckShape(op, "labels", labels, {layout.rows}, "[rows]"));

  internal::ShiftLabelsArgs a;
  a.ids = Data(ids);
  a.ids_64 = ids_64;
  a.cu = cu.device;
  a.cu_padded = seqlens_padded != nullptr ? layout.device : nullptr;
  a.batch = cu.batch;
  a.rows = layout.rows;
  a.ignore_index = ignore_index;
  a.labels = Data(labels);
  return backend == Backend::kHost ? internal::cpu::ShiftLabels(a)
                                   : internal::cuda::ShiftLabels(a, call.device.device_id, stream);
}

absl::Status PackedCrossEntropy(const DLTensor& logits, const DLTensor& labels,
                                const Seqlens& seqlens, int64_t ignore_index,
                                const DLTensor& per_token_loss, const DLTensor& per_sequence_sum,
                                const DLTensor& per_sequence_count, Stream stream) {
  constexpr absl::string_view op = "PackedCrossEntropy";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "logits", &logits));
  const CallDevice call{logits.device, "logits"};
  RETURN_IF_ERROR(CheckTensor(op, "logits", &logits, call));
  ASSIGN_OR_RETURN(const FloatType dtype, FloatTypeOf(op, "logits", logits));
  if (logits.ndim != 2 || logits.shape[1] < 1) {
    return Invalid(op, absl::StrCat("logits must have shape [rows, V] with V >= 1, got ",
                                    ShapeString(logits)));
  }
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckRows(op, "logits", logits, cu, "cu_seqlens"));
  RETURN_IF_ERROR(CheckTensor(op, "labels", &labels, call));
  ASSIGN_OR_RETURN(const bool labels_64, IsInt64Ids(op, "labels", labels));
  RETURN_IF_ERROR(CheckShape(op, "labels", labels, {cu.rows}, "[rows]"));
  RETURN_IF_ERROR(CheckTensor(op, "per_token_loss", &per_token_loss, call));
  RETURN_IF_ERROR(CheckSameDType(op, "per_token_loss", per_token_loss, "logits", logits));
  RETURN_IF_ERROR(CheckShape(op, "per_token_loss", per_token_loss, {cu.rows}, "[rows]"));
  RETURN_IF_ERROR(CheckTensor(op, "per_sequence_sum", &per_sequence_sum, call));
  RETURN_IF_ERROR(CheckSameDType(op, "per_sequence_sum", per_sequence_sum, "logits", logits));
  RETURN_IF_ERROR(CheckShape(op, "per_sequence_sum", per_sequence_sum, {cu.batch}, "[B]"));
  RETURN_IF_ERROR(CheckTensor(op, "per_sequence_count", &per_sequence_count, call));
  RETURN_IF_ERROR(CheckDType(op, "per_sequence_count", per_sequence_count, kDLInt, 64));
  RETURN_IF_ERROR(CheckShape(op, "per_sequence_count", per_sequence_count, {cu.batch}, "[B]"));

  internal::CrossEntropyArgs a;
  a.logits = Data(logits);
  a.dtype = dtype;
  a.vocab = logits.shape[1];
  a.labels = Data(labels);
  a.labels_64 = labels_64;
  a.cu = cu.device;
  a.batch = cu.batch;
  a.rows = cu.rows;
  a.ignore_index = ignore_index;
  a.per_token_loss = Data(per_token_loss);
  a.per_sequence_sum = Data(per_sequence_sum);
  a.per_sequence_count = static_cast<int64_t*>(Data(per_sequence_count));
  return backend == Backend::kHost
             ? internal::cpu::PackedCrossEntropy(a)
             : internal::cuda::PackedCrossEntropy(a, call.device.device_id, stream);
}

}  // namespace packsched::kernels
