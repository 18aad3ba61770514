#include "server/cli/tree_command.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/base/status_macros.h"
#include "server/cli/json_output.h"
#include "server/cli/json_writer.h"
#include "server/planner/model_cost.h"
#include "server/planner/schema.h"

namespace packsched::cli {
namespace {

using planner::Algorithm;

bool IsPacker(Algorithm a) {
  return a == Algorithm::kFirstFitDecreasing || a == Algorithm::kBestFitDecreasing ||
         a == Algorithm::kSequential;
}

// Real tokens forwarded per logical token (1 when nothing is planned).
double TreeTokenRatio(int64_t forwarded, int64_t logical) {
  return logical > 0 ? static_cast<double>(forwarded) / static_cast<double>(logical) : 1.0;
}

// A tree plan's fields: per micro-batch its planner fields, its layout (PACKSCHED_TREE_LAYOUT)
// and its entries (PACKSCHED_TREE_ENTRIES), then the plan's dropped rollouts and figures
// (PACKSCHED_TREE_PLAN; the layouts are the micro-batches' own). The rows
//   X(rollouts, 7, Ints)   X(row)   X(forwarded_tokens, 3, Int)
// expand, through PACKSCHED_JSON_LAYOUT, PACKSCHED_JSON_ENTRY and PACKSCHED_JSON_TREE, to
//   w.Key("rollouts"); w.IntArray(l.rollouts);
//   w.Key("row"); w.IntArray(e.row);
//   w.Key("forwarded_tokens"); w.Int(plan.forwarded_tokens);
#define PACKSCHED_JSON_LAYOUT(name, number, Kind) \
  w.Key(#name);                                   \
  w.IntArray(l.name);
#define PACKSCHED_JSON_ENTRY(name) \
  w.Key(#name);                    \
  w.IntArray(e.name);
#define PACKSCHED_JSON_TREE_Ints(w, plan, name) \
  (w).Key(#name);                               \
  (w).IntArray((plan).name);
#define PACKSCHED_JSON_TREE_Int(w, plan, name) \
  (w).Key(#name);                              \
  (w).Int((plan).name);
#define PACKSCHED_JSON_TREE(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_JSON_TREE, Kind, Layouts)(w, plan, name)

void WriteTreePlanFields(const planner::TreePlan& plan, const planner::Forest& forest,
                         JsonWriter& w) {
  w.Key("num_micro_batches");
  w.Int(static_cast<int64_t>(plan.parts.size()));
  w.Key(MicroBatchesKey());
  w.BeginArray();
  for (const planner::TreeMicroBatch& part : plan.parts) {
    const planner::TreeLayout& l = part.layout;
    const planner::TreeEntries e = planner::Entries(part, forest);
    w.BeginObject();
    WriteMicroBatchFields(part.batch, w);
    PACKSCHED_TREE_LAYOUT(PACKSCHED_JSON_LAYOUT)
    PACKSCHED_TREE_ENTRIES(PACKSCHED_JSON_ENTRY)
    w.EndObject();
  }
  w.EndArray();
  w.Key("dropped");
  w.IntArray(plan.dropped);
  PACKSCHED_TREE_PLAN(PACKSCHED_JSON_TREE)
  w.Key("tree_token_ratio");
  w.Double(TreeTokenRatio(plan.forwarded_tokens, plan.rollout_tokens));
  w.Key("stats");
  WriteStats(plan.stats, w);
}

}  // namespace

absl::StatusOr<TreePlanRun> RunTreePlan(const planner::Forest& forest, const PlanRequest& request) {
  RETURN_IF_ERROR(CheckRequest(request));
  RETURN_IF_ERROR(planner::CheckHasRollouts(forest));  // any mode, as for lengths
  ASSIGN_OR_RETURN(const planner::ForestIndex index, planner::IndexForest(forest));
  PlanRequest costed = request;  // with the model's cost, when given one
  if (costed.model) {
    ASSIGN_OR_RETURN(
        const int64_t micro_batch_cost,
        planner::UseModelCost(costed.model->ints, costed.model->strings, forest, costed.options));
    if (costed.world_size > 0) costed.balance.micro_batch_cost = micro_batch_cost;
  }
  TreePlanRun out;
  out.unique_tokens = index.unique_tokens;
  out.forest = forest;
  out.run.request = costed;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<planner::TreePlan> plan;
  if (costed.world_size > 0) {
    out.run.mode = "coordinator";
    absl::StatusOr<planner::BalancedForest> batch =
        planner::BalanceForest(forest, costed.world_size, costed.options, costed.balance);
    out.run.plan_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!batch.ok()) return batch.status();
    out.batch = *std::move(batch);
    return out;
  }
  if (costed.num_parts > 0) {
    out.run.mode = "fixed_k";
    plan = planner::PartitionForestFixedK(forest, costed.num_parts, costed.options);
  } else if (IsPacker(costed.options.algorithm)) {
    out.run.mode = "pack";
    plan = planner::PackForest(forest, costed.options);
  } else {
    out.run.mode = "balance";
    plan = planner::PlanForest(forest, costed.options);
  }
  out.run.plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!plan.ok()) return plan.status();
  out.plan = *std::move(plan);
  return out;
}

std::string TreePlanJson(const TreePlanRun& run) {
  JsonWriter w;
  w.BeginObject();
  if (run.batch) {
    w.Key("num_micro_batches");
    w.Int(run.batch->num_micro_batches);
    w.Key("ranks");
    w.BeginArray();
    for (const planner::TreePlan& rank : run.batch->ranks) {
      w.BeginObject();
      WriteTreePlanFields(rank, run.forest, w);
      w.EndObject();
    }
    w.EndArray();
    w.Key("dropped");
    w.IntArray(run.batch->dropped);
    w.Key("step");
    WriteStep(run.batch->step, w);
  } else {
    WriteTreePlanFields(*run.plan, run.forest, w);
  }
  w.Key("unique_tokens");
  w.Int(run.unique_tokens);
  w.Key("options");
  WriteOptions(run.run, w);
  w.Key("timing");
  w.BeginObject();
  w.Key("plan_ms");
  w.Double(run.run.plan_seconds * 1e3);
  w.EndObject();
  w.EndObject();
  std::string out = w.Take();
  out += '\n';
  return out;
}

std::string TreePlanTable(const TreePlanRun& run) {
  std::vector<const planner::TreePlan*> plans;
  if (run.batch) {
    for (const planner::TreePlan& rank : run.batch->ranks) plans.push_back(&rank);
  } else {
    plans.push_back(&*run.plan);
  }
  int64_t forwarded = 0, flat = 0, executed = 0, k = 0;
  for (const planner::TreePlan* plan : plans) {
    forwarded += plan->forwarded_tokens;
    flat += plan->rollout_tokens;
    executed += plan->stats.packed_tokens;
    k = static_cast<int64_t>(plan->parts.size());
  }
  std::string out = absl::StrFormat(
      "tree plan (%s): %d micro-batches%s, %d tokens forwarded (flat packing: %d, %.3fx; unique: "
      "%d), planned in %.3f ms\n",
      run.run.mode, k, run.batch ? absl::StrCat(" on each of ", plans.size(), " ranks") : "",
      forwarded, flat, flat > 0 ? static_cast<double>(forwarded) / static_cast<double>(flat) : 0.0,
      run.unique_tokens, run.run.plan_seconds * 1e3);
  absl::StrAppend(&out,
                  absl::StrFormat("tokens: logical %d, executed %d (rows, padding included), "
                                  "forwarded %d, tree token ratio %.4f\n",
                                  flat, executed, forwarded, TreeTokenRatio(forwarded, flat)));
  absl::StrAppend(&out, absl::StrFormat("%6s %5s %7s %9s %10s %14s  %s\n", "rank", "mb", "pieces",
                                        "rollouts", "tokens", "cost", "flags"));
  for (size_t r = 0; r < plans.size(); ++r) {
    for (size_t i = 0; i < plans[r]->parts.size(); ++i) {
      const planner::TreeMicroBatch& part = plans[r]->parts[i];
      absl::StrAppend(
          &out, absl::StrFormat("%6d %5d %7d %9d %10d %14d  %s\n", r, i, part.batch.indices.size(),
                                part.layout.rollouts.size(), part.batch.tokens, part.batch.cost,
                                part.batch.overlong ? "overlong"
                                : part.batch.filler ? "filler"
                                                    : ""));
    }
  }
  const planner::TreePlan& first = *plans.front();
  if (!first.dropped.empty() || (run.batch && !run.batch->dropped.empty())) {
    absl::StrAppend(
        &out, "dropped rollouts: ", (run.batch ? run.batch->dropped : first.dropped).size(), "\n");
  }
  return out;
}

}  // namespace packsched::cli
