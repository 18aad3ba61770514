#ifndef PACKSCHED_SERVER_SERVICE_ROUND_PROBLEM_H_
#define PACKSCHED_SERVER_SERVICE_ROUND_PROBLEM_H_

// One rank's planning problem in a round (coordinator.h): over its sequences, or over the pieces
// of its forest (tree packing, docs/design.md "Tree packing"). The local half before agreement
// (bound, kept count, loss counts) and the partition into the agreed k after it. Immutable after
// Create; thread-compatible.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/planner/loss_weights.h"
#include "server/planner/plan.h"
#include "server/planner/planner.h"
#include "server/planner/tree_plan.h"
#include "server/service/round_types.h"

namespace packsched::service {

class RoundProblem {
 public:
  // InvalidArgument as planner::Problem::Create (or TreeProblem::Create for a forest).
  static absl::StatusOr<RoundProblem> Create(const PlanInput& input);

  int64_t local_k() const;
  int64_t num_kept() const;  // kept sequences, or kept rollouts of a forest
  // Over the kept sequences (rollouts); `loss_tokens` one per sequence (rollout).
  absl::StatusOr<planner::LossCounts> CountLoss(const std::vector<int64_t>& loss_tokens) const;

  // Partitions into `k` (>= local_k(), as agreed): `result->plan` (and, for a forest,
  // `result->tree`, with `result->plan` its planner::ResponseView). Returns the plan the loss
  // weights read: `result->plan`, or for a forest the plan over rollouts (stored in `rollouts`).
  // Internal when the planner fails (it cannot for an agreed k).
  absl::StatusOr<const planner::MicroBatchPlan*> Partition(int64_t k, RoundResult* result,
                                                           planner::MicroBatchPlan* rollouts) const;

 private:
  RoundProblem(std::optional<planner::Problem> problem, std::optional<planner::TreeProblem> tree)
      : problem_(std::move(problem)), tree_(std::move(tree)) {}

  std::optional<planner::Problem> problem_;   // set for sequences
  std::optional<planner::TreeProblem> tree_;  // set for a forest
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_ROUND_PROBLEM_H_
