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
#include "server/planner/tree_layout.h"

namespace packsched::planner {
namespace {

// A piece's cost (tree_plan.h); nullopt on int64 overflow.
std::optional<int64_t> PieceCost(const PlanOptions& o, const TreePiece& piece, const Forest& forest,
                                 const ForestIndex& index) {
  if (o.cost == CostModel::kTokens) return piece.aligned;
  int64_t quadratic = 0;
  for (int64_t node : piece.nodes) {
    const int64_t d = index.depth[node];
    const int64_t l = forest.node_len[node];
    // (d + l)^2 - d^2 = l (2d + l); d + l < 2^31, so the product fits int64.
    const std::optional<int64_t> sum = CheckedAdd(quadratic, l * (2 * d + l));
    if (!sum) return std::nullopt;
    quadratic = *sum;
  }
  const std::optional<int64_t> square = CheckedMul(piece.aligned, piece.aligned);
  if (!square) return std::nullopt;
  // tokens <= aligned: the padding's term is >= 0 and below aligned^2.
  std::optional<int64_t> q = CheckedAdd(quadratic, *square - piece.tokens * piece.tokens);
  if (q) q = CheckedMul(o.attention.quadratic, *q);
  const std::optional<int64_t> lin = CheckedMul(o.attention.linear, piece.aligned);
  if (!q || !lin) return std::nullopt;
  return CheckedAdd(*q, *lin);
}

struct Cut {
  std::vector<TreePiece> pieces;
  std::vector<int64_t> dropped;
};

// The forest cut into pieces (tree_plan.h), in tree order, each tree's pieces in the greedy's
// order. `align_to` is the effective one; `capacity` the validated cap.
absl::StatusOr<Cut> CutForest(const Forest& forest, const ForestIndex& index, const PlanOptions& o,
                              int64_t align_to, const internal::Capacity& capacity) {
  const int64_t n = static_cast<int64_t>(forest.node_len.size());
  const int64_t r = static_cast<int64_t>(forest.rollout_leaf.size());
  auto aligned = [&](int64_t tokens) { return *CheckedRoundUp(tokens, align_to); };
  // Per tree: its tokens, and its rollouts in depth-first order of their leaves.
  std::vector<int64_t> tree_tokens(n, 0);
  for (int64_t i = 0; i < n; ++i) tree_tokens[index.root[i]] += forest.node_len[i];
  std::vector<int64_t> by_leaf(r);
  for (int64_t j = 0; j < r; ++j) by_leaf[j] = j;
  std::sort(by_leaf.begin(), by_leaf.end(), [&](int64_t a, int64_t b) {
    const int64_t pa = index.preorder_pos[forest.rollout_leaf[a]];
    const int64_t pb = index.preorder_pos[forest.rollout_leaf[b]];
    return pa != pb ? pa < pb : a < b;
  });

  Cut cut;
  std::vector<int64_t> stamp(n, -1);  // the piece a node was last put in
  auto close = [&](TreePiece& piece) -> absl::Status {
    if (piece.rollouts.empty()) return absl::OkStatus();
    std::sort(piece.nodes.begin(), piece.nodes.end(),
              [&](int64_t a, int64_t b) { return index.preorder_pos[a] < index.preorder_pos[b]; });
    std::sort(piece.rollouts.begin(), piece.rollouts.end());
    piece.aligned = aligned(piece.tokens);
    const std::optional<int64_t> cost = PieceCost(o, piece, forest, index);
    if (!cost) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", Name(o.cost), " cost of the tree at node ", piece.root,
                       " overflows int64; lower attention.linear/attention.quadratic"));
    }
    piece.cost = *cost;
    cut.pieces.push_back(std::move(piece));
    piece = TreePiece{};
    return absl::OkStatus();
  };
  // Adds rollout j's nodes not yet in `piece` (stamped `id`) to it.
  auto add = [&](TreePiece& piece, int64_t id, int64_t j) {
    for (int64_t node = forest.rollout_leaf[j]; node >= 0 && stamp[node] != id;
         node = forest.node_parent[node]) {
      stamp[node] = id;
      piece.nodes.push_back(node);
      piece.tokens += forest.node_len[node];
    }
    piece.rollouts.push_back(j);
  };
  auto new_tokens = [&](int64_t id, int64_t j) {
    int64_t tokens = 0;
    for (int64_t node = forest.rollout_leaf[j]; node >= 0 && stamp[node] != id;
         node = forest.node_parent[node]) {
      tokens += forest.node_len[node];
    }
    return tokens;
  };
  int64_t id = 0;  // a fresh stamp per piece
  size_t next = 0;
  for (int64_t root : index.roots) {
    const size_t begin = next;
    while (next < by_leaf.size() && index.root[forest.rollout_leaf[by_leaf[next]]] == root) ++next;
    TreePiece piece;
    piece.root = root;
    if (!capacity.Overlong(aligned(tree_tokens[root]))) {
      // The whole tree: every node of it is some rollout's (IndexForest).
      const int64_t first = index.preorder_pos[root];
      for (int64_t pos = first; pos < n && index.root[index.preorder[pos]] == root; ++pos) {
        piece.nodes.push_back(index.preorder[pos]);
      }
      piece.tokens = tree_tokens[root];
      for (size_t s = begin; s < next; ++s) piece.rollouts.push_back(by_leaf[s]);
      RETURN_IF_ERROR(close(piece));
      continue;
    }
    ++id;
    for (size_t s = begin; s < next; ++s) {
      const int64_t j = by_leaf[s];
      const int64_t len = index.rollout_len[j];
      if (capacity.Overlong(aligned(len))) {
        switch (o.overlong) {
          case OverlongPolicy::kReject:
            return absl::InvalidArgumentError(
                absl::StrCat("rollout ", j, " has length ", len, " (aligned ", aligned(len),
                             ") over max_token_len = ", o.max_token_len,
                             capacity.cap() != o.max_token_len
                                 ? absl::StrCat(" (", capacity.cap(), " after align_total_to)")
                                 : std::string(),
                             "; raise the cap or set overlong to isolate or drop"));
          case OverlongPolicy::kDrop:
            cut.dropped.push_back(j);
            continue;
          case OverlongPolicy::kIsolate: {
            TreePiece alone;
            alone.root = root;
            alone.overlong = true;
            add(alone, ++id, j);
            RETURN_IF_ERROR(close(alone));
            ++id;  // the open piece's nodes are stamped with an older id: start it afresh
            std::vector<int64_t> held = std::move(piece.rollouts);
            piece = TreePiece{};
            piece.root = root;
            for (int64_t h : held) add(piece, id, h);
            continue;
          }
        }
      }
      if (!piece.rollouts.empty() && capacity.Overlong(aligned(piece.tokens + new_tokens(id, j)))) {
        RETURN_IF_ERROR(close(piece));
        piece.root = root;
        ++id;
      }
      add(piece, id, j);
    }
    RETURN_IF_ERROR(close(piece));
  }
  std::sort(cut.dropped.begin(), cut.dropped.end());
  return cut;
}

}  // namespace

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
  if (options.context_parallel > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context_parallel = ", options.context_parallel,
        ": tree packing does not shard a tree over context-parallel ranks; plan a forest with "
        "context_parallel = 1"));
  }
  // The options alone, checked as the sequence planner checks them.
  ASSIGN_OR_RETURN(internal::Validated none,
                   internal::Validate({}, options, cap_required, balancing));
  auto state = std::make_shared<internal::TreeState>();
  state->forest = forest;
  ASSIGN_OR_RETURN(state->index, IndexForest(state->forest));
  ASSIGN_OR_RETURN(Cut cut, CutForest(state->forest, state->index, options, none.options.align_to,
                                      none.capacity));
  state->pieces = std::move(cut.pieces);
  state->dropped = std::move(cut.dropped);
  for (const TreePiece& piece : state->pieces) {
    state->lengths.push_back(piece.tokens);
    state->costs.push_back(piece.cost);
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
  ASSIGN_OR_RETURN(BalancedBatch batch, BalanceBatch(state->lengths, world_size, options,
                                                     /*group_ids=*/{}, balance, state->costs));
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
