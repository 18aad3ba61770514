#ifndef PACKSCHED_SERVER_PLANNER_SLOT_GRID_H_
#define PACKSCHED_SERVER_PLANNER_SLOT_GRID_H_

// Internal to the planner: coordinator-mode schedules as a grid of W ranks x k slots, each cell
// one micro-batch (docs/design.md §2, "sync"). Not part of the public API.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "server/planner/prepared.h"
#include "server/planner/stop_check.h"

namespace packsched::planner::internal {

// One sequence to place. `isolated`: overlong under kIsolate, alone in its cell.
// `rank`: the rank it must go to (its group's), or -1 for any.
struct SlotItem {
  Item item;
  bool isolated = false;
  int32_t rank = -1;
};

// cells[r * k + i]: positions (into the SlotItem array) of rank r's micro-batch in slot i.
struct Grid {
  int64_t world_size = 0;
  int64_t k = 0;
  std::vector<std::vector<int32_t>> cells;

  std::vector<int32_t>& cell(int64_t rank, int64_t slot) { return cells[rank * k + slot]; }
  const std::vector<int32_t>& cell(int64_t rank, int64_t slot) const {
    return cells[rank * k + slot];
  }
};

// The step of a grid: a cell costs `alpha` + its items' costs, 0 when empty.
// REQUIRES: the costs of all cells together fit in int64 (callers check it once).
struct GridCosts {
  int64_t step_sync = 0;         // max over ranks of the sum over slots
  int64_t micro_batch_sync = 0;  // sum over slots of the max over ranks
};
GridCosts CostsOf(const Grid& grid, absl::Span<const SlotItem> items, int64_t alpha);

// Positions of `items`: isolated ones first, then by cost descending, ties by position.
// REQUIRES: the normal items, and the isolated ones, each in original index order.
std::vector<int32_t> PlacementOrder(absl::Span<const SlotItem> items);

// Greedy slot balancing: items in `order` (PlacementOrder(items)), each to the slot whose largest
// cell grows least when the item joins that slot's cheapest open cell (ties: the slot left with the
// least room under its largest cell, then the lowest slot), in the cheapest cell of that slot that
// fits `capacity` (an item with a rank: that rank's cell). nullopt when some item fits no cell.
// O(W k + n (log k + log W)) when the first cell tried fits; an item with a rank scans its k
// cells. Also nullopt once `stop` says stop (stop->status() tells which).
std::optional<Grid> FillSlots(absl::Span<const SlotItem> items, absl::Span<const int32_t> order,
                              const Capacity& capacity, int64_t world_size, int64_t k,
                              int64_t alpha, StopCheck* stop);

// Row greedy: the slots filled one after the other, the items in `order` (PlacementOrder(items))
// each to the current slot's cheapest cell that takes it (ties: the lowest rank), or, when none
// does, to the next slot. nullopt when k slots do not hold every item. REQUIRES: no item has a
// rank. O(n log W) when the first cell tried fits, O(W log W) for an item that opens a slot.
// Also nullopt once `stop` says stop.
std::optional<Grid> FillRows(absl::Span<const SlotItem> items, absl::Span<const int32_t> order,
                             const Capacity& capacity, int64_t world_size, int64_t k, int64_t alpha,
                             StopCheck* stop);

// Moves that shorten the micro-batch-sync step: an item leaves the costliest cell of a slot for
// another cell, or (with `swaps`, tokens cap mode) trades places with a cheaper item of another
// cell, whichever lowers that slot's cost most without raising the other cell's slot cost,
// within `capacity` and every item's rank. Never makes the step longer. Up to `rounds` passes
// over the slots, one change per slot a pass; fewer once `stop` says stop (the grid stays valid).
void ImproveSlots(Grid& grid, absl::Span<const SlotItem> items, const Capacity& capacity,
                  int64_t alpha, int rounds, bool swaps, StopCheck* stop);

// Whole bins (each within capacity, at most world_size x k of them) as a grid. by_rank_total:
// bins to ranks by LPT on cost with at most k per rank (balanced rank totals, Sync::kStep);
// otherwise dealt by cost descending slot by slot (W per slot: the largest together). Either
// way each rank's bins fill its slots by cost descending.
Grid GridFromBins(const std::vector<std::vector<int32_t>>& bins, absl::Span<const SlotItem> items,
                  int64_t world_size, int64_t k, bool by_rank_total);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_SLOT_GRID_H_
