// The front end of the recurrent kernels (recurrent.h): validates every argument on the host
// (each prev_row value too, for host tensors), fills internal::ConvArgs / RecurrenceArgs and
// dispatches on the device type.

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/internal/recurrent_args.h"
#include "kernels/internal/validate.h"
#include "packsched/kernels/recurrent.h"
#include "server/base/status_macros.h"

namespace packsched::kernels {
namespace {

using internal::Backend;
using internal::CallDevice;
using internal::CheckShape;
using internal::CheckTensor;
using internal::Data;
using internal::FloatType;
using internal::Invalid;

constexpr int kMaxConvWidth = 8;
constexpr int64_t kMaxHeadDim = 512;

absl::StatusOr<FloatType> CheckFloat(absl::string_view op, absl::string_view name,
                                     const DLTensor& t, const CallDevice& call) {
  RETURN_IF_ERROR(CheckTensor(op, name, &t, call));
  if (internal::Is(t.dtype, kDLFloat, 64)) return FloatType::kF64;
  if (internal::Is(t.dtype, kDLFloat, 32)) return FloatType::kF32;
  return Invalid(
      op, absl::StrCat(name, " must be float32 or float64, got ", internal::DTypeName(t.dtype)));
}

// A tensor of the reference's dtype and the given shape.
absl::Status CheckLike(absl::string_view op, absl::string_view name, const DLTensor* t,
                       absl::string_view ref_name, const DLTensor& ref,
                       std::initializer_list<int64_t> shape, absl::string_view meaning,
                       const CallDevice& call) {
  RETURN_IF_ERROR(CheckTensor(op, name, t, call));
  RETURN_IF_ERROR(internal::CheckSameDType(op, name, *t, ref_name, ref));
  return CheckShape(op, name, *t, shape, meaning);
}

// int32 [rows], each value in [-1, t) (read on the host only).
absl::StatusOr<const int32_t*> CheckPrevRow(absl::string_view op, const DLTensor& prev_row,
                                            int64_t rows, const CallDevice& call, Backend backend) {
  RETURN_IF_ERROR(CheckTensor(op, "prev_row", &prev_row, call));
  RETURN_IF_ERROR(internal::CheckDType(op, "prev_row", prev_row, kDLInt, 32));
  RETURN_IF_ERROR(CheckShape(op, "prev_row", prev_row, {rows}, "[T]"));
  const auto* p = static_cast<const int32_t*>(Data(prev_row));
  if (backend != Backend::kHost) return p;
  for (int64_t t = 0; t < rows; ++t) {
    if (p[t] < -1 || p[t] >= t) {
      return Invalid(op,
                     absl::StrCat("prev_row[", t, "] = ", p[t],
                                  " must be -1 (zero state) or an earlier row in [0, ", t, ")"));
    }
  }
  return p;
}

absl::StatusOr<internal::ConvArgs> CheckConv(absl::string_view op, const DLTensor& x,
                                             const DLTensor& weight, const DLTensor* bias,
                                             const DLTensor& prev_row, bool silu,
                                             const CallDevice& call, Backend backend) {
  internal::ConvArgs a{};
  ASSIGN_OR_RETURN(a.dtype, CheckFloat(op, "x", x, call));
  if (x.ndim != 2) {
    return Invalid(op, absl::StrCat("x must be [T, C], got ", internal::ShapeString(x)));
  }
  a.rows = x.shape[0];
  a.channels = x.shape[1];
  RETURN_IF_ERROR(CheckTensor(op, "weight", &weight, call));
  RETURN_IF_ERROR(internal::CheckSameDType(op, "weight", weight, "x", x));
  if (weight.ndim != 2 || weight.shape[0] != a.channels || weight.shape[1] < 1 ||
      weight.shape[1] > kMaxConvWidth) {
    return Invalid(op, absl::StrCat("weight must be [C, W] with C = ", a.channels,
                                    " and 1 <= W <= ", kMaxConvWidth, ", got ",
                                    internal::ShapeString(weight)));
  }
  a.width = static_cast<int>(weight.shape[1]);
  if (bias != nullptr) {
    RETURN_IF_ERROR(CheckLike(op, "bias", bias, "x", x, {a.channels}, "[C]", call));
    a.bias = Data(*bias);
  }
  ASSIGN_OR_RETURN(a.prev_row, CheckPrevRow(op, prev_row, a.rows, call, backend));
  a.x = Data(x);
  a.weight = Data(weight);
  a.silu = silu;
  return a;
}

absl::StatusOr<internal::RecurrenceArgs> CheckRecurrence(absl::string_view op, const DLTensor& q,
                                                         const DLTensor& k, const DLTensor& v,
                                                         const DLTensor& g, const DLTensor* beta,
                                                         const DLTensor& prev_row,
                                                         const CallDevice& call, Backend backend) {
  internal::RecurrenceArgs a{};
  ASSIGN_OR_RETURN(a.dtype, CheckFloat(op, "q", q, call));
  if (q.ndim != 3 || q.shape[2] < 1 || q.shape[2] > kMaxHeadDim) {
    return Invalid(op, absl::StrCat("q must be [T, H, K] with 1 <= K <= ", kMaxHeadDim, ", got ",
                                    internal::ShapeString(q)));
  }
  a.rows = q.shape[0];
  a.heads = q.shape[1];
  a.kd = static_cast<int>(q.shape[2]);
  RETURN_IF_ERROR(CheckLike(op, "k", &k, "q", q, {a.rows, a.heads, a.kd}, "[T, H, K] (q's)", call));
  RETURN_IF_ERROR(CheckTensor(op, "v", &v, call));
  RETURN_IF_ERROR(internal::CheckSameDType(op, "v", v, "q", q));
  if (v.ndim != 3 || v.shape[0] != a.rows || v.shape[1] != a.heads || v.shape[2] < 1 ||
      v.shape[2] > kMaxHeadDim) {
    return Invalid(op, absl::StrCat("v must be [T, H, V] with q's T and H and 1 <= V <= ",
                                    kMaxHeadDim, ", got ", internal::ShapeString(v)));
  }
  a.vd = static_cast<int>(v.shape[2]);
  RETURN_IF_ERROR(CheckLike(op, "g", &g, "q", q, {a.rows, a.heads}, "[T, H]", call));
  if (beta != nullptr) {
    RETURN_IF_ERROR(CheckLike(op, "beta", beta, "q", q, {a.rows, a.heads}, "[T, H]", call));
    a.beta = Data(*beta);
  }
  ASSIGN_OR_RETURN(a.prev_row, CheckPrevRow(op, prev_row, a.rows, call, backend));
  a.q = Data(q);
  a.k = Data(k);
  a.v = Data(v);
  a.g = Data(g);
  return a;
}

}  // namespace

absl::Status CausalConv1dForward(const DLTensor& x, const DLTensor& weight, const DLTensor* bias,
                                 const DLTensor& prev_row, bool silu, const DLTensor& out,
                                 Stream stream) {
  constexpr absl::string_view op = "CausalConv1dForward";
  ASSIGN_OR_RETURN(const Backend backend, internal::BackendOf(op, "x", &x));
  const CallDevice call{x.device, "x"};
  ASSIGN_OR_RETURN(internal::ConvArgs a,
                   CheckConv(op, x, weight, bias, prev_row, silu, call, backend));
  RETURN_IF_ERROR(CheckLike(op, "out", &out, "x", x, {a.rows, a.channels}, "[T, C]", call));
  a.out = Data(out);
  return backend == Backend::kHost
             ? internal::cpu::CausalConv1dForward(a)
             : internal::cuda::CausalConv1dForward(a, call.device.device_id, stream);
}

absl::Status CausalConv1dBackward(const DLTensor& x, const DLTensor& weight, const DLTensor* bias,
                                  const DLTensor& prev_row, bool silu, const DLTensor& d_out,
                                  const DLTensor& dx, const DLTensor& d_weight,
                                  const DLTensor* d_bias, Stream stream) {
  constexpr absl::string_view op = "CausalConv1dBackward";
  ASSIGN_OR_RETURN(const Backend backend, internal::BackendOf(op, "x", &x));
  const CallDevice call{x.device, "x"};
  ASSIGN_OR_RETURN(internal::ConvArgs a,
                   CheckConv(op, x, weight, bias, prev_row, silu, call, backend));
  RETURN_IF_ERROR(CheckLike(op, "d_out", &d_out, "x", x, {a.rows, a.channels}, "[T, C]", call));
  RETURN_IF_ERROR(CheckLike(op, "dx", &dx, "x", x, {a.rows, a.channels}, "[T, C]", call));
  RETURN_IF_ERROR(
      CheckLike(op, "d_weight", &d_weight, "x", x, {a.channels, a.width}, "[C, W]", call));
  if ((bias == nullptr) != (d_bias == nullptr)) {
    return Invalid(op, "d_bias must be given exactly when bias is");
  }
  if (d_bias != nullptr) {
    RETURN_IF_ERROR(CheckLike(op, "d_bias", d_bias, "x", x, {a.channels}, "[C]", call));
    a.d_bias = Data(*d_bias);
  }
  a.d_out = Data(d_out);
  a.dx = Data(dx);
  a.d_weight = Data(d_weight);
  return backend == Backend::kHost
             ? internal::cpu::CausalConv1dBackward(a)
             : internal::cuda::CausalConv1dBackward(a, call.device.device_id, stream);
}

absl::Status GatedRecurrenceForward(const DLTensor& q, const DLTensor& k, const DLTensor& v,
                                    const DLTensor& g, const DLTensor* beta,
                                    const DLTensor& prev_row, const DLTensor& out, Stream stream) {
  constexpr absl::string_view op = "GatedRecurrenceForward";
  ASSIGN_OR_RETURN(const Backend backend, internal::BackendOf(op, "q", &q));
  const CallDevice call{q.device, "q"};
  ASSIGN_OR_RETURN(internal::RecurrenceArgs a,
                   CheckRecurrence(op, q, k, v, g, beta, prev_row, call, backend));
  RETURN_IF_ERROR(CheckLike(op, "out", &out, "q", q, {a.rows, a.heads, a.vd}, "[T, H, V]", call));
  a.out = Data(out);
  return backend == Backend::kHost
             ? internal::cpu::GatedRecurrenceForward(a)
             : internal::cuda::GatedRecurrenceForward(a, call.device.device_id, stream);
}

absl::Status GatedRecurrenceBackward(const DLTensor& q, const DLTensor& k, const DLTensor& v,
                                     const DLTensor& g, const DLTensor* beta,
                                     const DLTensor& prev_row, const DLTensor& d_out,
                                     const DLTensor& dq, const DLTensor& dk, const DLTensor& dv,
                                     const DLTensor& dg, const DLTensor* d_beta, Stream stream) {
  constexpr absl::string_view op = "GatedRecurrenceBackward";
  ASSIGN_OR_RETURN(const Backend backend, internal::BackendOf(op, "q", &q));
  const CallDevice call{q.device, "q"};
  ASSIGN_OR_RETURN(internal::RecurrenceArgs a,
                   CheckRecurrence(op, q, k, v, g, beta, prev_row, call, backend));
  RETURN_IF_ERROR(
      CheckLike(op, "d_out", &d_out, "q", q, {a.rows, a.heads, a.vd}, "[T, H, V]", call));
  RETURN_IF_ERROR(CheckLike(op, "dq", &dq, "q", q, {a.rows, a.heads, a.kd}, "[T, H, K]", call));
  RETURN_IF_ERROR(CheckLike(op, "dk", &dk, "q", q, {a.rows, a.heads, a.kd}, "[T, H, K]", call));
  RETURN_IF_ERROR(CheckLike(op, "dv", &dv, "q", q, {a.rows, a.heads, a.vd}, "[T, H, V]", call));
  RETURN_IF_ERROR(CheckLike(op, "dg", &dg, "q", q, {a.rows, a.heads}, "[T, H]", call));
  if ((beta == nullptr) != (d_beta == nullptr)) {
    return Invalid(op, "d_beta must be given exactly when beta is");
  }
  if (d_beta != nullptr) {
    RETURN_IF_ERROR(CheckLike(op, "d_beta", d_beta, "q", q, {a.rows, a.heads}, "[T, H]", call));
    a.d_beta = Data(*d_beta);
  }
  a.d_out = Data(d_out);
  a.dq = Data(dq);
  a.dk = Data(dk);
  a.dv = Data(dv);
  a.dg = Data(dg);
  return backend == Backend::kHost
             ? internal::cpu::GatedRecurrenceBackward(a)
             : internal::cuda::GatedRecurrenceBackward(a, call.device.device_id, stream);
}

}  // namespace packsched::kernels
