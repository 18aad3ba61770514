#ifndef PACKSCHED_SERVER_PLANNER_ASSEMBLE_H_
#define PACKSCHED_SERVER_PLANNER_ASSEMBLE_H_

// Turns an internal partition into the public plan: part order, per-part host metadata,
// reorder/revert and stats.

#include <cstdint>
#include <limits>
#include <vector>

#include "server/planner/plan.h"
#include "server/planner/prepared.h"

namespace packsched::planner::internal {

// Where a part goes in the plan's order: what the order compares, and which part it is. Parts
// are placed by sorting these small keys, then built once in their final place.
struct PartKey {
  int64_t cost = 0;
  int64_t first_index = std::numeric_limits<int64_t>::max();  // max for an empty part
  int32_t part = 0;  // which part, in the caller's numbering
};

// Sorts `keys` into `order` (options.order). Keys that tie in cost and first_index keep no
// particular order; Assemble's tie only between empty parts, which are equal in every field.
void OrderParts(std::vector<PartKey>& keys, PartOrder order);

// `parts` are over `v.items`; each of `v.isolated` becomes one more part flagged overlong.
// `lower_bound_k` and `local_k` are reported in the stats.
MicroBatchPlan Assemble(const Validated& v, const Parts& parts, int64_t lower_bound_k,
                        int64_t local_k);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_ASSEMBLE_H_
