#ifndef PACKSCHED_SERVER_PLANNER_RANK_SEARCH_H_
#define PACKSCHED_SERVER_PLANNER_RANK_SEARCH_H_

// Internal to the planner: a local search on a coordinator-mode grid for Sync::kStep, where a
// step lasts as long as the largest rank total (docs/design.md §2, "Coordinator mode's sync").
// Not part of the public API.

#include <cstdint>

#include "absl/types/span.h"
#include "server/planner/prepared.h"
#include "server/planner/slot_grid.h"
#include "server/planner/stop_check.h"

namespace packsched::planner::internal {

// Moves and trades of sequences between ranks that shorten the step-sync step of `grid` (the
// largest over ranks of the sum of its cells, a non-empty cell costing `alpha` + its items').
// Each round takes the rank with the largest total (ties: the lowest) and makes the change that
// leaves the larger of the two ranks' totals least, if that is below the largest: one of its
// items to another rank's cell that takes it within `capacity` (unless `keep_counts`), or
// (tokens mode) a trade with a cheaper item of another rank whose two cells stay within the
// cap. Isolated items and items with a rank stay. Never makes the step longer; at most `rounds`
// changes, each round O(n log n + W k) or so; fewer once `stop` says stop (the grid stays valid;
// stop->status() tells why).
void ImproveRankTotals(Grid& grid, absl::Span<const SlotItem> items, const Capacity& capacity,
                       int64_t alpha, int64_t rounds, bool keep_counts, StopCheck* stop);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_RANK_SEARCH_H_
