#include "server/service/partition.h"

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/base/status_macros.h"
#include "server/planner/loss_weights.h"
#include "server/planner/planner.h"
#include "server/planner/schema.h"
#include "server/planner/tree_plan.h"
#include "server/service/convert.h"
#include "server/service/field_errors.h"
#include "server/service/forest_convert.h"

namespace packsched::service {
namespace {

// Global counts sum every rank's, this one's included: one below this request's own is a
// caller's mistake (e.g. `global` set for the world size alone) that would silently scale or
// zero every weight.
absl::Status AtLeastOwn(absl::string_view field, int64_t global, int64_t own) {
  if (global >= own) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", global, " is below this request's own ", own,
                   ": global counts are summed over every rank, this one included"));
}

}  // namespace

// RunPartition takes the caller's global counts (PACKSCHED_GLOBAL_COUNTS) in three passes, one
// macro per kind, each taking what it touches as arguments: `request`, `g` (its v1::GlobalCounts),
// `ranks` (the world size the weights use), the plan, this request's loss `counts`, `out` (the
// response's v1::GlobalCounts) and the row's name. Kept: 0 = this request's own, else at least
// it; Loss: >= 0 and at least this request's own; World: in [0, kMaxWorldSize], 0 = 1. The row
//   X(loss_tokens, 2, Loss)
// expands, through PACKSCHED_CHECK_GLOBAL (before planning), PACKSCHED_KEPT_GLOBAL (nothing: the
// Loss counts are known with the loss tokens) and PACKSCHED_LOSS_GLOBAL, to
//   if (g.loss_tokens() < 0) return Negative("global." "loss_tokens", g.loss_tokens());
//   if (request.has_global()) {
//     RETURN_IF_ERROR(AtLeastOwn("global." "loss_tokens", g.loss_tokens(), counts.loss_tokens));
//     counts.loss_tokens = g.loss_tokens();
//   }
//   out->set_loss_tokens(counts.loss_tokens);
#define PACKSCHED_CHECK_Loss(g, ranks, name) \
  if ((g).name() < 0) return Negative("global." #name, (g).name());
#define PACKSCHED_CHECK_World(g, ranks, name)                                                   \
  if ((g).name() < 0 || (g).name() > planner::kMaxWorldSize) {                                  \
    return absl::InvalidArgumentError(absl::StrCat("global." #name " = ", (g).name(),           \
                                                   ": must be in [0, ", planner::kMaxWorldSize, \
                                                   "] (0 = 1)"));                               \
  }                                                                                             \
  (ranks) = (g).name() == 0 ? 1 : (g).name();
#define PACKSCHED_CHECK_GLOBAL(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_CHECK, Kind, Kept)(g, ranks, name)
// Kept: the caller's count when set, else this request's (the plan's kept sequences).
#define PACKSCHED_KEPT_Kept(request, g, plan, ranks, out, name)               \
  {                                                                           \
    const int64_t own = (plan).stats.num_kept;                                \
    const bool given = (request).has_global() && (g).name() > 0;              \
    if (given) RETURN_IF_ERROR(AtLeastOwn("global." #name, (g).name(), own)); \
    (out)->set_##name(given ? (g).name() : own);                              \
  }
#define PACKSCHED_KEPT_World(request, g, plan, ranks, out, name) (out)->set_##name(ranks);
#define PACKSCHED_KEPT_GLOBAL(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_KEPT, Kind, Loss)(request, g, plan, ranks, out, name)
#define PACKSCHED_LOSS_Loss(request, g, counts, out, name)                   \
  if ((request).has_global()) {                                              \
    RETURN_IF_ERROR(AtLeastOwn("global." #name, (g).name(), (counts).name)); \
    (counts).name = (g).name();                                              \
  }                                                                          \
  (out)->set_##name((counts).name);
#define PACKSCHED_LOSS_GLOBAL(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_LOSS, Kind, Loss)(request, g, counts, out, name)

absl::Status RunPartition(const v1::PartitionRequest& request, const ServiceLimits& limits,
                          v1::PlanResponse* response) {
  ASSIGN_OR_RETURN(PlanInput input,
                   MakePlanInput(request.lengths(), request.options(), request.loss_tokens(),
                                 request.loss(), limits, /*planner_picks_k=*/false,
                                 request.has_forest() ? &request.forest() : nullptr));
  const int64_t k = request.num_micro_batches();
  if (k < 1 || k > input.options.max_micro_batches) {
    return absl::InvalidArgumentError(absl::StrCat("num_micro_batches = ", k, ": must be in [1, ",
                                                   input.options.max_micro_batches, "]"));
  }
  const v1::GlobalCounts& g = request.global();
  int64_t ranks = 1;
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_CHECK_GLOBAL)
  // `plan` answers; `loss_plan` is what the loss weights read (the plan over rollouts, for a
  // forest, whose micro-batches hold pieces).
  planner::MicroBatchPlan plan;
  planner::MicroBatchPlan loss_plan;
  std::optional<planner::TreePlan> tree;
  if (input.forest) {
    ASSIGN_OR_RETURN(tree, planner::PartitionForestFixedK(*input.forest, k, input.options));
    ASSIGN_OR_RETURN(const planner::ForestIndex index, planner::IndexForest(*input.forest));
    plan = planner::ResponseView(*tree, index);
    loss_plan = planner::RolloutView(*tree, index);
  } else {
    ASSIGN_OR_RETURN(plan, planner::PartitionFixedK(input.lengths, k, input.options));
  }
  const planner::MicroBatchPlan& weighed = input.forest ? loss_plan : plan;
  v1::GlobalCounts* out = response->mutable_global();
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_KEPT_GLOBAL)
  std::optional<planner::LossWeights> weights;
  if (input.loss_tokens) {
    ASSIGN_OR_RETURN(planner::LossCounts counts, planner::CountLoss(weighed, *input.loss_tokens));
    PACKSCHED_GLOBAL_COUNTS(PACKSCHED_LOSS_GLOBAL)
    ASSIGN_OR_RETURN(weights, planner::ComputeLossWeights(weighed, *input.loss_tokens, input.loss,
                                                          counts, ranks));
  }
  PlanResponseHead(k, plan, response);
  PlanToProto(plan, weights ? &*weights : nullptr, input.options.max_token_len, response);
  if (tree) TreePlanToProto(*tree, response->mutable_tree());
  return absl::OkStatus();
}

}  // namespace packsched::service
