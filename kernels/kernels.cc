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
#include "server/base/status_macros.h"

namespace packsched::kernels {
namespace {

using internal::FloatType;

// DLPack 0.6 has no bool code; torch and numpy's newer exporters use 6 for it.
constexpr uint8_t kDLBoolCode = 6;

enum class Backend { kHost, kCuda };

absl::Status Invalid(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

std::string DTypeName(DLDataType t) {
  std::string base;
  switch (t.code) {
    case kDLInt:
      base = "int";
      break;
    case kDLUInt:
      base = "uint";
      break;
    case kDLFloat:
      base = "float";
      break;
    case kDLBfloat:
      base = "bfloat";
      break;
    case kDLBoolCode:
      base = "bool";
      break;
    default:
      base = absl::StrCat("code", t.code, "_");
  }
  std::string name = t.code == kDLBoolCode ? base : absl::StrCat(base, t.bits);
  if (t.lanes != 1) absl::StrAppend(&name, "x", t.lanes);
  return name;
}

std::string ShapeString(const DLTensor& t) {
  return absl::StrCat("[", absl::StrJoin(absl::MakeConstSpan(t.shape, t.ndim), ", "), "]");
}

std::string DeviceString(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return absl::StrCat("cuda:", d.device_id);
    case kDLCUDAHost:
      return "cuda_host";
    case kDLCUDAManaged:
      return absl::StrCat("cuda_managed:", d.device_id);
    default:
      return absl::StrCat("device_type ", static_cast<int>(d.device_type), ":", d.device_id);
  }
}

bool Is(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

int64_t ElementBytes(DLDataType t) { return t.bits / 8; }

void* Data(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

int64_t NumElements(const DLTensor& t, int first_dim = 0) {
  int64_t n = 1;
  for (int i = first_dim; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// Bytes of one row when dimension 0..dims-1 index rows.
int64_t RowBytes(const DLTensor& t, int dims) {
  return NumElements(t, dims) * ElementBytes(t.dtype);
}

// The call's device: every tensor must be on it.
struct CallDevice {
  DLDevice device;
  absl::string_view first_name;
};

absl::Status CheckTensor(absl::string_view op, absl::string_view name, const DLTensor* t,
                         const CallDevice& call) {
  if (t == nullptr) return Invalid(op, absl::StrCat(name, " is null"));
  if (t->ndim < 0 || (t->ndim > 0 && t->shape == nullptr)) {
    return Invalid(op, absl::StrCat(name, " has no shape"));
  }
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 0) return Invalid(op, absl::StrCat(name, " has a negative dimension"));
  }
  if (t->device.device_type != call.device.device_type ||
      t->device.device_id != call.device.device_id) {
    return Invalid(
        op, absl::StrCat("device mismatch: ", name, " is on ", DeviceString(t->device), " but ",
                         call.first_name, " is on ", DeviceString(call.device)));
  }
  if (t->strides != nullptr && NumElements(*t) > 0) {
    // Compact row-major; the stride of a size-1 dimension does not matter, nor any stride of an
    // empty tensor (torch exports those with arbitrary strides).
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expected) {
        return Invalid(
            op, absl::StrCat(name, " must be contiguous (compact row-major), got shape ",
                             ShapeString(*t), " with strides [",
                             absl::StrJoin(absl::MakeConstSpan(t->strides, t->ndim), ", "), "]"));
      }
      expected *= t->shape[i];
    }
  }
  if (t->data == nullptr && NumElements(*t) > 0) {
    return Invalid(op, absl::StrCat(name, " has no data"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Backend> BackendOf(absl::string_view op, absl::string_view name, const DLTensor* t) {
  if (t == nullptr) return Invalid(op, absl::StrCat(name, " is null"));
  switch (t->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return Backend::kHost;
    case kDLCUDA:
    case kDLCUDAManaged:
      return Backend::kCuda;
    default:
      return Invalid(
          op, absl::StrCat(name, " is on an unsupported device (", DeviceString(t->device), ")"));
  }
}

// Elements that the copy kernels move as bytes.
absl::Status CheckCopyableDType(absl::string_view op, absl::string_view name, const DLTensor& t) {
  const DLDataType d = t.dtype;
  const bool code_ok = d.code == kDLInt || d.code == kDLUInt || d.code == kDLFloat ||
                       d.code == kDLBfloat || d.code == kDLBoolCode;
  const bool bits_ok = d.bits == 8 || d.bits == 16 || d.bits == 32 || d.bits == 64;
  if (!code_ok || !bits_ok || d.lanes != 1) {
    return Invalid(op, absl::StrCat("unsupported dtype for ", name, ": ", DTypeName(d)));
  }
  return absl::OkStatus();
}

absl::Status CheckDType(absl::string_view op, absl::string_view name, const DLTensor& t,
                        uint8_t code, uint8_t bits) {
  if (!Is(t.dtype, code, bits)) {
    return Invalid(op, absl::StrCat(name, " must be ", DTypeName(DLDataType{code, bits, 1}),
                                    ", got ", DTypeName(t.dtype)));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(absl::string_view op, absl::string_view name, const DLTensor& t,
                            absl::string_view ref_name, const DLTensor& ref) {
  if (t.dtype.code != ref.dtype.code || t.dtype.bits != ref.dtype.bits ||
      t.dtype.lanes != ref.dtype.lanes) {
    return Invalid(op, absl::StrCat(name, " must have ", ref_name, "'s dtype ",
                                    DTypeName(ref.dtype), ", got ", DTypeName(t.dtype)));
  }
  return absl::OkStatus();
}

// Checks that `t` has shape `expected`.
absl::Status CheckShape(absl::string_view op, absl::string_view name, const DLTensor& t,
                        absl::Span<const int64_t> expected, absl::string_view meaning) {
  bool ok = t.ndim == static_cast<int>(expected.size());
  for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == expected[i];
  if (!ok) {
    return Invalid(op, absl::StrCat(name, " must have shape ", meaning, " = [",
                                    absl::StrJoin(expected, ", "), "], got ", ShapeString(t)));
  }
  return absl::OkStatus();
}

// `lead` followed by the dimensions of `ref` from `from_dim` on.
std::vector<int64_t> WithTrailing(std::initializer_list<int64_t> lead, const DLTensor& ref,
                                  int from_dim) {
  std::vector<int64_t> shape(lead);
  for (int i = from_dim; i < ref.ndim; ++i) shape.push_back(ref.shape[i]);
  return shape;
}

// A validated cu_seqlens: device pointer, host values, B and total.
struct CheckedSeqlens {
  const int32_t* device = nullptr;
  const int32_t* host = nullptr;
  int64_t batch = 0;
  int64_t total = 0;
  int64_t max_len = 0;
};

// Validates a host cu_seqlens array (also used by AlignedCuSeqlens).
absl::Status CheckCuValues(absl::string_view op, absl::string_view name,
                           absl::Span<const int32_t> cu) {
  if (cu.empty()) return Invalid(op, absl::StrCat(name, " must have B + 1 >= 1 entries, got 0"));
  if (cu[0] != 0) return Invalid(op, absl::StrCat(name, "[0] must be 0, got ", cu[0]));
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b + 1] < cu[b]) {
      return Invalid(op, absl::StrCat(name, " must be non-decreasing, but ", name, "[", b + 1,
                                      "] = ", cu[b + 1], " < ", name, "[", b, "] = ", cu[b]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckedSeqlens> CheckSeqlens(absl::string_view op, absl::string_view name,
                                            const Seqlens& s, const CallDevice& call,
                                            Backend backend) {
  RETURN_IF_ERROR(CheckTensor(op, name, s.cu_seqlens, call));
  const DLTensor& t = *s.cu_seqlens;
  RETURN_IF_ERROR(CheckDType(op, name, t, kDLInt, 32));
  if (t.ndim != 1 || t.shape[0] < 1) {
    return Invalid(
        op, absl::StrCat(name, " must have shape [B + 1] with B >= 0, got ", ShapeString(t)));
  }
  CheckedSeqlens out;
  out.device = static_cast<const int32_t*>(Data(t));
  out.batch = t.shape[0] - 1;
  if (s.host.empty()) {
    if (backend != Backend::kHost) {
      return Invalid(op, absl::StrCat(name, " is a device tensor: its host copy (Seqlens::host) ",
                                      "is required so the call need not sync"));
    }
    out.host = out.device;
  } else {
    if (static_cast<int64_t>(s.host.size()) != t.shape[0]) {
      return Invalid(op, absl::StrCat(name, "'s host copy has ", s.host.size(),
                                      " values but the tensor has ", t.shape[0]));
    }
    out.host = s.host.data();
    if (backend == Backend::kHost) {
      for (int64_t i = 0; i < t.shape[0]; ++i) {
        if (out.host[i] != out.device[i]) {
          return Invalid(op, absl::StrCat(name, "'s host copy differs from the tensor at index ", i,
                                          ": ", out.host[i], " vs ", out.device[i]));
        }
      }
    }
  }
  RETURN_IF_ERROR(CheckCuValues(op, name, absl::MakeConstSpan(out.host, out.batch + 1)));
  out.total = out.host[out.batch];
  for (int64_t b = 0; b < out.batch; ++b) {
    out.max_len = std::max<int64_t>(out.max_len, out.host[b + 1] - out.host[b]);
  }
  return out;
}

absl::Status CheckRows(absl::string_view op, absl::string_view name, const DLTensor& t,
                       int64_t expected, absl::string_view cu_name) {
  if (t.ndim < 1 || t.shape[0] != expected) {
    return Invalid(op, absl::StrCat("total mismatch: ", name, " has shape ", ShapeString(t),
                                    " but ", cu_name, "[B] = ", expected));
  }
  return absl::OkStatus();
}

// Both seqlens describe the same B sequences and every padded length holds the real one.
absl::Status CheckPaddedCovers(absl::string_view op, const CheckedSeqlens& real,
                               const CheckedSeqlens& padded) {
  if (padded.batch != real.batch) {
    return Invalid(op, absl::StrCat("cu_seqlens_padded has B = ", padded.batch,
                                    " sequences but cu_seqlens has B = ", real.batch));
  }
  for (int64_t b = 0; b < real.batch; ++b) {
    const int64_t len = real.host[b + 1] - real.host[b];
    const int64_t padded_len = padded.host[b + 1] - padded.host[b];
    if (padded_len < len) {
      return Invalid(op, absl::StrCat("cu_seqlens_padded gives sequence ", b, " ", padded_len,
                                      " rows, fewer than its ", len, " real tokens"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<FloatType> FloatTypeOf(absl::string_view op, absl::string_view name,
                                      const DLTensor& t) {
  if (Is(t.dtype, kDLFloat, 16)) return FloatType::kF16;
  if (Is(t.dtype, kDLBfloat, 16)) return FloatType::kBf16;
  if (Is(t.dtype, kDLFloat, 32)) return FloatType::kF32;
  if (Is(t.dtype, kDLFloat, 64)) return FloatType::kF64;
  return Invalid(op, absl::StrCat("unsupported dtype for ", name, ": ", DTypeName(t.dtype),
                                  " (float16, bfloat16, float32 or float64)"));
}

absl::StatusOr<bool> IsInt64Ids(absl::string_view op, absl::string_view name, const DLTensor& t) {
  if (Is(t.dtype, kDLInt, 64)) return true;
  if (Is(t.dtype, kDLInt, 32)) return false;
  return Invalid(op, absl::StrCat("unsupported dtype for ", name, ": ", DTypeName(t.dtype),
                                  " (int32 or int64)"));
}

// One element of `value` in dtype `t`, repeated over 16 bytes.
absl::Status FillPattern(absl::string_view op, double value, DLDataType t,
                         unsigned char (&pattern)[16]) {
  unsigned char element[8] = {};
  const int bytes = t.bits / 8;
  auto store = [&](auto v) { std::memcpy(element, &v, sizeof(v)); };
  if (t.code == kDLFloat || t.code == kDLBfloat) {
    if (t.code == kDLBfloat) {
      store(FloatToBf16(static_cast<float>(value)).bits);
    } else if (t.bits == 16) {
      store(FloatToFp16(static_cast<float>(value)).bits);
    } else if (t.bits == 32) {
      store(static_cast<float>(value));
    } else {
      store(value);
    }
  } else {
    const bool is_signed = t.code == kDLInt;
    // Representable range of the integer dtype, as doubles (exact for the bounds that matter:
    // integers beyond 2^53 cannot be asked for through a double anyway).
    const double lo = is_signed ? -std::ldexp(1.0, t.bits - 1) : 0.0;
    const double hi = is_signed ? std::ldexp(1.0, t.bits - 1) : std::ldexp(1.0, t.bits);
    if (t.code == kDLBoolCode) {
      if (value != 0.0 && value != 1.0) {
        return Invalid(op, absl::StrCat("pad_value ", value, " is not a bool (0 or 1)"));
      }
    } else if (!(value >= lo && value < hi) || std::trunc(value) != value) {
      return Invalid(op,
                     absl::StrCat("pad_value ", value, " is not representable in ", DTypeName(t)));
    }
    if (is_signed) {
      const int64_t v = static_cast<int64_t>(value);
      switch (bytes) {
        case 1:
          store(static_cast<int8_t>(v));
          break;
        case 2:
          store(static_cast<int16_t>(v));
          break;
        case 4:
          store(static_cast<int32_t>(v));
          break;
        default:
          store(v);
      }
    } else {
      const uint64_t v = static_cast<uint64_t>(value);
      switch (bytes) {
        case 1:
          store(static_cast<uint8_t>(v));
          break;
        case 2:
          store(static_cast<uint16_t>(v));
          break;
        case 4:
          store(static_cast<uint32_t>(v));
          break;
        default:
          store(v);
      }
    }
  }
  for (int i = 0; i < 16; ++i) pattern[i] = element[i % bytes];
  return absl::OkStatus();
}

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
  return backend == Backend::kHost ? internal::cpu::Unpad(a) : internal::cuda::Unpad(a, stream);
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
  return backend == Backend::kHost ? internal::cpu::Pad(a) : internal::cuda::Pad(a, stream);
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
                         double pad_value, const DLTensor& x_aligned,
                         const DLTensor& cu_seqlens_padded, const DLTensor& seqused,
                         Stream stream) {
  constexpr absl::string_view op = "PackAligned";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "x_packed", &x_packed));
  const CallDevice call{x_packed.device, "x_packed"};
  RETURN_IF_ERROR(CheckTensor(op, "x_packed", &x_packed, call));
  RETURN_IF_ERROR(CheckCopyableDType(op, "x_packed", x_packed));
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckRows(op, "x_packed", x_packed, cu.total, "cu_seqlens"));
  if (align < 1) return Invalid(op, absl::StrCat("align must be >= 1, got ", align));
  ASSIGN_OR_RETURN(const std::vector<int32_t> padded,
                   AlignedCuSeqlens(absl::MakeConstSpan(cu.host, cu.batch + 1), align));
  RETURN_IF_ERROR(CheckTensor(op, "x_aligned", &x_aligned, call));
  RETURN_IF_ERROR(CheckSameDType(op, "x_aligned", x_aligned, "x_packed", x_packed));
  RETURN_IF_ERROR(CheckShape(op, "x_aligned", x_aligned, WithTrailing({padded.back()}, x_packed, 1),
                             "[total_padded, ...]"));
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
  a.row_bytes = RowBytes(x_packed, 1);
  a.elem_bytes = ElementBytes(x_packed.dtype);
  a.align = align;
  a.x_aligned = Data(x_aligned);
  a.cu_padded = static_cast<int32_t*>(Data(cu_seqlens_padded));
  a.seqused = static_cast<int32_t*>(Data(seqused));
  return backend == Backend::kHost ? internal::cpu::PackAligned(a)
                                   : internal::cuda::PackAligned(a, stream);
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
  RETURN_IF_ERROR(CheckPaddedCovers(op, cu, cu_padded));
  RETURN_IF_ERROR(CheckRows(op, "x_aligned", x_aligned, cu_padded.total, "cu_seqlens_padded"));
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
  return backend == Backend::kHost ? internal::cpu::UnpackAligned(a)
                                   : internal::cuda::UnpackAligned(a, stream);
}

absl::Status PositionIds(const Seqlens& seqlens, const DLTensor& position_ids, Stream stream) {
  constexpr absl::string_view op = "PositionIds";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "cu_seqlens", seqlens.cu_seqlens));
  const CallDevice call{seqlens.cu_seqlens->device, "cu_seqlens"};
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckTensor(op, "position_ids", &position_ids, call));
  RETURN_IF_ERROR(CheckDType(op, "position_ids", position_ids, kDLInt, 64));
  RETURN_IF_ERROR(CheckShape(op, "position_ids", position_ids, {cu.total}, "[total]"));

  internal::PositionIdsArgs a;
  a.cu = cu.device;
  a.batch = cu.batch;
  a.total = cu.total;
  a.position_ids = static_cast<int64_t*>(Data(position_ids));
  return backend == Backend::kHost ? internal::cpu::PositionIds(a)
                                   : internal::cuda::PositionIds(a, stream);
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
    RETURN_IF_ERROR(CheckPaddedCovers(op, cu, layout));
  }
  const absl::string_view layout_name =
      seqlens_padded != nullptr ? "cu_seqlens_padded" : "cu_seqlens";
  if (ids.ndim != 1) {
    return Invalid(op, absl::StrCat("ids must have shape [rows], got ", ShapeString(ids)));
  }
  RETURN_IF_ERROR(CheckRows(op, "ids", ids, layout.total, layout_name));
  if (!ids_64 && (ignore_index < std::numeric_limits<int32_t>::min() ||
                  ignore_index > std::numeric_limits<int32_t>::max())) {
    return Invalid(op, absl::StrCat("ignore_index ", ignore_index, " does not fit in int32 ids"));
  }
  RETURN_IF_ERROR(CheckTensor(op, "labels", &labels, call));
  RETURN_IF_ERROR(CheckSameDType(op, "labels", labels, "ids", ids));
  RETURN_IF_ERROR(CheckShape(op, "labels", labels, {layout.total}, "[rows]"));

  internal::ShiftLabelsArgs a;
  a.ids = Data(ids);
  a.ids_64 = ids_64;
  a.cu = cu.device;
  a.cu_padded = seqlens_padded != nullptr ? layout.device : nullptr;
  a.batch = cu.batch;
  a.rows = layout.total;
  a.ignore_index = ignore_index;
  a.labels = Data(labels);
  return backend == Backend::kHost ? internal::cpu::ShiftLabels(a)
                                   : internal::cuda::ShiftLabels(a, stream);
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
  RETURN_IF_ERROR(CheckRows(op, "logits", logits, cu.total, "cu_seqlens"));
  RETURN_IF_ERROR(CheckTensor(op, "labels", &labels, call));
  ASSIGN_OR_RETURN(const bool labels_64, IsInt64Ids(op, "labels", labels));
  RETURN_IF_ERROR(CheckShape(op, "labels", labels, {cu.total}, "[rows]"));
  RETURN_IF_ERROR(CheckTensor(op, "per_token_loss", &per_token_loss, call));
  RETURN_IF_ERROR(CheckSameDType(op, "per_token_loss", per_token_loss, "logits", logits));
  RETURN_IF_ERROR(CheckShape(op, "per_token_loss", per_token_loss, {cu.total}, "[rows]"));
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
  a.rows = cu.total;
  a.ignore_index = ignore_index;
  a.per_token_loss = Data(per_token_loss);
  a.per_sequence_sum = Data(per_sequence_sum);
  a.per_sequence_count = static_cast<int64_t*>(Data(per_sequence_count));
  return backend == Backend::kHost ? internal::cpu::PackedCrossEntropy(a)
                                   : internal::cuda::PackedCrossEntropy(a, stream);
}

}  // namespace packsched::kernels
