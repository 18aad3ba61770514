#ifndef PACKSCHED_CLIENT_CPP_PLAN_APPLY_H_
#define PACKSCHED_CLIENT_CPP_PLAN_APPLY_H_

// Applying a plan's reorder/revert to row-indexed data (one row per original sequence: prompts,
// rewards, log-probs, ...). Header-only templates over anything with size() and operator[].

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "server/planner/plan.h"

namespace packsched::client {

// The kept rows in plan order: out[i] = rows[reorder[i]] (micro-batch after micro-batch).
// Returns InvalidArgument if an index in `reorder` is outside `rows`.
template <typename Rows>
auto ApplyReorder(const Rows& rows, absl::Span<const int64_t> reorder)
    -> absl::StatusOr<std::vector<std::decay_t<decltype(rows[0])>>> {
  std::vector<std::decay_t<decltype(rows[0])>> out;
  out.reserve(reorder.size());
  for (int64_t index : reorder) {
    if (index < 0 || static_cast<size_t>(index) >= rows.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reorder index ", index, " is outside ", rows.size(), " rows"));
    }
    out.push_back(rows[index]);
  }
  return out;
}

// The rows of each micro-batch, in the plan's order: out[m][j] = rows[parts[m].indices[j]].
template <typename Rows>
auto SplitByMicroBatch(const Rows& rows, const planner::MicroBatchPlan& plan)
    -> absl::StatusOr<std::vector<std::vector<std::decay_t<decltype(rows[0])>>>> {
  std::vector<std::vector<std::decay_t<decltype(rows[0])>>> out(plan.parts.size());
  for (size_t m = 0; m < plan.parts.size(); ++m) {
    auto part = ApplyReorder(rows, plan.parts[m].indices);
    if (!part.ok()) return part.status();
    out[m] = *std::move(part);
  }
  return out;
}

// Undoes ApplyReorder: `planned` holds one row per kept sequence in plan order (e.g. the
// concatenated outputs of the micro-batches); out[i] = planned[revert[i]], or `fill` for a
// dropped sequence (revert[i] == -1). Returns InvalidArgument if `revert` points outside
// `planned`.
template <typename Rows, typename T = std::decay_t<decltype(std::declval<Rows>()[0])>>
absl::StatusOr<std::vector<T>> RestoreOrder(const Rows& planned, absl::Span<const int64_t> revert,
                                            const T& fill = T()) {
  std::vector<T> out;
  out.reserve(revert.size());
  for (int64_t position : revert) {
    if (position == -1) {
      out.push_back(fill);
      continue;
    }
    if (position < 0 || static_cast<size_t>(position) >= planned.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("revert position ", position, " is outside ", planned.size(), " rows"));
    }
    out.push_back(planned[position]);
  }
  return out;
}

}  // namespace packsched::client

#endif  // PACKSCHED_CLIENT_CPP_PLAN_APPLY_H_
