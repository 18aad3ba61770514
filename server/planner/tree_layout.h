#ifndef PACKSCHED_SERVER_PLANNER_TREE_LAYOUT_H_
#define PACKSCHED_SERVER_PLANNER_TREE_LAYOUT_H_

// Internal to the planner: a plan over tree pieces laid out row by row (tree_plan.h).

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "server/planner/forest.h"
#include "server/planner/plan.h"
#include "server/planner/tree_plan.h"

namespace packsched::planner::internal {

// `plan`'s parts hold piece ids into `pieces` (global ids: the caller maps a rank's local
// indices first). `dropped` are the rollouts left out. REQUIRES: every piece of the plan is
// valid for `forest` (TreeProblem made them).
TreePlan LayOut(MicroBatchPlan plan, absl::Span<const TreePiece> pieces, const Forest& forest,
                const ForestIndex& index, const std::vector<int64_t>& dropped);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_TREE_LAYOUT_H_
