#ifndef PACKSCHED_SERVER_PLANNER_CELL_GREEDY_H_
#define PACKSCHED_SERVER_PLANNER_CELL_GREEDY_H_

// Internal to the planner: the plain cell greedy, one of the coordinator-mode candidates under
// Sync::kMicroBatch (docs/design.md §2, "Coordinator mode's sync"). Not part of the public API.

#include <cstdint>
#include <optional>

#include "absl/types/span.h"
#include "server/planner/prepared.h"
#include "server/planner/slot_grid.h"
#include "server/planner/stop_check.h"

namespace packsched::planner::internal {

// Cell visits above which BalanceBatch does not run FillCells: n x k x W, its worst case.
inline constexpr int64_t kCellGreedyVisits = int64_t{1} << 25;

// Items in `order` (PlacementOrder(items)), each into the cell (slot i, rank r) that least
// raises slot i's costliest cell (a cell costs `alpha` + its items' costs, 0 when empty) among
// the cells that take it within `capacity` (an isolated item: an empty cell, closed after it);
// ties to the lowest slot, then the lowest rank. Only the slots in use and the first empty one
// are candidates, so a slot opens only when no used one takes the item. nullopt when an item
// needs more than k slots, or once `stop` says stop (stop->status() tells which).
// REQUIRES: no item has a rank. O(n k W) at worst; a zero raise ends an item's scan.
std::optional<Grid> FillCells(absl::Span<const SlotItem> items, absl::Span<const int32_t> order,
                              const Capacity& capacity, int64_t world_size, int64_t k,
                              int64_t alpha, StopCheck* stop);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_CELL_GREEDY_H_
