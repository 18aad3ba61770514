#include "server/service/balance_batch.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/loss_weights.h"
#include "server/planner/model_cost.h"
#include "server/planner/planner.h"
#include "server/planner/schema.h"
#include "server/planner/tree_plan.h"
#include "server/service/convert.h"
#include "server/service/field_errors.h"
#include "server/service/forest_convert.h"

namespace packsched::service {
namespace {

// Ranks written to the response between two asks of the caller's stop check.
constexpr size_t kRanksPerStopCheck = 1024;

}  // namespace

// RunBalanceBatch writes the global counts (PACKSCHED_GLOBAL_COUNTS) a macro per kind, each
// taking what it touches as arguments: `total` (the Loss counts summed over the ranks), a rank's
// `counts`, `global` (the response's v1::GlobalCounts), the kept sequences, the world size and
// the row's name. The row
//   X(loss_tokens, 2, Loss)
// expands, through PACKSCHED_SUM_GLOBAL (once per rank) and PACKSCHED_BATCH_GLOBAL, to
//   total.loss_tokens += counts.loss_tokens;
//   global->set_loss_tokens(total.loss_tokens);
// Only the Loss counts are summed over the ranks' plans: Kept and World have nothing to sum.
#define PACKSCHED_SUM_Loss(total, counts, name) (total).name += (counts).name;
#define PACKSCHED_SUM_GLOBAL(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_SUM, Kind, Loss)(total, counts, name)
#define PACKSCHED_BATCH_Kept(global, total, kept, world_size, name) (global)->set_##name(kept);
#define PACKSCHED_BATCH_Loss(global, total, kept, world_size, name) \
  (global)->set_##name((total).name);
#define PACKSCHED_BATCH_World(global, total, kept, world_size, name) \
  (global)->set_##name(world_size);
#define PACKSCHED_BATCH_GLOBAL(name, number, Kind) \
  PACKSCHED_BATCH_##Kind(global, total, kept, world_size, name)

namespace {

void StepToProto(const planner::StepStats& s, v1::StepStats* step) {
  step->set_step_sync_cost(s.step_sync_cost);
  step->set_micro_batch_sync_cost(s.micro_batch_sync_cost);
  step->set_ideal(s.ideal);
  step->set_efficiency(s.efficiency);
  step->set_lower_bound(s.lower_bound);
  step->set_lower_bound_efficiency(s.lower_bound_efficiency);
}

// BalanceBatch over a forest: every rank's plan over pieces, with global rollout ids in its
// index lists and `indices` (the rank's rollouts, ascending), its loss weights per rollout.
absl::Status RunBalanceForest(const PlanInput& input, int64_t world_size,
                              const planner::BalanceOptions& balance,
                              absl::Span<const int64_t> group_ids,
                              v1::BalanceBatchResponse* response) {
  ASSIGN_OR_RETURN(
      planner::BalancedForest batch,
      planner::BalanceForest(*input.forest, world_size, input.options, balance, group_ids));
  ASSIGN_OR_RETURN(const planner::ForestIndex index, planner::IndexForest(*input.forest));
  response->set_num_micro_batches(batch.num_micro_batches);
  StepToProto(batch.step, response->mutable_step());
  response->mutable_dropped()->Assign(batch.dropped.begin(), batch.dropped.end());
  // The loss weights read each rank's plan over rollouts (global rollout ids).
  std::vector<planner::MicroBatchPlan> views;
  planner::LossCounts total;  // zero without loss tokens: the proto's default
  for (const planner::TreePlan& rank : batch.ranks) {
    views.push_back(planner::RolloutView(rank, index));
    if (input.loss_tokens) {
      ASSIGN_OR_RETURN(const planner::LossCounts counts,
                       planner::CountLoss(views.back(), *input.loss_tokens));
      PACKSCHED_GLOBAL_COUNTS(PACKSCHED_SUM_GLOBAL)
    }
  }
  v1::GlobalCounts* global = response->mutable_global();
  const int64_t kept =
      static_cast<int64_t>(input.forest->rollout_leaf.size() - batch.dropped.size());
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_BATCH_GLOBAL)
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    if (balance.stop && r % kRanksPerStopCheck == 0) RETURN_IF_ERROR(balance.stop());
    const planner::TreePlan& rank = batch.ranks[r];
    v1::RankPlan* out = response->add_ranks();
    int64_t cost = 0;
    for (const planner::TreeMicroBatch& part : rank.parts) cost += part.batch.cost;
    for (int64_t rollout : views[r].reorder) out->add_indices(rollout);
    std::sort(out->mutable_indices()->begin(), out->mutable_indices()->end());
    out->set_cost(cost);
    v1::PlanResponse* plan = out->mutable_plan();
    const planner::MicroBatchPlan answer = planner::ResponseView(rank, index);
    PlanResponseHead(batch.num_micro_batches, answer, plan);
    *plan->mutable_global() = *global;
    std::optional<planner::LossWeights> weights;
    if (input.loss_tokens) {
      ASSIGN_OR_RETURN(weights, planner::ComputeLossWeights(views[r], *input.loss_tokens,
                                                            input.loss, total, world_size));
    }
    PlanToProto(answer, weights ? &*weights : nullptr, input.options.max_token_len, plan);
    TreePlanToProto(rank, plan->mutable_tree());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunBalanceBatch(const v1::BalanceBatchRequest& request, const ServiceLimits& limits,
                             const std::function<absl::Status()>& stop,
                             v1::BalanceBatchResponse* response) {
  ASSIGN_OR_RETURN(PlanInput input,
                   MakePlanInput(request.lengths(), request.options(), request.loss_tokens(),
                                 request.loss(), limits, /*planner_picks_k=*/true,
                                 request.has_forest() ? &request.forest() : nullptr));
  const int64_t world_size = request.world_size();
  if (world_size < 1 || world_size > planner::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size = ", world_size, ": must be in [1, ",
                                                   planner::kMaxWorldSize, "]"));
  }
  if (world_size > limits.max_sequences_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "world_size = ", world_size, " exceeds the server limit --max_sequences_per_request = ",
        limits.max_sequences_per_request));
  }
  // With a forest, one group id per rollout (BalanceForest checks the count and names it).
  if (!input.forest && !request.group_ids().empty() &&
      static_cast<size_t>(request.group_ids().size()) != input.lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group_ids has ", request.group_ids().size(),
                                                   " entries for ", input.lengths.size(),
                                                   " sequences: must be empty or one per "
                                                   "sequence"));
  }
  // Every rank gets at least max(min_micro_batches, divisible_by) micro-batches: bound the total
  // over all ranks before the planner allocates them.
  const std::optional<int64_t> parts =
      CheckedMul(world_size, std::max(input.options.min_micro_batches, input.options.divisible_by));
  if (!parts || *parts > limits.max_micro_batches) {
    std::string counts;  // the Count options, "a, b"
    for (const planner::schema::OptionField& field : planner::schema::kPlanOptions) {
      if (field.rule == "Count") absl::StrAppend(&counts, counts.empty() ? "" : ", ", field.name);
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("world_size = ", world_size, " x max(", counts,
                     ") = ", std::max(input.options.min_micro_batches, input.options.divisible_by),
                     " micro-batches exceed the server limit --",
                     planner::schema::OptionNamed("Ceiling"), " = ", limits.max_micro_batches));
  }
  const std::vector<int64_t> group_ids(request.group_ids().begin(), request.group_ids().end());
  planner::BalanceOptions balance;
  if (!v1::Sync_IsValid(request.sync())) {
    return NotKnown("sync", request.sync(), v1::Sync_descriptor());
  }
  if (request.sync() != v1::SYNC_UNSPECIFIED) {
    balance.sync = static_cast<planner::Sync>(request.sync() - 1);
  }
  balance.micro_batch_cost = request.micro_batch_cost();
  balance.stop = stop;
  if (request.has_model_config()) {
    const v1::ModelConfig& model = request.model_config();
    const absl::flat_hash_map<std::string, int64_t> ints(model.ints().begin(), model.ints().end());
    const absl::flat_hash_map<std::string, std::string> strings(model.strings().begin(),
                                                                model.strings().end());
    absl::StatusOr<int64_t> micro_batch_cost =
        input.forest ? planner::UseModelCost(ints, strings, *input.forest, input.options)
                     : planner::UseModelCost(ints, strings, input.lengths, input.options);
    if (!micro_batch_cost.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_config: ", micro_batch_cost.status().message()));
    }
    balance.micro_batch_cost = *micro_batch_cost;
  }
  if (input.forest) return RunBalanceForest(input, world_size, balance, group_ids, response);
  ASSIGN_OR_RETURN(
      planner::BalancedBatch batch,
      planner::BalanceBatch(input.lengths, world_size, input.options, group_ids, balance));
  response->set_num_micro_batches(batch.num_micro_batches);
  StepToProto(batch.step, response->mutable_step());
  response->mutable_dropped()->Assign(batch.dropped.begin(), batch.dropped.end());
  // Global loss counts over every rank's kept sequences, then each rank's weights.
  std::vector<std::vector<int64_t>> rank_loss(batch.ranks.size());
  planner::LossCounts total;  // zero without loss tokens: the proto's default
  if (input.loss_tokens) {
    for (size_t r = 0; r < batch.ranks.size(); ++r) {
      for (int64_t index : batch.ranks[r].indices) {
        rank_loss[r].push_back((*input.loss_tokens)[index]);
      }
      ASSIGN_OR_RETURN(planner::LossCounts counts,
                       planner::CountLoss(batch.ranks[r].plan, rank_loss[r]));
      PACKSCHED_GLOBAL_COUNTS(PACKSCHED_SUM_GLOBAL)
    }
  }
  v1::GlobalCounts* global = response->mutable_global();
  const int64_t kept = static_cast<int64_t>(input.lengths.size() - batch.dropped.size());
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_BATCH_GLOBAL)
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    if (stop && r % kRanksPerStopCheck == 0) RETURN_IF_ERROR(stop());
    const planner::RankBatch& rank = batch.ranks[r];
    v1::RankPlan* out = response->add_ranks();
    out->mutable_indices()->Assign(rank.indices.begin(), rank.indices.end());
    out->set_cost(rank.cost);
    v1::PlanResponse* plan = out->mutable_plan();
    PlanResponseHead(batch.num_micro_batches, rank.plan, plan);
    *plan->mutable_global() = *global;
    std::optional<planner::LossWeights> weights;
    if (input.loss_tokens) {
      ASSIGN_OR_RETURN(weights, planner::ComputeLossWeights(rank.plan, rank_loss[r], input.loss,
                                                            total, world_size));
    }
    PlanToProto(rank.plan, weights ? &*weights : nullptr, input.options.max_token_len, plan);
  }
  return absl::OkStatus();
}

}  // namespace packsched::service
