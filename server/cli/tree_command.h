#ifndef PACKSCHED_SERVER_CLI_TREE_COMMAND_H_
#define PACKSCHED_SERVER_CLI_TREE_COMMAND_H_

// `packsched plan --tree=FILE`: the plan of a forest of rollouts (server/planner/tree_plan.h),
// with the same flags as a plan of lengths, as a table or as JSON.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/cli/plan_command.h"
#include "server/planner/forest.h"
#include "server/planner/tree_plan.h"

namespace packsched::cli {

struct TreePlanRun {
  PlanRun run;  // the request, the mode and the timing (its plan and batch stay empty)
  std::optional<planner::TreePlan> plan;         // one rank's plan
  std::optional<planner::BalancedForest> batch;  // coordinator mode (--world_size)
  int64_t unique_tokens = 0;                     // the forest's: every token once
  planner::Forest forest;                        // what was planned (the layout's entries)
};

// CheckRequest(request), then the forest's plan as RunPlan makes one for lengths: PlanForest,
// PartitionForestFixedK (--num_parts), PackForest (a packing algorithm) or BalanceForest
// (--world_size). --model_config costs the model over the forest (planner::UseModelCost's
// forest overload, server/planner/model_cost.h). Returns
// CheckRequest's error or the planner's (a bad forest names the node or rollout).
absl::StatusOr<TreePlanRun> RunTreePlan(const planner::Forest& forest, const PlanRequest& request);

// One JSON object and a newline: PlanJson's fields for the micro-batches (their "indices" are
// piece ids) plus, per micro-batch, the layout (rollouts, piece_rollouts, piece_rollout_begin)
// and its entries (planner::Entries: nodes, piece_begin, row, position, subtree_end, parent,
// rollout_entry), and for the plan dropped, rollout_part,
// forwarded_tokens, rollout_tokens and unique_tokens; in coordinator mode "ranks" holds one
// such plan per rank, then dropped and step.
std::string TreePlanJson(const TreePlanRun& run);

// A summary (micro-batches, tokens forwarded against flat packing's and the unique tokens) and
// one line per micro-batch: pieces, rollouts, tokens and cost.
std::string TreePlanTable(const TreePlanRun& run);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_TREE_COMMAND_H_
