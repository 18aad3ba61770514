#ifndef PACKSCHED_SERVER_CLI_PLAN_COMMAND_H_
#define PACKSCHED_SERVER_CLI_PLAN_COMMAND_H_

// `packsched plan`: which planner entry point a request goes to, and the timed result.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/cli/read_model_config.h"
#include "server/planner/options.h"
#include "server/planner/plan.h"
#include "server/planner/planner.h"

namespace packsched::cli {

// What `packsched plan` was asked to do (from its flags).
struct PlanRequest {
  planner::PlanOptions options;
  // Fixed micro-batch count (--num_parts); 0 = the fewest that meet the cap.
  int64_t num_parts = 0;
  // Coordinator mode (--world_size, BalanceBatch): 0 = one rank's plan.
  int64_t world_size = 0;
  planner::BalanceOptions balance;  // --sync, --micro_batch_cost (coordinator mode only)
  // --model_config: the cost from the model (cost = attention, its weights and, in coordinator
  // mode, micro_batch_cost), computed from the lengths when the plan runs.
  std::optional<ModelFields> model;
};

// The plan and what it took to make it.
struct PlanRun {
  planner::MicroBatchPlan plan;                 // empty in coordinator mode
  std::optional<planner::BalancedBatch> batch;  // coordinator mode only
  PlanRequest request;
  // "fixed_k" (PartitionFixedK), "balance" (PlanMicroBatches: kk, lpt), "pack" (PackDataset:
  // ffd, bfd, sequential) or "coordinator" (BalanceBatch).
  const char* mode = "";
  double plan_seconds = 0.0;  // wall time of the planner call alone
};

// Whether `request` names one consistent job, before any length is read. Returns
// InvalidArgument for a missing cap (neither max_token_len nor num_parts), equal_size without
// num_parts, num_parts with a packing algorithm, a negative num_parts or world_size, world_size
// with num_parts or a packing algorithm, sync / micro_batch_cost without world_size, options
// that planner::CheckOptions refuses (its message after "--"), num_parts above
// max_micro_batches, world_size above kMaxWorldSize, or micro_batch_cost outside
// [0, kMaxMicroBatchCost]. The planner checks the lengths.
absl::Status CheckRequest(const PlanRequest& request);

// CheckRequest(request), then runs it (with request.model, the cost weights from the model and
// the lengths first): --world_size goes to BalanceBatch, --num_parts to
// PartitionFixedK (kk or lpt; no cap needed), a packing algorithm to PackDataset, kk and lpt
// to PlanMicroBatches. Returns CheckRequest's error or the planner's own.
absl::StatusOr<PlanRun> RunPlan(absl::Span<const int64_t> lengths, const PlanRequest& request);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_PLAN_COMMAND_H_
