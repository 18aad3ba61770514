// The front end of the context-parallel and multimodal-position kernels
// (packsched/kernels/context_parallel.h): host validation, then dispatch on the device type, as
// kernels.cc does for the packing kernels.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/internal/backend.h"
#include "kernels/internal/validate.h"
#include "packsched/kernels/context_parallel.h"
#include "server/base/status_macros.h"

namespace packsched::kernels {
namespace {

using internal::Backend;
using internal::BackendOf;
using internal::CallDevice;
using internal::CheckCopyableDType;
using internal::CheckDType;
using internal::CheckedSeqlens;
using internal::CheckNoTail;
using internal::CheckSameDType;
using internal::CheckSeqlens;
using internal::CheckShape;
using internal::CheckTensor;
using internal::Data;
using internal::Invalid;
using internal::RowBytes;
using internal::ShapeString;
using internal::WithTrailing;

// Validates a shard/unshard call: `full` is x ([total, ...]), `part` the shard; both roles are
// named as the caller sees them.
absl::StatusOr<internal::CpShardArgs> CheckCpCall(absl::string_view op, const DLTensor& full,
                                                  const DLTensor& part, const Seqlens& seqlens,
                                                  int64_t cp, int64_t rank, Backend backend,
                                                  const CallDevice& call) {
  RETURN_IF_ERROR(CheckTensor(op, "x", &full, call));
  RETURN_IF_ERROR(CheckCopyableDType(op, "x", full));
  if (full.ndim < 1) {
    return Invalid(op, absl::StrCat("x must have shape [total, ...], got ", ShapeString(full)));
  }
  if (cp < 1) return Invalid(op, absl::StrCat("cp must be >= 1, got ", cp));
  if (rank < 0 || rank >= cp) {
    return Invalid(op, absl::StrCat("rank must be in [0, cp = ", cp, "), got ", rank));
  }
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckNoTail(op, "cu_seqlens", cu));
  for (int64_t b = 0; b < cu.batch; ++b) {
    const int64_t len = cu.host[b + 1] - cu.host[b];
    if (len % (2 * cp) != 0) {
      return Invalid(op, absl::StrCat("cu_seqlens: sequence ", b, " has length ", len,
                                      ", not a multiple of 2 * cp = ", 2 * cp,
                                      " (align it: align_to = 2 * cp * tp)"));
    }
  }
  if (full.shape[0] != cu.total) {
    return Invalid(op, absl::StrCat("x has ", full.shape[0], " rows but cu_seqlens[B] = ", cu.total,
                                    " (total mismatch)"));
  }
  RETURN_IF_ERROR(CheckTensor(op, "shard", &part, call));
  RETURN_IF_ERROR(CheckSameDType(op, "shard", part, "x", full));
  RETURN_IF_ERROR(
      CheckShape(op, "shard", part, WithTrailing({cu.total / cp}, full, 1), "[total / cp, ...]"));
  internal::CpShardArgs a;
  a.x = Data(full);
  a.cu = cu.device;
  a.batch = cu.batch;
  a.total = cu.total;
  a.row_bytes = RowBytes(full, 1);
  a.cp = cp;
  a.rank = rank;
  a.shard = Data(part);
  return a;
}

}  // namespace

absl::Status CpShard(const DLTensor& x, const Seqlens& seqlens, int64_t cp, int64_t rank,
                     const DLTensor& shard, Stream stream) {
  constexpr absl::string_view op = "CpShard";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "x", &x));
  const CallDevice call{x.device, "x"};
  ASSIGN_OR_RETURN(const internal::CpShardArgs a,
                   CheckCpCall(op, x, shard, seqlens, cp, rank, backend, call));
  return backend == Backend::kHost ? internal::cpu::CpShard(a)
                                   : internal::cuda::CpShard(a, call.device.device_id, stream);
}

absl::Status CpUnshard(const DLTensor& shard, const Seqlens& seqlens, int64_t cp, int64_t rank,
                       const DLTensor& x, Stream stream) {
  constexpr absl::string_view op = "CpUnshard";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "shard", &shard));
  const CallDevice call{shard.device, "shard"};
  ASSIGN_OR_RETURN(const internal::CpShardArgs a,
                   CheckCpCall(op, x, shard, seqlens, cp, rank, backend, call));
  return backend == Backend::kHost ? internal::cpu::CpUnshard(a)
                                   : internal::cuda::CpUnshard(a, call.device.device_id, stream);
}

absl::Status MropePositionIds(const DLTensor& token_types, const Seqlens& seqlens,
                              const DLTensor& grid_thw, const Seqlens& grid_seqlens,
                              int64_t spatial_merge_size, const DLTensor& position_ids,
                              Stream stream) {
  constexpr absl::string_view op = "MropePositionIds";
  ASSIGN_OR_RETURN(const Backend backend, BackendOf(op, "token_types", &token_types));
  const CallDevice call{token_types.device, "token_types"};
  RETURN_IF_ERROR(CheckTensor(op, "token_types", &token_types, call));
  RETURN_IF_ERROR(CheckDType(op, "token_types", token_types, kDLInt, 32));
  ASSIGN_OR_RETURN(const CheckedSeqlens cu, CheckSeqlens(op, "cu_seqlens", seqlens, call, backend));
  RETURN_IF_ERROR(CheckShape(op, "token_types", token_types, {cu.rows}, "[rows]"));
  RETURN_IF_ERROR(CheckTensor(op, "grid_thw", &grid_thw, call));
  RETURN_IF_ERROR(CheckDType(op, "grid_thw", grid_thw, kDLInt, 32));
  if (grid_thw.ndim != 2 || grid_thw.shape[1] != 3) {
    return Invalid(op,
                   absl::StrCat("grid_thw must have shape [N, 3], got ", ShapeString(grid_thw)));
  }
  ASSIGN_OR_RETURN(const CheckedSeqlens grid_cu,
                   CheckSeqlens(op, "grid_cu_seqlens", grid_seqlens, call, backend));
  RETURN_IF_ERROR(CheckNoTail(op, "grid_cu_seqlens", grid_cu));
  if (grid_cu.batch != cu.batch) {
    return Invalid(op, absl::StrCat("grid_cu_seqlens has B = ", grid_cu.batch,
                                    " sequences but cu_seqlens has B = ", cu.batch));
  }
  if (grid_cu.total != grid_thw.shape[0]) {
    return Invalid(op, absl::StrCat("grid_cu_seqlens[B] = ", grid_cu.total, " but grid_thw has ",
                                    grid_thw.shape[0], " grids"));
  }
  if (spatial_merge_size < 1) {
    return Invalid(op, absl::StrCat("spatial_merge_size must be >= 1, got ", spatial_merge_size));
  }
  RETURN_IF_ERROR(CheckTensor(op, "position_ids", &position_ids, call));
  RETURN_IF_ERROR(CheckDType(op, "position_ids", position_ids, kDLInt, 64));
  RETURN_IF_ERROR(CheckShape(op, "position_ids", position_ids, {3, cu.rows}, "[3, rows]"));

  internal::MropeArgs a;
  a.types = static_cast<const int32_t*>(Data(token_types));
  a.cu = cu.device;
  a.grids = static_cast<const int32_t*>(Data(grid_thw));
  a.grid_cu = grid_cu.device;
  a.batch = cu.batch;
  a.rows = cu.rows;
  a.merge = spatial_merge_size;
  a.position_ids = static_cast<int64_t*>(Data(position_ids));
  return backend == Backend::kHost
             ? internal::cpu::MropePositionIds(a)
             : internal::cuda::MropePositionIds(a, call.device.device_id, stream);
}

}  // namespace packsched::kernels
