#ifndef PACKSCHED_SERVER_CLI_PLAN_COMMAND_H_
#define PACKSCHED_SERVER_CLI_PLAN_COMMAND_H_

// `packsched plan`: which planner entry point a request goes to, and the timed result.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/options.h"
#include "server/planner/plan.h"

namespace packsched::cli {

// What `packsched plan` was asked to do (from its flags).
struct PlanRequest {
  planner::PlanOptions options;
  // Fixed micro-batch count (--num_parts); 0 = the fewest that meet the cap.
  int64_t num_parts = 0;
};

// The plan and what it took to make it.
struct PlanRun {
  planner::MicroBatchPlan plan;
  PlanRequest request;
  // "fixed_k" (PartitionFixedK), "balance" (PlanMicroBatches: kk, lpt) or "pack" (PackDataset:
  // ffd, bfd, sequential).
  const char* mode = "";
  double plan_seconds = 0.0;  // wall time of the planner call alone
};

// Whether `request` names one consistent job. Returns InvalidArgument for a missing cap
// (neither max_token_len nor num_parts), equal_size without num_parts, num_parts with a
// packing algorithm, or a negative num_parts. The planner checks everything else.
absl::Status CheckRequest(const PlanRequest& request);

// CheckRequest(request), then runs it: --num_parts goes to
// PartitionFixedK (kk or lpt; no cap needed), a packing algorithm to PackDataset, kk and lpt
// to PlanMicroBatches. Returns CheckRequest's error or the planner's own.
absl::StatusOr<PlanRun> RunPlan(absl::Span<const int64_t> lengths, const PlanRequest& request);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_PLAN_COMMAND_H_
