#include "server/planner/tree_plan.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/prepared.h"
#include "server/planner/stop_check.h"
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
  int64_t align_to = 1;          // the effective one
  int64_t context_parallel = 1;  // the CP group size each piece is sharded over
  std::optional<Problem> problem;
};

}  // namespace internal

namespace {

// The pieces' lengths and costs, the sequence planner's items.
void SetItems(internal::TreeState& state) {
  state.lengths.clear();
  state.costs.clear();
  for (const TreePiece& piece : state.pieces) {
    state.lengths.push_back(piece.tokens);
    // Under CP each rank runs about 1 / cp of a piece's attention (the tree shard map,
    // packsched._tree_cp, balances it), as CostOf divides a sequence's cost.
    state.costs.push_back(piece.cost / state.context_parallel);
  }
}

// Ranks that hold at least one piece.
int64_t RanksHeld(const BalancedBatch& batch) {
  int64_t held = 0;
  for (const RankBatch& rank : batch.ranks) held += rank.indices.empty() ? 0 : 1;
  return held;
}

// The forest validated and cut into pieces under `options`, without the planner's problem.
absl::StatusOr<std::shared_ptr<internal::TreeState>> Prepare(const Forest& forest,
                                                             const PlanOptions& options,
                                                             bool cap_required, bool balancing,
                                                             internal::StopCheck* stop = nullptr) {
  // The options alone, checked as the sequence planner checks them.
  ASSIGN_OR_RETURN(internal::Validated none,
                   internal::Validate({}, options, cap_required, balancing));
  auto state = std::make_shared<internal::TreeState>();
  state->forest = forest;
  ASSIGN_OR_RETURN(state->index, IndexForest(state->forest));
  ASSIGN_OR_RETURN(internal::Cut cut,
                   internal::CutForest(state->forest, state->index, options, none.options.align_to,
                                       none.capacity, stop));
  state->pieces = std::move(cut.pieces);
  state->dropped = std::move(cut.dropped);
  state->align_to = none.options.align_to;
  state->context_parallel = options.context_parallel;
  SetItems(*state);
  return state;
}

// Each rank's plan of `batch` (over the pieces of `state`) laid out, with global piece ids.
absl::StatusOr<BalancedForest> LayOutRanks(BalancedBatch batch, const internal::TreeState& state,
                                           internal::StopCheck& stop) {
  BalancedForest out;
  out.num_micro_batches = batch.num_micro_batches;
  out.dropped = state.dropped;
  out.step = batch.step;
  out.ranks.reserve(batch.ranks.size());
  for (RankBatch& rank : batch.ranks) {
    if (!stop.Continue(static_cast<int64_t>(rank.indices.size()) + 64)) return stop.status();
    // Fewer kept rollouts than ranks: this rank's passes are filler.
    if (rank.indices.empty()) {
      for (MicroBatch& part : rank.plan.parts) part.filler = true;
    }
    for (MicroBatch& part : rank.plan.parts) {
      for (int64_t& local : part.indices) local = rank.indices[local];
    }
    out.ranks.push_back(internal::LayOut(std::move(rank.plan), state.pieces, state.forest,
                                         state.index, state.dropped));
  }
  return out;
}

// InvalidArgument naming the first group whose pieces need more micro-batches on its one rank
// than max_micro_batches allows world_size ranks (tree_plan.h, BalanceForest), else OK.
// `piece_group`: each piece's group.
absl::Status CheckGroupSizes(const internal::TreeState& state,
                             absl::Span<const int64_t> piece_group, int64_t world_size,
                             const PlanOptions& options) {
  struct Load {
    int64_t pieces = 0;
    int64_t rollouts = 0;
    int64_t aligned = 0;   // of the pieces within the cap
    int64_t overlong = 0;  // pieces alone in a micro-batch
  };
  absl::flat_hash_map<int64_t, Load> loads;
  std::vector<int64_t> order;  // groups by first piece
  for (size_t b = 0; b < state.pieces.size(); ++b) {
    const TreePiece& piece = state.pieces[b];
    auto [it, inserted] = loads.try_emplace(piece_group[b]);
    if (inserted) order.push_back(piece_group[b]);
    Load& load = it->second;
    ++load.pieces;
    load.rollouts += static_cast<int64_t>(piece.rollouts.size());
    if (piece.overlong) {
      ++load.overlong;
    } else {
      load.aligned += piece.aligned;
    }
  }
  for (int64_t group : order) {
    const Load& load = loads.at(group);
    int64_t least = load.overlong + CeilDiv(load.aligned, options.max_token_len);
    if (options.max_seqs_per_micro_batch > 0) {
      least = std::max(least, CeilDiv(load.pieces, options.max_seqs_per_micro_batch));
    }
    const std::optional<int64_t> total = CheckedMul(least, world_size);
    if (!total || *total > options.max_micro_batches) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group_ids: group ", group, " (", load.rollouts, " rollouts, ", load.aligned,
          " aligned tokens in ", load.pieces, " pieces) must stay on one rank, where it needs ",
          least, " micro-batches or more under max_token_len = ", options.max_token_len,
          "; world_size = ", world_size, " x ", least, " is over max_micro_batches = ",
          options.max_micro_batches, " (split the group, or raise max_micro_batches)"));
    }
  }
  return absl::OkStatus();
}

