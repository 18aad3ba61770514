#include "server/cli/plan_command.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
  if (r.num_parts == 0 && o.max_token_len == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", planner::schema::OptionNamed("Cap"),
                     "=TOKENS is required (or --num_parts=K for a fixed micro-batch count)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanRun> RunPlan(absl::Span<const int64_t> lengths, const PlanRequest& request) {
  if (absl::Status status = CheckRequest(request); !status.ok()) return status;
  PlanRun run;
  run.request = request;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<planner::MicroBatchPlan> plan;
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

}  // namespace packsched::cli
