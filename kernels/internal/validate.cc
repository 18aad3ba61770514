// Argument validation shared by the front ends of the kernel API (kernels.cc, attention_api.cc).

#include "kernels/internal/validate.h"

#include <algorithm>
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
#include "kernels/common/half.h"
#include "server/base/status_macros.h"

namespace packsched::kernels::internal {

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

int64_t NumElements(const DLTensor& t, int first_dim) {
  int64_t n = 1;
  for (int i = first_dim; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// Bytes of one row when dimension 0..dims-1 index rows.
int64_t RowBytes(const DLTensor& t, int dims) {
  return NumElements(t, dims) * ElementBytes(t.dtype);
}

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
  if (s.rows != -1 && s.rows < out.total) {
    return Invalid(op, absl::StrCat(name, ": rows = ", s.rows, " must be -1 (no tail) or at least ",
                                    name, "[B] = ", out.total));
  }
  out.rows = s.rows == -1 ? out.total : s.rows;
  for (int64_t b = 0; b < out.batch; ++b) {
    out.max_len = std::max<int64_t>(out.max_len, out.host[b + 1] - out.host[b]);
  }
  return out;
}

absl::Status CheckNoTail(absl::string_view op, absl::string_view name, const CheckedSeqlens& cu) {
  if (cu.rows != cu.total) {
    return Invalid(op, absl::StrCat(name, " must declare no tail here, but rows = ", cu.rows,
                                    " exceeds ", name, "[B] = ", cu.total));
  }
  return absl::OkStatus();
}

absl::Status CheckRows(absl::string_view op, absl::string_view name, const DLTensor& t,
                       const CheckedSeqlens& cu, absl::string_view cu_name) {
  if (t.ndim < 1 || t.shape[0] != cu.rows) {
    const std::string expected = cu.rows == cu.total
                                     ? absl::StrCat(cu_name, "[B] = ", cu.total)
                                     : absl::StrCat(cu_name, "'s rows = ", cu.rows, " (a tail)");
    return Invalid(op, absl::StrCat("total mismatch: ", name, " has shape ", ShapeString(t),
                                    " but ", expected));
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

}  // namespace packsched::kernels::internal
