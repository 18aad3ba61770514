#include "server/cli/plan_command.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"
#include "server/planner/model_cost.h"
#include "server/planner/planner.h"
#include "server/planner/schema.h"

namespace packsched::cli {
namespace {

using planner::Algorithm;

bool IsPacker(Algorithm a) {
  return a == Algorithm::kFirstFitDecreasing || a == Algorithm::kBestFitDecreasing ||
         a == Algorithm::kSequential;
}

}  // namespace

absl::Status CheckRequest(const PlanRequest& r) {
  const planner::PlanOptions& o = r.options;
  if (r.num_parts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_parts = ", r.num_parts, ": must be >= 1 (or 0 for no fixed count)"));
  }
  if (r.num_parts > 0 && IsPacker(o.algorithm)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_parts splits into exactly k parts, which --algorithm=", planner::Name(o.algorithm),
        " (dataset packing: as many bins as needed) does not do; use kk or lpt"));
  }
  if (o.equal_size && r.num_parts == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", planner::schema::OptionNamed("FixedK"),
                                                   " needs --num_parts=K (n / K sequences a "
                                                   "part)"));
  }
  if (r.world_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world_size = ", r.world_size, ": must be >= 1 (or 0 for one rank's plan)"));
  }
  if (r.world_size > 0 && (r.num_parts > 0 || IsPacker(o.algorithm))) {
    return absl::InvalidArgumentError(
        "--world_size (coordinator mode) chooses k under the cap with kk or lpt: not with "
        "--num_parts or a packing algorithm");
  }
  if (r.world_size == 0 &&
      (r.balance.sync != planner::Sync::kStep || r.balance.micro_batch_cost != 0)) {
    return absl::InvalidArgumentError(
        "--sync and --micro_batch_cost apply only in coordinator mode (--world_size=W)");
  }
  if (r.num_parts == 0 && o.max_token_len == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", planner::schema::OptionNamed("Cap"),
                     "=TOKENS is required (or --num_parts=K for a fixed micro-batch count)"));
  }
  // The options alone, in the planner's words ("min_micro_batches = 0: must be in [1, ...]"):
  // their names are the flags'.
  if (absl::Status s = planner::CheckOptions(o); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  if (r.num_parts > o.max_micro_batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_parts = ", r.num_parts, ": must be at most --",
                     planner::schema::OptionNamed("Ceiling"), " = ", o.max_micro_batches));
  }
  if (r.world_size > planner::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size = ", r.world_size,
                                                   ": must be at most ", planner::kMaxWorldSize));
  }
  if (r.balance.micro_batch_cost < 0 || r.balance.micro_batch_cost > planner::kMaxMicroBatchCost) {
    return absl::InvalidArgumentError(
        absl::StrCat("--micro_batch_cost = ", r.balance.micro_batch_cost, ": must be in [0, ",
                     planner::kMaxMicroBatchCost, "]"));
  }
  return absl::OkStatus();
}

namespace {

// RunPlan after CheckRequest; `request` is a copy the model's cost weights may change.
absl::StatusOr<PlanRun> RunChecked(absl::Span<const int64_t> lengths, PlanRequest request) {
  if (request.model) {
    ASSIGN_OR_RETURN(const int64_t micro_batch_cost,
                     planner::UseModelCost(request.model->ints, request.model->strings, lengths,
                                           request.options));
    if (request.world_size > 0) request.balance.micro_batch_cost = micro_batch_cost;
  }
  PlanRun run;
  run.request = request;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<planner::MicroBatchPlan> plan;
  if (request.world_size > 0) {
    run.mode = "coordinator";
    absl::StatusOr<planner::BalancedBatch> batch =
        planner::BalanceBatch(lengths, request.world_size, request.options, {}, request.balance);
    run.plan_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!batch.ok()) return batch.status();
    run.batch = *std::move(batch);
    return run;
  }
  if (request.num_parts > 0) {
    run.mode = "fixed_k";
    plan = planner::PartitionFixedK(lengths, request.num_parts, request.options);
  } else if (IsPacker(request.options.algorithm)) {
    run.mode = "pack";
    plan = planner::PackDataset(lengths, request.options);
  } else {
    run.mode = "balance";
    plan = planner::PlanMicroBatches(lengths, request.options);
  }
  run.plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!plan.ok()) return plan.status();
  run.plan = *std::move(plan);
  return run;
}

}  // namespace

absl::StatusOr<PlanRun> RunPlan(absl::Span<const int64_t> lengths, const PlanRequest& request) {
  if (absl::Status status = CheckRequest(request); !status.ok()) return status;
  return RunChecked(lengths, request);
}

}  // namespace packsched::cli
