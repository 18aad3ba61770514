#include "server/planner/tree_plan.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/prepared.h"
#include "server/planner/tree_cut.h"
#include "server/planner/tree_layout.h"

namespace packsched::planner {
namespace internal {

struct TreeState {
  Forest forest;
  ForestIndex index;
  std::vector<TreePiece> pieces;
  std::vector<int64_t> dropped;
  std::vector<int64_t> lengths;  // of the pieces
  std::vector<int64_t> costs;    // of the pieces
  std::optional<Problem> problem;
};

}  // namespace internal

namespace {

// The forest validated and cut into pieces under `options`, without the planner's problem.
absl::StatusOr<std::shared_ptr<internal::TreeState>> Prepare(const Forest& forest,
                                                             const PlanOptions& options,
                                                             bool cap_required, bool balancing) {
  // The options alone, checked as the sequence planner checks them.
  ASSIGN_OR_RETURN(internal::Validated none,
                   internal::Validate({}, options, cap_required, balancing));
  auto state = std::make_shared<internal::TreeState>();
  state->forest = forest;
  ASSIGN_OR_RETURN(state->index, IndexForest(state->forest));
  ASSIGN_OR_RETURN(internal::Cut cut, internal::CutForest(state->forest, state->index, options,
                                                          none.options.align_to, none.capacity));
  state->pieces = std::move(cut.pieces);
  state->dropped = std::move(cut.dropped);
  for (const TreePiece& piece : state->pieces) {
    state->lengths.push_back(piece.tokens);
    // Under CP each rank runs about 1 / cp of a piece's attention (the tree shard map,
    // packsched._tree_cp, balances it), as CostOf divides a sequence's cost.
    state->costs.push_back(piece.cost / options.context_parallel);
  }
  return state;
}

}  // namespace

TreeProblem::TreeProblem(std::shared_ptr<const internal::TreeState> state)
    : state_(std::move(state)) {}

absl::StatusOr<TreeProblem> TreeProblem::Create(const Forest& forest, const PlanOptions& options,
                                                bool cap_optional) {
  ASSIGN_OR_RETURN(std::shared_ptr<internal::TreeState> state,
                   Prepare(forest, options, !cap_optional, /*balancing=*/true));
  ASSIGN_OR_RETURN(state->problem,
                   Problem::Create(state->lengths, options, cap_optional, state->costs));
  return TreeProblem(std::move(state));
}

int64_t TreeProblem::local_k() const { return state_->problem->local_k(); }
int64_t TreeProblem::lower_bound_k() const { return state_->problem->lower_bound_k(); }
int64_t TreeProblem::num_sequences() const {
  return static_cast<int64_t>(state_->forest.rollout_leaf.size());
}
int64_t TreeProblem::num_kept() const {
  return num_sequences() - static_cast<int64_t>(state_->dropped.size());
}
int64_t TreeProblem::total_tokens() const { return state_->problem->total_tokens(); }
const std::vector<TreePiece>& TreeProblem::pieces() const { return state_->pieces; }
const std::vector<int64_t>& TreeProblem::dropped() const { return state_->dropped; }
const Forest& TreeProblem::forest() const { return state_->forest; }
const ForestIndex& TreeProblem::index() const { return state_->index; }
const Problem& TreeProblem::problem() const { return *state_->problem; }

absl::StatusOr<TreePlan> TreeProblem::Partition(int64_t k) const {
  ASSIGN_OR_RETURN(MicroBatchPlan plan, state_->problem->Partition(k));
  return internal::LayOut(std::move(plan), state_->pieces, state_->forest, state_->index,
                          state_->dropped);
}

absl::StatusOr<TreePlan> PlanForest(const Forest& forest, const PlanOptions& options) {
  if (options.equal_size) {
    return absl::InvalidArgumentError(
        "equal_size needs a fixed number of micro-batches (PartitionForestFixedK, --num_parts)");
  }
  ASSIGN_OR_RETURN(TreeProblem problem, TreeProblem::Create(forest, options));
  return problem.Partition(problem.local_k());
}

absl::StatusOr<TreePlan> PartitionForestFixedK(const Forest& forest, int64_t k,
                                               const PlanOptions& options) {
  ASSIGN_OR_RETURN(TreeProblem problem,
                   TreeProblem::Create(forest, options, /*cap_optional=*/true));
  if (k < 1 || k < problem.local_k()) {
    return absl::InvalidArgumentError(
        absl::StrCat("k = ", k, " is below ", problem.local_k(),
                     ", the fewest micro-batches that meet the cap and the other constraints"));
  }
  return problem.Partition(k);
}

absl::StatusOr<TreePlan> PackForest(const Forest& forest, const PlanOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<internal::TreeState> state,
                   Prepare(forest, options, /*cap_required=*/true, /*balancing=*/false));
  ASSIGN_OR_RETURN(MicroBatchPlan plan, PackDataset(state->lengths, options, state->costs));
  return internal::LayOut(std::move(plan), state->pieces, state->forest, state->index,
                          state->dropped);
}

absl::StatusOr<BalancedForest> BalanceForest(const Forest& forest, int64_t world_size,
                                             const PlanOptions& options,
                                             const BalanceOptions& balance) {
  ASSIGN_OR_RETURN(std::shared_ptr<internal::TreeState> state,
                   Prepare(forest, options, /*cap_required=*/true, /*balancing=*/true));
  // The pieces of a split tree form a group (one rank holds them all); whole trees need none.
  std::vector<int64_t> tree_of;
  for (size_t b = 1; b < state->pieces.size(); ++b) {
    if (state->pieces[b].root == state->pieces[b - 1].root) {
      for (const TreePiece& piece : state->pieces) tree_of.push_back(piece.root);
      break;
    }
  }
  ASSIGN_OR_RETURN(BalancedBatch batch, BalanceBatch(state->lengths, world_size, options, tree_of,
                                                     balance, state->costs));
  BalancedForest out;
  out.num_micro_batches = batch.num_micro_batches;
  out.dropped = state->dropped;
  out.step = batch.step;
  out.ranks.reserve(batch.ranks.size());
  for (RankBatch& rank : batch.ranks) {
    for (MicroBatch& part : rank.plan.parts) {
      for (int64_t& local : part.indices) local = rank.indices[local];
    }
    out.ranks.push_back(internal::LayOut(std::move(rank.plan), state->pieces, state->forest,
                                         state->index, state->dropped));
  }
  return out;
}

}  // namespace packsched::planner
