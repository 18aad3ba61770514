#include "server/planner/tree_cut.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"

namespace packsched::planner::internal {
namespace {

// Pieces looked at per node when placing one rollout (tree_cut.h).
constexpr int kCandidates = 64;

// A piece's cost (tree_plan.h); nullopt on int64 overflow.
std::optional<int64_t> PieceCost(const PlanOptions& o, const TreePiece& piece, const Forest& forest,
                                 const ForestIndex& index) {
  if (o.cost == CostModel::kTokens) return piece.aligned;
  int64_t quadratic = 0;
  for (int64_t node : piece.nodes) {
    const int64_t d = index.depth[node];
    // The node's tokens are at depths [d, d + l) of its root path; d + l < 2^31.
    const std::optional<int64_t> node_scores =
        AttentionScores(o.attention, d, d + forest.node_len[node]);
    const std::optional<int64_t> sum =
        node_scores ? CheckedAdd(quadratic, *node_scores) : std::nullopt;
    if (!sum) return std::nullopt;
    quadratic = *sum;
  }
  // The padding continues the piece: tokens <= aligned, so its term is >= 0.
  const std::optional<int64_t> padding = AttentionScores(o.attention, piece.tokens, piece.aligned);
  const std::optional<int64_t> q = padding ? CheckedAdd(quadratic, *padding) : std::nullopt;
  const std::optional<int64_t> lin = CheckedMul(o.attention.linear, piece.aligned);
  if (!q || !lin) return std::nullopt;
  return CheckedAdd(*q, *lin);
}

// The cut of one forest. Scratch arrays over nodes are sized once and reset per tree for the
// nodes the tree touched.
class Cutter {
 public:
  Cutter(const Forest& forest, const ForestIndex& index, const PlanOptions& o, int64_t align_to,
         const Capacity& capacity)
      : forest_(forest),
        index_(index),
        o_(o),
        align_to_(align_to),
        capacity_(capacity),
        // aligned(t) <= cap  <=>  t <= the largest multiple of align_to within the cap.
        room_(capacity.has_cap() ? capacity.cap() / align_to * align_to
                                 : std::numeric_limits<int64_t>::max()) {}

  absl::StatusOr<Cut> Run();

 private:
  struct Member {
    int64_t piece;  // index into open_
    int64_t next;   // the node's next (older) membership, -1 at the end
  };

  absl::Status Close(TreePiece piece);
  absl::Status CutTree(int64_t root, const std::vector<int64_t>& rollouts);
  // `normal`'s rollouts in heavy-first depth-first order (tree_cut.h).
  std::vector<int64_t> HeavyFirst(int64_t root, const std::vector<int64_t>& normal);
  // The open piece rollout j goes to, -1 for a new one.
  int64_t Place(int64_t root, int64_t j);
  // Adds rollout j's nodes not yet in open piece q to it.
  void Add(int64_t q, int64_t j);
  absl::Status Overlong(int64_t j, int64_t root);

  const Forest& forest_;
  const ForestIndex& index_;
  const PlanOptions& o_;
  const int64_t align_to_;
  const Capacity& capacity_;
  const int64_t room_;  // the most tokens a piece may hold
  Cut cut_;

  // Per tree over the cap, reset after it.
  std::vector<TreePiece> open_;
  std::vector<int64_t> seen_;           // [open_] the rollout that last looked at a piece
  std::vector<int64_t> head_;           // [N] the node's newest membership, -1 for none
  std::vector<Member> members_;         // every (piece, node) membership of the tree
  absl::flat_hash_set<uint64_t> held_;  // piece * N + node
  std::vector<int64_t> subtree_;        // [N] kept tokens of the node's subtree
  std::vector<int64_t> first_at_;       // [N] the first kept rollout ending at the node
  std::vector<int64_t> next_at_;        // [R] the next kept rollout ending at the same node
  std::vector<int64_t> touched_;        // nodes whose scratch entries are set
};

absl::Status Cutter::Close(TreePiece piece) {
  std::sort(piece.nodes.begin(), piece.nodes.end(),
            [&](int64_t a, int64_t b) { return index_.preorder_pos[a] < index_.preorder_pos[b]; });
  std::sort(piece.rollouts.begin(), piece.rollouts.end());
  piece.aligned = *CheckedRoundUp(piece.tokens, align_to_);
  const std::optional<int64_t> cost = PieceCost(o_, piece, forest_, index_);
  if (!cost) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", Name(o_.cost), " cost of the tree at node ", piece.root,
                     " overflows int64; lower attention.linear/attention.quadratic"));
  }
  piece.cost = *cost;
  cut_.pieces.push_back(std::move(piece));
  return absl::OkStatus();
}