// BalanceForest with group_ids: `state` holds the forest cut at the groups (SplitByGroup), so
// each piece holds one group's rollouts; the pieces of a group are one BalanceBatch unit.
absl::StatusOr<BalancedForest> BalanceGroups(const std::shared_ptr<internal::TreeState>& state,
                                             int64_t world_size, const PlanOptions& options,
                                             const BalanceOptions& balance,
                                             absl::Span<const int64_t> group_ids,
                                             internal::StopCheck& stop) {
  std::vector<int64_t> piece_group;
  piece_group.reserve(state->pieces.size());
  for (const TreePiece& piece : state->pieces) piece_group.push_back(group_ids[piece.rollouts[0]]);
  RETURN_IF_ERROR(CheckGroupSizes(*state, piece_group, world_size, options));
  ASSIGN_OR_RETURN(BalancedBatch batch, BalanceBatch(state->lengths, world_size, options,
                                                     piece_group, balance, state->costs));
  return LayOutRanks(std::move(batch), *state, stop);
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
  RETURN_IF_ERROR(CheckHasRollouts(forest));
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
  RETURN_IF_ERROR(CheckHasRollouts(forest));
  ASSIGN_OR_RETURN(std::shared_ptr<internal::TreeState> state,
                   Prepare(forest, options, /*cap_required=*/true, /*balancing=*/false));
  ASSIGN_OR_RETURN(MicroBatchPlan plan, PackDataset(state->lengths, options, state->costs));
  return internal::LayOut(std::move(plan), state->pieces, state->forest, state->index,
                          state->dropped);
}

absl::StatusOr<BalancedForest> BalanceForest(const Forest& forest, int64_t world_size,
                                             const PlanOptions& options,
                                             const BalanceOptions& balance,
                                             absl::Span<const int64_t> group_ids) {
  RETURN_IF_ERROR(CheckHasRollouts(forest));
  if (!group_ids.empty() && group_ids.size() != forest.rollout_leaf.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_ids has ", group_ids.size(), " entries for ", forest.rollout_leaf.size(),
        " rollouts in the forest: must be empty or one per rollout"));
  }
  // The cut and the layouts ask the caller's stop as BalanceBatch does.
  internal::StopCheck stop(balance.stop);
  std::optional<Forest> grouped;  // each tree cut at its rollouts' groups
  if (!group_ids.empty()) {
    ASSIGN_OR_RETURN(const ForestIndex index, IndexForest(forest));
    ASSIGN_OR_RETURN(grouped, SplitByGroup(forest, index, group_ids, &stop));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<internal::TreeState> state,
                   Prepare(grouped ? *grouped : forest, options, /*cap_required=*/true,
                           /*balancing=*/true, &stop));
  if (!stop.ContinueNow()) return stop.status();
  if (grouped) {
    return BalanceGroups(state, world_size, options, balance, group_ids, stop);
  }
  // Fewer pieces than ranks: pieces split at rollout boundaries first, so that a rank holds one.
  if (static_cast<int64_t>(state->pieces.size()) < world_size) {
    RETURN_IF_ERROR(internal::SplitPieces(state->forest, state->index, options, state->align_to,
                                          world_size, state->pieces, &stop));
    SetItems(*state);
  }
  // Two candidates when a tree is split: its pieces spread over the ranks as any pieces are,
  // and its pieces kept on one rank (BalanceBatch's group_ids). The one that leaves fewer ranks
  // without a piece wins, then the shorter step under the request's sync; ties to one rank.
  std::vector<int64_t> tree_of;
  for (size_t b = 1; b < state->pieces.size(); ++b) {
    if (state->pieces[b].root == state->pieces[b - 1].root) {
      for (const TreePiece& piece : state->pieces) tree_of.push_back(piece.root);
      break;
    }
  }
  absl::StatusOr<BalancedBatch> chosen =
      BalanceBatch(state->lengths, world_size, options, tree_of, balance, state->costs);
  if (!tree_of.empty() &&
      (chosen.ok() || chosen.status().code() == absl::StatusCode::kInvalidArgument)) {
    absl::StatusOr<BalancedBatch> spread =
        BalanceBatch(state->lengths, world_size, options, {}, balance, state->costs);
    if (!spread.ok() && spread.status().code() != absl::StatusCode::kInvalidArgument) {
      return spread.status();
    }
    auto step = [&](const BalancedBatch& b) {
      return balance.sync == Sync::kStep ? b.step.step_sync_cost : b.step.micro_batch_sync_cost;
    };
    if (spread.ok() &&
        (!chosen.ok() || RanksHeld(*spread) > RanksHeld(*chosen) ||
         (RanksHeld(*spread) == RanksHeld(*chosen) && step(*spread) < step(*chosen)))) {
      chosen = std::move(spread);
    }
  }
  ASSIGN_OR_RETURN(BalancedBatch batch, std::move(chosen));
  return LayOutRanks(std::move(batch), *state, stop);
}

}  // namespace packsched::planner
