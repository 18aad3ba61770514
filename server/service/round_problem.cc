#include "server/service/round_problem.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"

namespace packsched::service {

absl::StatusOr<RoundProblem> RoundProblem::Create(const PlanInput& input) {
  if (input.forest) {
    ASSIGN_OR_RETURN(planner::TreeProblem tree,
                     planner::TreeProblem::Create(*input.forest, input.options));
    return RoundProblem(std::nullopt, std::move(tree));
  }
  ASSIGN_OR_RETURN(planner::Problem problem,
                   planner::Problem::Create(input.lengths, input.options));
  return RoundProblem(std::move(problem), std::nullopt);
}

int64_t RoundProblem::local_k() const { return tree_ ? tree_->local_k() : problem_->local_k(); }

int64_t RoundProblem::num_kept() const { return tree_ ? tree_->num_kept() : problem_->num_kept(); }

absl::StatusOr<planner::LossCounts> RoundProblem::CountLoss(
    const std::vector<int64_t>& loss_tokens) const {
  return tree_ ? planner::CountLoss(*tree_, loss_tokens)
               : planner::CountLoss(*problem_, loss_tokens);
}

absl::StatusOr<const planner::MicroBatchPlan*> RoundProblem::Partition(
    int64_t k, RoundResult* result, planner::MicroBatchPlan* rollouts) const {
  if (!tree_) {
    absl::StatusOr<planner::MicroBatchPlan> plan = problem_->Partition(k);
    if (!plan.ok()) {
      return absl::InternalError(
          absl::StrCat("partition into the agreed k = ", k, " failed: ", plan.status().ToString()));
    }
    result->plan = *std::move(plan);
    return &result->plan;
  }
  absl::StatusOr<planner::TreePlan> plan = tree_->Partition(k);
  if (!plan.ok()) {
    return absl::InternalError(absl::StrCat("partition of the forest into the agreed k = ", k,
                                            " failed: ", plan.status().ToString()));
  }
  result->plan = planner::ResponseView(*plan, tree_->index());
  *rollouts = planner::RolloutView(*plan, tree_->index());
  result->tree = *std::move(plan);
  return rollouts;
}

}  // namespace packsched::service
