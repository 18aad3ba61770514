// The CPU backend of the context-parallel and multimodal-position kernels: the reference of the
// CUDA backend (both run the per-row math of kernels/common/context_parallel.h).

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/context_parallel.h"
#include "kernels/common/elementwise.h"
#include "kernels/internal/backend.h"

namespace packsched::kernels::internal::cpu {
namespace {

// Calls copy(x_row, shard_row, rows) for every contiguous run of a rank's rows: per sequence,
// its head chunk and its tail chunk.
template <typename Copy>
void ForEachChunk(const CpShardArgs& a, Copy copy) {
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t chunk = (a.cu[b + 1] - a.cu[b]) / (2 * a.cp);
    if (chunk == 0) continue;
    const int64_t local = a.cu[b] / a.cp;
    copy(a.cu[b] + a.rank * chunk, local, chunk);
    copy(a.cu[b] + (2 * a.cp - 1 - a.rank) * chunk, local + chunk, chunk);
  }
}

const char* MropeError(int code) {
  switch (code) {
    case 1:
      return "a vision token has no grid left";
    case 2:
      return "a grid runs past the end of the sequence";
    case 3:
      return "a grid covers a text token (type 0)";
    case 4:
      return "a grid's t < 1, or h or w is not a positive multiple of spatial_merge_size";
    default:
      return "grids are left over after the sequence's last vision token";
  }
}

}  // namespace

absl::Status CpShard(const CpShardArgs& a) {
  if (a.row_bytes == 0) return absl::OkStatus();
  auto* shard = static_cast<unsigned char*>(a.shard);
  const auto* x = static_cast<const unsigned char*>(a.x);
  ForEachChunk(a, [&](int64_t x_row, int64_t shard_row, int64_t rows) {
    std::memcpy(shard + shard_row * a.row_bytes, x + x_row * a.row_bytes, rows * a.row_bytes);
  });
  return absl::OkStatus();
}

absl::Status CpUnshard(const CpShardArgs& a) {
  if (a.row_bytes == 0) return absl::OkStatus();
  const auto* shard = static_cast<const unsigned char*>(a.shard);
  auto* x = static_cast<unsigned char*>(a.x);
  ForEachChunk(a, [&](int64_t x_row, int64_t shard_row, int64_t rows) {
    std::memcpy(x + x_row * a.row_bytes, shard + shard_row * a.row_bytes, rows * a.row_bytes);
  });
  return absl::OkStatus();
}

absl::Status MropePositionIds(const MropeArgs& a) {
  // Pass 1: types and grids must agree before anything is written.
  for (int64_t b = 0; b < a.batch; ++b) {
    const int code = MropeSequence(a.types + a.cu[b], a.cu[b + 1] - a.cu[b],
                                   a.grids + 3 * static_cast<int64_t>(a.grid_cu[b]),
                                   a.grid_cu[b + 1] - a.grid_cu[b], a.merge, nullptr, 0);
    if (code != 0) {
      return absl::InvalidArgumentError(absl::StrCat("MropePositionIds: sequence ", b, ": ",
                                                     MropeError(code), " (grids ", a.grid_cu[b],
                                                     " to ", a.grid_cu[b + 1], " of grid_thw)"));
    }
  }
  for (int64_t b = 0; b < a.batch; ++b) {
    MropeSequence(a.types + a.cu[b], a.cu[b + 1] - a.cu[b],
                  a.grids + 3 * static_cast<int64_t>(a.grid_cu[b]), a.grid_cu[b + 1] - a.grid_cu[b],
                  a.merge, a.position_ids + a.cu[b], a.rows);
  }
  for (int64_t t = a.cu[a.batch]; t < a.rows; ++t) {  // the tail: text restarting at 0
    const int64_t p = PositionId(t, a.cu[a.batch]);
    for (int row = 0; row < 3; ++row) a.position_ids[row * a.rows + t] = p;
  }
  return absl::OkStatus();
}

}  // namespace packsched::kernels::internal::cpu
