#ifndef PACKSCHED_SERVER_PLANNER_LPT_H_
#define PACKSCHED_SERVER_PLANNER_LPT_H_

// Longest processing time first: each item, largest cost first, to the least loaded part.

#include <cstdint>

#include "absl/types/span.h"
#include "server/planner/prepared.h"

namespace packsched::planner::internal {

// Positions 0..costs.size()-1 ordered by cost descending, ties by position ascending.
std::vector<int32_t> OrderByCostDesc(absl::Span<const int64_t> costs);
// Positions 0..costs.size()-1 ordered by cost ascending, ties by position ascending.
std::vector<int32_t> OrderByCostAsc(absl::Span<const int64_t> costs);

// Assigns items (visited in `order`) to exactly `limits.size()` parts: each to the part with
// the least cost among those below their count limit (ties: lowest part). Ignores caps.
// REQUIRES: sum of limits >= costs.size(); every limit >= 0. O(n log k).
Parts Lpt(absl::Span<const int64_t> costs, absl::Span<const int32_t> order,
          absl::Span<const int64_t> limits);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_LPT_H_