absl::Status Cutter::Overlong(int64_t j, int64_t root) {
  const int64_t len = index_.rollout_len[j];
  switch (o_.overlong) {
    case OverlongPolicy::kReject: {
      const int64_t aligned = *CheckedRoundUp(len, align_to_);
      return absl::InvalidArgumentError(
          absl::StrCat("rollout ", j, " has length ", len, " (aligned ", aligned,
                       ") over max_token_len = ", o_.max_token_len,
                       capacity_.cap() != o_.max_token_len
                           ? absl::StrCat(" (", capacity_.cap(), " after align_total_to)")
                           : std::string(),
                       "; raise the cap or set overlong to isolate or drop"));
    }
    case OverlongPolicy::kDrop:
      cut_.dropped.push_back(j);
      return absl::OkStatus();
    case OverlongPolicy::kIsolate: {
      TreePiece alone;
      alone.root = root;
      alone.overlong = true;
      alone.rollouts.push_back(j);
      for (int64_t node = forest_.rollout_leaf[j]; node >= 0; node = forest_.node_parent[node]) {
        alone.nodes.push_back(node);
        alone.tokens += forest_.node_len[node];
      }
      return Close(std::move(alone));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> Cutter::HeavyFirst(int64_t root, const std::vector<int64_t>& normal) {
  // The kept nodes (on some kept rollout's path) and their subtrees' kept tokens.
  for (auto it = normal.rbegin(); it != normal.rend(); ++it) {
    const int64_t j = *it;
    const int64_t leaf = forest_.rollout_leaf[j];
    next_at_[j] = first_at_[leaf];
    first_at_[leaf] = j;
    for (int64_t node = leaf; node >= 0 && subtree_[node] == 0; node = forest_.node_parent[node]) {
      subtree_[node] = forest_.node_len[node];
      touched_.push_back(node);
    }
  }
  std::sort(touched_.begin(), touched_.end(),
            [&](int64_t a, int64_t b) { return index_.preorder_pos[a] > index_.preorder_pos[b]; });
  for (int64_t node : touched_) {
    if (node != root) subtree_[forest_.node_parent[node]] += subtree_[node];
  }
  std::vector<int64_t> order;
  order.reserve(normal.size());
  std::vector<std::pair<int64_t, bool>> stack = {{root, false}};  // (node, its rollouts' turn)
  std::vector<int64_t> kids;
  while (!stack.empty()) {
    const auto [node, emit] = stack.back();
    stack.pop_back();
    if (emit) {
      for (int64_t j = first_at_[node]; j >= 0; j = next_at_[j]) order.push_back(j);
      continue;
    }
    stack.emplace_back(node, true);
    kids.clear();
    for (int64_t c = index_.child_begin[node]; c < index_.child_begin[node + 1]; ++c) {
      if (subtree_[index_.children[c]] > 0) kids.push_back(index_.children[c]);
    }
    // Lightest pushed first, so the heaviest is visited first.
    std::sort(kids.begin(), kids.end(), [&](int64_t a, int64_t b) {
      return subtree_[a] != subtree_[b] ? subtree_[a] < subtree_[b] : a > b;
    });
    for (int64_t c : kids) stack.emplace_back(c, false);
  }
  return order;
}

int64_t Cutter::Place(int64_t root, int64_t j) {
  // The deepest node of j's path some piece holds, and the tokens below it.
  int64_t below = 0;
  int64_t node = forest_.rollout_leaf[j];
  while (node >= 0 && head_[node] < 0) {
    below += forest_.node_len[node];
    node = forest_.node_parent[node];
  }
  if (node < 0) return -1;
  int64_t best = -1;
  auto consider = [&](int64_t q, int64_t tokens) {
    if (open_[q].tokens + tokens <= room_ && (best < 0 || open_[q].tokens > open_[best].tokens)) {
      best = q;
    }
  };
  int looked = 0;
  for (int64_t m = head_[node]; m >= 0 && looked < kCandidates; m = members_[m].next, ++looked) {
    seen_[members_[m].piece] = j;
    consider(members_[m].piece, below);
  }
  if (best >= 0 || node == root) return best;
  // Pieces that hold less of the path: every piece of the tree holds its root, so the rest of
  // the path bounds what they need.
  const int64_t rest = index_.rollout_len[j] - forest_.node_len[root];
  looked = 0;
  for (int64_t m = head_[root]; m >= 0 && looked < kCandidates; m = members_[m].next, ++looked) {
    if (seen_[members_[m].piece] != j) consider(members_[m].piece, rest);
  }
  return best;
}

void Cutter::Add(int64_t q, int64_t j) {
  const uint64_t n = forest_.node_len.size();
  TreePiece& piece = open_[q];
  for (int64_t node = forest_.rollout_leaf[j];
       node >= 0 && held_.insert(static_cast<uint64_t>(q) * n + node).second;
       node = forest_.node_parent[node]) {
    members_.push_back({q, head_[node]});
    head_[node] = static_cast<int64_t>(members_.size()) - 1;
    piece.nodes.push_back(node);
    piece.tokens += forest_.node_len[node];
  }
  piece.rollouts.push_back(j);
}

absl::Status Cutter::CutTree(int64_t root, const std::vector<int64_t>& rollouts) {
  std::vector<int64_t> normal;
  for (int64_t j : rollouts) {
    if (index_.rollout_len[j] > room_) {
      RETURN_IF_ERROR(Overlong(j, root));
    } else {
      normal.push_back(j);
    }
  }
  if (normal.empty()) return absl::OkStatus();
  for (int64_t j : HeavyFirst(root, normal)) {
    int64_t q = Place(root, j);
    if (q < 0) {
      q = static_cast<int64_t>(open_.size());
      open_.emplace_back().root = root;
      seen_.push_back(-1);
    }
    Add(q, j);
  }
  for (TreePiece& piece : open_) RETURN_IF_ERROR(Close(std::move(piece)));
  for (int64_t node : touched_) {
    head_[node] = -1;
    subtree_[node] = 0;
    first_at_[node] = -1;
  }
  touched_.clear();
  open_.clear();
  seen_.clear();
  members_.clear();
  held_.clear();
  return absl::OkStatus();
}

absl::StatusOr<Cut> Cutter::Run() {
  const int64_t n = static_cast<int64_t>(forest_.node_len.size());
  const int64_t r = static_cast<int64_t>(forest_.rollout_leaf.size());
  // Per tree: its tokens, and its rollouts (trees in root order, rollouts by preorder of their
  // leaves, then index).
  std::vector<int64_t> tree_tokens(n, 0);
  for (int64_t i = 0; i < n; ++i) tree_tokens[index_.root[i]] += forest_.node_len[i];
  std::vector<int64_t> by_leaf(r);
  for (int64_t j = 0; j < r; ++j) by_leaf[j] = j;
  std::sort(by_leaf.begin(), by_leaf.end(), [&](int64_t a, int64_t b) {
    const int64_t pa = index_.preorder_pos[forest_.rollout_leaf[a]];
    const int64_t pb = index_.preorder_pos[forest_.rollout_leaf[b]];
    return pa != pb ? pa < pb : a < b;
  });
  std::vector<int64_t> rollouts;
  size_t next = 0;
  for (int64_t root : index_.roots) {
    rollouts.clear();
    while (next < by_leaf.size() && index_.root[forest_.rollout_leaf[by_leaf[next]]] == root) {
      rollouts.push_back(by_leaf[next++]);
    }
    if (tree_tokens[root] <= room_) {
      // The whole tree: every node of it is some rollout's (IndexForest).
      TreePiece piece;
      piece.root = root;
      for (int64_t pos = index_.preorder_pos[root];
           pos < n && index_.root[index_.preorder[pos]] == root; ++pos) {
        piece.nodes.push_back(index_.preorder[pos]);
      }
      piece.tokens = tree_tokens[root];
      piece.rollouts = rollouts;
      RETURN_IF_ERROR(Close(std::move(piece)));
      continue;
    }
    if (head_.empty()) {  // the first tree over the cap sizes the scratch arrays
      head_.assign(n, -1);
      subtree_.assign(n, 0);
      first_at_.assign(n, -1);
      next_at_.assign(r, -1);
    }
    RETURN_IF_ERROR(CutTree(root, rollouts));
  }
  std::sort(cut_.dropped.begin(), cut_.dropped.end());
  return std::move(cut_);
}

}  // namespace

absl::StatusOr<Cut> CutForest(const Forest& forest, const ForestIndex& index,
                              const PlanOptions& options, int64_t align_to,
                              const Capacity& capacity) {
  return Cutter(forest, index, options, align_to, capacity).Run();
}

}  // namespace packsched::planner::internal
