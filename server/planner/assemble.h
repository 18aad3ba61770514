#ifndef PACKSCHED_SERVER_PLANNER_ASSEMBLE_H_
#define PACKSCHED_SERVER_PLANNER_ASSEMBLE_H_

// Turns an internal partition into the public plan: part order, per-part host metadata,
// reorder/revert and stats.

#include <cstdint>

#include "server/planner/plan.h"
#include "server/planner/prepared.h"

namespace packsched::planner::internal {

// `parts` are over `v.items`; each of `v.isolated` becomes one more part flagged overlong.
// `lower_bound_k` and `local_k` are reported in the stats.
MicroBatchPlan Assemble(const Validated& v, const Parts& parts, int64_t lower_bound_k,
                        int64_t local_k);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_ASSEMBLE_H_
