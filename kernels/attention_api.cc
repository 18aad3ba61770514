// The front end of varlen attention: validates every argument on the host (attention.h lists
// them), fills internal::AttentionArgs and dispatches on the device type.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/internal/backend.h"
#include "kernels/internal/validate.h"
#include "packsched/kernels/attention.h"
#include "server/base/status_macros.h"

namespace packsched::kernels {
namespace {

using internal::AttentionArgs;
using internal::Backend;
using internal::CallDevice;
using internal::CheckedSeqlens;
using internal::CheckSameDType;
using internal::CheckSeqlens;
using internal::CheckShape;
using internal::CheckTensor;
using internal::Data;
using internal::FloatType;
using internal::Invalid;
using internal::ShapeString;

constexpr int64_t kMaxHeadDim = 256;

// gridDim.y (heads) and gridDim.z (sequences) of the CUDA launches (attention_launch.cuh).
constexpr int64_t kMaxCudaGridYZ = 65535;

struct Checked {
  Backend backend;
  CallDevice call;
  AttentionArgs args;
};

absl::Status CheckMaxSeqlen(absl::string_view op, absl::string_view name, int64_t max_seqlen,
                            const CheckedSeqlens& cu, absl::string_view cu_name) {
  if (max_seqlen < cu.max_len) {
    return Invalid(
        op, absl::StrCat(name, " = ", max_seqlen, " is less than the longest segment of ", cu_name,
                         " (", cu.max_len, ")"));
  }
  return absl::OkStatus();
}

// FlashAttention's varlen front end (mha_varlen_fwd / _bwd): a window side >= max_seqlen_k is
// unbounded (-1). For the right side this widens the rows of a sequence with sq > sk (see
// attention.h); the left side it never changes.
int64_t NormalizedWindow(int64_t window, int64_t max_seqlen_k) {
  return window >= max_seqlen_k ? -1 : window;
}

// Finite, and still finite once rounded to float (values just above FLT_MAX round to +inf).
bool FiniteAsFloat(double x) { return std::isfinite(x) && std::isfinite(static_cast<float>(x)); }

// The CUDA launch grid: (tiles of max_seqlen, heads, sequences); y and z are limited to 65535.
// A tail takes one more sequence slot of the grid (attention_device.cuh's LaunchSpan).
absl::Status CheckCudaGrid(absl::string_view op, int64_t batch, bool tail, int64_t heads,
                           const AttentionSeqlens& seqlens) {
  if (batch + (tail ? 1 : 0) > kMaxCudaGridYZ) {
    return Invalid(op, absl::StrCat("B = ", batch, " sequences", tail ? " and a tail" : "",
                                    " exceed the CUDA backend's limit of ", kMaxCudaGridYZ,
                                    " per call; split the batch"));
  }
  if (heads > kMaxCudaGridYZ) {
    return Invalid(op,
                   absl::StrCat("H = ", heads, " query heads exceed the CUDA backend's limit of ",
                                kMaxCudaGridYZ, " per call"));
  }
  for (const auto& [name, value] : {std::pair{"max_seqlen_q", seqlens.max_seqlen_q},
                                    std::pair{"max_seqlen_k", seqlens.max_seqlen_k}}) {
    if (value > std::numeric_limits<int32_t>::max()) {
      return Invalid(op, absl::StrCat(name, " = ", value,
                                      " exceeds the CUDA backend's limit of 2^31 - 1 rows"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const int32_t*> CheckSeqused(absl::string_view op, absl::string_view name,
                                            const DLTensor* t, int64_t batch,
                                            const CallDevice& call) {
  if (t == nullptr) return nullptr;
  RETURN_IF_ERROR(CheckTensor(op, name, t, call));
  RETURN_IF_ERROR(internal::CheckDType(op, name, *t, kDLInt, 32));
  RETURN_IF_ERROR(CheckShape(op, name, *t, {batch}, "[B]"));
  return static_cast<const int32_t*>(Data(*t));
}

// The tree arguments (attention.h): shapes, dtypes and the layout they need; the value ranges are
// the CPU backend's (cpu::AttentionForward). Sets a.subtree_end, a.positions and moves the left
// window onto the positions (a.tree_window_left; a.window_left = -1).
absl::Status CheckTree(absl::string_view op, const AttentionSeqlens& seqlens,
                       const AttentionOptions& options, const CheckedSeqlens& cu_q,
                       const CheckedSeqlens& cu_k, const CallDevice& call, AttentionArgs& a) {
  a.subtree_end = nullptr;
  a.positions = nullptr;
  a.tree_window_left = -1;
  if (seqlens.subtree_end == nullptr) {
    if (seqlens.positions != nullptr) {
      return Invalid(op, "positions is given without subtree_end (it is read only with a tree)");
    }
    return absl::OkStatus();
  }
  if (!options.causal) return Invalid(op, "a tree (subtree_end) needs causal = true");
  const bool same_layout =
      cu_q.batch == cu_k.batch && cu_q.rows == cu_k.rows &&
      std::equal(cu_q.host, cu_q.host + cu_q.batch + 1, cu_k.host, cu_k.host + cu_k.batch + 1);
  if (!same_layout) {
    return Invalid(op,
                   "a tree (subtree_end) needs the self-attention layout: cu_seqlens_q and "
                   "cu_seqlens_k (and their rows) must be equal");
  }
  if ((seqlens.seqused_q == nullptr) != (seqlens.seqused_k == nullptr)) {
    return Invalid(op, "a tree (subtree_end) needs seqused_q and seqused_k both or neither");
  }
  RETURN_IF_ERROR(CheckTensor(op, "subtree_end", seqlens.subtree_end, call));
  RETURN_IF_ERROR(internal::CheckDType(op, "subtree_end", *seqlens.subtree_end, kDLInt, 32));
  RETURN_IF_ERROR(CheckShape(op, "subtree_end", *seqlens.subtree_end, {a.total_k}, "[tk]"));
  const int64_t window = NormalizedWindow(options.window_left, seqlens.max_seqlen_k);
  if (seqlens.positions != nullptr) {
    RETURN_IF_ERROR(CheckTensor(op, "positions", seqlens.positions, call));
    RETURN_IF_ERROR(internal::CheckDType(op, "positions", *seqlens.positions, kDLInt, 32));
    RETURN_IF_ERROR(CheckShape(op, "positions", *seqlens.positions, {a.total_q}, "[tq]"));
    a.positions = static_cast<const int32_t*>(Data(*seqlens.positions));
  } else if (window >= 0) {
    return Invalid(op, absl::StrCat("positions is required with a tree (subtree_end) and a left "
                                    "window (window_left = ",
                                    window, ")"));
  }
  a.subtree_end = static_cast<const int32_t*>(Data(*seqlens.subtree_end));
  a.tree_window_left = window;
  a.window_left = -1;
  return absl::OkStatus();
}

// The query-row map (attention.h): int32 [nq] of strictly ascending rows of q in host memory (a
// CPU tensor, or CUDA pinned host memory on the CUDA backend). Sets a.query_rows and
// a.num_query_rows.
absl::Status CheckQueryRows(absl::string_view op, const AttentionSeqlens& seqlens, Backend backend,
                            const CallDevice& call, AttentionArgs& a) {
  a.query_rows = nullptr;
  a.num_query_rows = 0;
  const DLTensor* rows = seqlens.query_rows;
  if (rows == nullptr) return absl::OkStatus();
  if (backend == Backend::kCuda && rows->device.device_type != kDLCPU &&
      rows->device.device_type != kDLCUDAHost) {
    return Invalid(op, "query_rows (a query-row map) must be in host memory (a CPU tensor), got " +
                           internal::DeviceString(rows->device));
  }
  RETURN_IF_ERROR(
      CheckTensor(op, "query_rows", rows,
                  backend == Backend::kCuda ? CallDevice{rows->device, "query_rows"} : call));
  RETURN_IF_ERROR(internal::CheckDType(op, "query_rows", *rows, kDLInt, 32));
  if (rows->ndim != 1) {
    return Invalid(op, absl::StrCat("query_rows must be [nq], got ", ShapeString(*rows)));
  }
  const auto* data = static_cast<const int32_t*>(Data(*rows));
  for (int64_t i = 0; i < rows->shape[0]; ++i) {
    const int64_t low = i == 0 ? 0 : int64_t{data[i - 1]} + 1;
    if (data[i] < low || data[i] >= a.total_q) {
      return Invalid(op, absl::StrCat("query_rows[", i, "] = ", data[i], " is outside [", low, ", ",
                                      a.total_q, ") (strictly ascending rows of q)"));
    }
  }
  a.query_rows = data;
  a.num_query_rows = rows->shape[0];
  return absl::OkStatus();
}

// Checks q, k, v, the layout and the options: everything the forward and backward share.
absl::StatusOr<Checked> CheckCommon(absl::string_view op, const DLTensor& q, const DLTensor& k,
                                    const DLTensor& v, const AttentionSeqlens& seqlens,
                                    const AttentionOptions& options) {
  Checked c;
  ASSIGN_OR_RETURN(c.backend, internal::BackendOf(op, "q", &q));
  c.call = CallDevice{q.device, "q"};
  AttentionArgs& a = c.args;
  a = AttentionArgs{};
  RETURN_IF_ERROR(CheckTensor(op, "q", &q, c.call));
  RETURN_IF_ERROR(CheckTensor(op, "k", &k, c.call));
  RETURN_IF_ERROR(CheckTensor(op, "v", &v, c.call));
  ASSIGN_OR_RETURN(a.dtype, internal::FloatTypeOf(op, "q", q));
  if (a.dtype == FloatType::kF64 && c.backend == Backend::kCuda) {
    return Invalid(op, "float64 attention is supported on the CPU backend only");
  }
  RETURN_IF_ERROR(CheckSameDType(op, "k", k, "q", q));
  RETURN_IF_ERROR(CheckSameDType(op, "v", v, "q", q));
  if (q.ndim != 3) return Invalid(op, absl::StrCat("q must be [tq, H, D], got ", ShapeString(q)));
  if (k.ndim != 3) return Invalid(op, absl::StrCat("k must be [tk, Hk, D], got ", ShapeString(k)));
  a.total_q = q.shape[0];
  a.heads = q.shape[1];
  a.head_dim = q.shape[2];
  a.total_k = k.shape[0];
  a.kv_heads = k.shape[1];
  if (a.head_dim % 8 != 0 || a.head_dim < 8 || a.head_dim > kMaxHeadDim) {
    return Invalid(
        op, absl::StrCat("head dim D = ", a.head_dim, " must be a multiple of 8 in [8, 256]"));
  }
  if (k.shape[2] != a.head_dim) {
    return Invalid(op, absl::StrCat("k has head dim ", k.shape[2], " but q has ", a.head_dim));
  }
  RETURN_IF_ERROR(CheckShape(op, "v", v, {a.total_k, a.kv_heads, a.head_dim}, "k's shape"));
  if (a.heads < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0) {
    return Invalid(op,
                   absl::StrCat("the query heads H = ", a.heads,
                                " must be a positive multiple of the kv heads Hk = ", a.kv_heads));
  }
  ASSIGN_OR_RETURN(const CheckedSeqlens cu_q,
                   CheckSeqlens(op, "cu_seqlens_q", seqlens.q, c.call, c.backend));
  ASSIGN_OR_RETURN(const CheckedSeqlens cu_k,
                   CheckSeqlens(op, "cu_seqlens_k", seqlens.k, c.call, c.backend));
  if (cu_q.batch != cu_k.batch) {
    return Invalid(op, absl::StrCat("cu_seqlens_q has B = ", cu_q.batch,
                                    " sequences but cu_seqlens_k has B = ", cu_k.batch));
  }
  RETURN_IF_ERROR(internal::CheckRows(op, "q", q, cu_q, "cu_seqlens_q"));
  RETURN_IF_ERROR(internal::CheckRows(op, "k", k, cu_k, "cu_seqlens_k"));
  RETURN_IF_ERROR(CheckMaxSeqlen(op, "max_seqlen_q", seqlens.max_seqlen_q, cu_q, "cu_seqlens_q"));
  RETURN_IF_ERROR(CheckMaxSeqlen(op, "max_seqlen_k", seqlens.max_seqlen_k, cu_k, "cu_seqlens_k"));
  ASSIGN_OR_RETURN(a.seqused_q,
                   CheckSeqused(op, "seqused_q", seqlens.seqused_q, cu_q.batch, c.call));
  ASSIGN_OR_RETURN(a.seqused_k,
                   CheckSeqused(op, "seqused_k", seqlens.seqused_k, cu_k.batch, c.call));

  if (c.backend == Backend::kCuda) {
    const bool tail = cu_q.rows > cu_q.total || cu_k.rows > cu_k.total;
    RETURN_IF_ERROR(CheckCudaGrid(op, cu_q.batch, tail, a.heads, seqlens));
  }

  // Both backends compute in float (fp64 inputs on the CPU in double): the scale and the cap must
  // mean the same there as the doubles the caller passed.
  a.scale = options.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(a.head_dim)));
  if (!FiniteAsFloat(a.scale)) {
    return Invalid(op, absl::StrCat("softmax_scale must be finite as a float32 (|x| <= ",
                                    std::numeric_limits<float>::max(), "), got ", a.scale));
  }
  if (options.softcap != 0 &&
      !(FiniteAsFloat(options.softcap) &&
        static_cast<float>(options.softcap) >= std::numeric_limits<float>::min())) {
    return Invalid(op, absl::StrCat("softcap must be 0 (off) or a normal positive float32 in [",
                                    std::numeric_limits<float>::min(), ", ",
                                    std::numeric_limits<float>::max(), "], got ", options.softcap));
  }
  if (options.window_left < -1 || options.window_right < -1) {
    return Invalid(op, absl::StrCat("window (", options.window_left, ", ", options.window_right,
                                    ") must have entries >= -1 (-1 = unbounded)"));
  }
  if (options.num_threads < 0) {
    return Invalid(op, absl::StrCat("num_threads must be >= 0, got ", options.num_threads));
  }
  a.q = Data(q);
  a.k = Data(k);
  a.v = Data(v);
  a.cu_q = cu_q.device;
  a.cu_k = cu_k.device;
  a.cu_q_host = cu_q.host;
  a.cu_k_host = cu_k.host;
  a.batch = cu_q.batch;
  a.max_seqlen_q = seqlens.max_seqlen_q;
  a.max_seqlen_k = seqlens.max_seqlen_k;
  a.softcap = options.softcap;
  a.causal = options.causal;
  a.window_left = NormalizedWindow(options.window_left, seqlens.max_seqlen_k);
  a.window_right = NormalizedWindow(options.window_right, seqlens.max_seqlen_k);
  RETURN_IF_ERROR(CheckTree(op, seqlens, options, cu_q, cu_k, c.call, a));
  RETURN_IF_ERROR(CheckQueryRows(op, seqlens, c.backend, c.call, a));
  a.num_threads = options.num_threads > 0
                      ? options.num_threads
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return c;
}

// out-like tensors: q's dtype and shape.
absl::Status CheckLikeQ(absl::string_view op, absl::string_view name, const DLTensor& t,
                        const DLTensor& q, const Checked& c) {
  RETURN_IF_ERROR(CheckTensor(op, name, &t, c.call));
  RETURN_IF_ERROR(CheckSameDType(op, name, t, "q", q));
  return CheckShape(op, name, t, {c.args.total_q, c.args.heads, c.args.head_dim}, "[tq, H, D]");
}

absl::Status CheckLikeK(absl::string_view op, absl::string_view name, const DLTensor& t,
                        const DLTensor& q, const Checked& c) {
  RETURN_IF_ERROR(CheckTensor(op, name, &t, c.call));
  RETURN_IF_ERROR(CheckSameDType(op, name, t, "q", q));
  return CheckShape(op, name, t, {c.args.total_k, c.args.kv_heads, c.args.head_dim}, "[tk, Hk, D]");
}

absl::Status CheckLse(absl::string_view op, const DLTensor& lse, const Checked& c) {
  RETURN_IF_ERROR(CheckTensor(op, "lse", &lse, c.call));
  const uint8_t bits = c.args.dtype == FloatType::kF64 ? 64 : 32;
  RETURN_IF_ERROR(internal::CheckDType(op, "lse", lse, kDLFloat, bits));
  return CheckShape(op, "lse", lse, {c.args.heads, c.args.total_q}, "[H, tq]");
}

}  // namespace

absl::Status VarlenAttentionForward(const DLTensor& q, const DLTensor& k, const DLTensor& v,
                                    const AttentionSeqlens& seqlens,
                                    const AttentionOptions& options, const DLTensor& out,
                                    const DLTensor& lse, Stream stream) {
  constexpr absl::string_view op = "VarlenAttentionForward";
  ASSIGN_OR_RETURN(Checked c, CheckCommon(op, q, k, v, seqlens, options));
  RETURN_IF_ERROR(CheckLikeQ(op, "out", out, q, c));
  RETURN_IF_ERROR(CheckLse(op, lse, c));
  c.args.out = Data(out);
  c.args.lse = Data(lse);
  return c.backend == Backend::kHost
             ? internal::cpu::AttentionForward(c.args)
             : internal::cuda::AttentionForward(c.args, c.call.device.device_id, stream);
}

absl::Status VarlenAttentionBackward(const DLTensor& dout, const DLTensor& q, const DLTensor& k,
                                     const DLTensor& v, const DLTensor& out, const DLTensor& lse,
                                     const AttentionSeqlens& seqlens,
                                     const AttentionOptions& options, const DLTensor& dq,
                                     const DLTensor& dk, const DLTensor& dv, Stream stream) {
  constexpr absl::string_view op = "VarlenAttentionBackward";
  ASSIGN_OR_RETURN(Checked c, CheckCommon(op, q, k, v, seqlens, options));
  RETURN_IF_ERROR(CheckLikeQ(op, "dout", dout, q, c));
  RETURN_IF_ERROR(CheckLikeQ(op, "out", out, q, c));
  RETURN_IF_ERROR(CheckLse(op, lse, c));
  RETURN_IF_ERROR(CheckLikeQ(op, "dq", dq, q, c));
  RETURN_IF_ERROR(CheckLikeK(op, "dk", dk, q, c));
  RETURN_IF_ERROR(CheckLikeK(op, "dv", dv, q, c));
  c.args.dout = Data(dout);
  c.args.out = Data(out);
  c.args.lse = Data(lse);
  c.args.dq = Data(dq);
  c.args.dk = Data(dk);
  c.args.dv = Data(dv);
  return c.backend == Backend::kHost
             ? internal::cpu::AttentionBackward(c.args)
             : internal::cuda::AttentionBackward(c.args, c.call.device.device_id, stream);
}

}  // namespace packsched::kernels
