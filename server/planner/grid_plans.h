#ifndef PACKSCHED_SERVER_PLANNER_GRID_PLANS_H_
#define PACKSCHED_SERVER_PLANNER_GRID_PLANS_H_

// Internal to the planner: a coordinator-mode slot grid as the public per-rank plans, and the
// step a batch of plans takes (docs/design.md §2, "Coordinator mode's sync").

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"
#include "server/planner/prepared.h"
#include "server/planner/slot_grid.h"

namespace packsched::planner::internal {

// The fewest micro-batches any plan of `v` needs in all: the cap's and the count limit's bound
// over the items planned normally, plus one per isolated item.
int64_t FewestCells(const Validated& v);

// No plan of `v` over world_size ranks has a step below this under either sync, with a non-empty
// micro-batch costing alpha + its items' costs: max(ceil((total cost + alpha x FewestCells) /
// world_size), alpha + the costliest item); 0 when the total cost is 0.
// REQUIRES: that sum fits in int64 (the plan's own step does).
int64_t StepLowerBound(const Validated& v, int64_t world_size, int64_t alpha);

// The plans of a grid over `items` (positions into v.items then v.isolated of the global batch
// `lengths`): rank r's micro-batch in slot i is the grid's cell (r, i), each rank's plan made as
// Problem makes one (Assemble over the rank's own validated lengths), the slots put in
// options.order by their costliest cell, then smallest global index, on every rank alike.
// `costs`: as Validate takes them, over the global batch. Errors only as Validate would for the
// rank's lengths (never, for a grid of validated items).
absl::StatusOr<std::vector<RankBatch>> RanksOfGrid(const Grid& grid,
                                                   absl::Span<const SlotItem> items,
                                                   absl::Span<const int64_t> lengths,
                                                   const PlanOptions& options,
                                                   absl::Span<const int64_t> costs = {});

// The step of `out` (StepStats), from its parts as laid out slot by slot, `v` being the global
// batch validated. REQUIRES: the costs of all micro-batches, alpha included, fit in int64.
StepStats StepOf(const BalancedBatch& out, const Validated& v, int64_t world_size,
                 const BalanceOptions& balance);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_GRID_PLANS_H_
