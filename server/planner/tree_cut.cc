#include "server/planner/tree_cut.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/tree_cut_exact.h"

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
         const Capacity& capacity, StopCheck* stop)
      : forest_(forest),
        index_(index),
        o_(o),
        align_to_(align_to),
        capacity_(capacity),
        // aligned(t) <= cap  <=>  t <= the largest multiple of align_to within the cap.
        room_(capacity.has_cap() ? capacity.cap() / align_to * align_to
                                 : std::numeric_limits<int64_t>::max()),
        stop_(stop) {}

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
  // The floor under the tokens of any cut of the tree's kept rollouts (tree_cut.h), from the
  // scratch arrays HeavyFirst set.
  int64_t Floor(int64_t root, const std::vector<int64_t>& order);
  // The open pieces replaced by the exact cut of `order` (at most kExactCutRollouts) when it
  // forwards fewer tokens. The stop check's status once it says stop.
  absl::Status CutExactly(const std::vector<int64_t>& order);
  void ClearOpen();

  const Forest& forest_;
  const ForestIndex& index_;
  const PlanOptions& o_;
  const int64_t align_to_;
  const Capacity& capacity_;
  const int64_t room_;  // the most tokens a piece may hold
  StopCheck* const stop_;
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
  std::vector<int64_t> longest_;        // [N] the longest kept rollout through the node
  std::vector<int64_t> pieces_;         // [N] the fewest pieces that hold the node
  std::vector<int64_t> wide_;           // [N] children no two of whose rollouts share a piece
  std::vector<uint32_t> through_;       // [N] the rollouts of the exact cut through the node
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

int64_t Cutter::Floor(int64_t root, const std::vector<int64_t>& order) {
  for (int64_t j : order) {
    int64_t& longest = longest_[forest_.rollout_leaf[j]];
    longest = std::max(longest, index_.rollout_len[j]);
  }
  // touched_ is in decreasing preorder: children before their parents.
  int64_t floor = 0;
  for (int64_t node : touched_) {
    const int64_t len = forest_.node_len[node];
    const int64_t through = index_.depth[node] + len;
    const int64_t below = subtree_[node] - len;
    int64_t& pieces = pieces_[node];
    pieces = std::max<int64_t>(pieces, 1);
    if (below > 0) {
      // A kept rollout below the node fits the room, so the room passes `through`.
      const int64_t free = room_ - through;
      pieces = std::max({pieces, (below + free - 1) / free, wide_[node]});
    }
    floor += len * pieces;
    if (node == root) continue;
    const int64_t up = forest_.node_parent[node];
    const int64_t up_through = index_.depth[up] + forest_.node_len[up];
    pieces_[up] = std::max(pieces_[up], pieces);
    longest_[up] = std::max(longest_[up], longest_[node]);
    // Two rollouts that each need more than half the room left below the parent never share
    // a piece.
    if (2 * (longest_[node] - up_through) > room_ - up_through) ++wide_[up];
  }
  return floor;
}

void Cutter::ClearOpen() {
  for (int64_t node : touched_) head_[node] = -1;
  open_.clear();
  seen_.clear();
  members_.clear();
  held_.clear();
}

absl::Status Cutter::CutExactly(const std::vector<int64_t>& order) {
  const int m = static_cast<int>(order.size());
  // common[i][k]: the tokens of the nodes on both paths.
  for (int i = 0; i < m; ++i) {
    for (int64_t node = forest_.rollout_leaf[order[i]]; node >= 0;
         node = forest_.node_parent[node]) {
      through_[node] |= uint32_t{1} << i;
    }
  }
  std::vector<int64_t> len(m);
  std::vector<int64_t> common(static_cast<size_t>(m) * m, 0);
  for (int i = 0; i < m; ++i) {
    len[i] = index_.rollout_len[order[i]];
    for (int64_t node = forest_.rollout_leaf[order[i]]; node >= 0;
         node = forest_.node_parent[node]) {
      for (uint32_t mask = through_[node]; mask != 0; mask &= mask - 1) {
        common[i * m + std::countr_zero(mask)] += forest_.node_len[node];
      }
    }
  }
  for (int64_t node : touched_) through_[node] = 0;
  int64_t greedy = 0;
  for (const TreePiece& piece : open_) greedy += piece.tokens;
  const std::optional<ExactPieces> exact = ExactCut(len, common, room_, greedy, stop_);
  if (!exact) return stop_->status();
  if (exact->pieces.empty()) return absl::OkStatus();
  const int64_t root = open_.front().root;
  ClearOpen();
  for (uint32_t mask : exact->pieces) {
    const int64_t q = static_cast<int64_t>(open_.size());
    open_.emplace_back().root = root;
    seen_.push_back(-1);
    for (uint32_t b = mask; b != 0; b &= b - 1) Add(q, order[std::countr_zero(b)]);
  }
  return absl::OkStatus();
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
  const std::vector<int64_t> order = HeavyFirst(root, normal);
  for (int64_t j : order) {
    if (stop_ != nullptr && !stop_->Continue(kCandidates)) return stop_->status();
    int64_t q = Place(root, j);
    if (q < 0) {
      q = static_cast<int64_t>(open_.size());
      open_.emplace_back().root = root;
      seen_.push_back(-1);
    }
    Add(q, j);
  }
  if (order.size() <= static_cast<size_t>(kExactCutRollouts) && open_.size() > 1) {
    int64_t greedy = 0;
    for (const TreePiece& piece : open_) greedy += piece.tokens;
    if (greedy > Floor(root, order)) RETURN_IF_ERROR(CutExactly(order));
  }
  for (TreePiece& piece : open_) RETURN_IF_ERROR(Close(std::move(piece)));
  ClearOpen();
  for (int64_t node : touched_) {
    subtree_[node] = 0;
    first_at_[node] = -1;
    longest_[node] = 0;
    pieces_[node] = 0;
    wide_[node] = 0;
  }
  touched_.clear();
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
    if (stop_ != nullptr && !stop_->Continue()) return stop_->status();
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
      if (stop_ != nullptr && !stop_->Continue(static_cast<int64_t>(rollouts.size()))) {
        return stop_->status();
      }
      continue;
    }
    if (head_.empty()) {  // the first tree over the cap sizes the scratch arrays
      head_.assign(n, -1);
      subtree_.assign(n, 0);
      first_at_.assign(n, -1);
      next_at_.assign(r, -1);
      longest_.assign(n, 0);
      pieces_.assign(n, 0);
      wide_.assign(n, 0);
      through_.assign(n, 0);
    }
    RETURN_IF_ERROR(CutTree(root, rollouts));
  }
  std::sort(cut_.dropped.begin(), cut_.dropped.end());
  return std::move(cut_);
}

// The piece of `rollouts` of the tree at `root`: the nodes on their paths, its tokens and cost.
absl::StatusOr<TreePiece> MakePiece(const Forest& forest, const ForestIndex& index,
                                    const PlanOptions& o, int64_t align_to, int64_t root,
                                    std::vector<int64_t> rollouts) {
  TreePiece piece;
  piece.root = root;
  std::sort(rollouts.begin(), rollouts.end());
  absl::flat_hash_set<int64_t> held;
  for (int64_t j : rollouts) {
    for (int64_t node = forest.rollout_leaf[j]; node >= 0 && held.insert(node).second;
         node = forest.node_parent[node]) {
      piece.nodes.push_back(node);
      piece.tokens += forest.node_len[node];
    }
  }
  piece.rollouts = std::move(rollouts);
  std::sort(piece.nodes.begin(), piece.nodes.end(),
            [&](int64_t a, int64_t b) { return index.preorder_pos[a] < index.preorder_pos[b]; });
  piece.aligned = *CheckedRoundUp(piece.tokens, align_to);
  const std::optional<int64_t> cost = PieceCost(o, piece, forest, index);
  if (!cost) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", Name(o.cost), " cost of the tree at node ", root,
                     " overflows int64; lower attention.linear/attention.quadratic"));
  }
  piece.cost = *cost;
  return piece;
}

}  // namespace

absl::Status SplitPieces(const Forest& forest, const ForestIndex& index, const PlanOptions& options,
                         int64_t align_to, int64_t want, std::vector<TreePiece>& pieces,
                         StopCheck* stop) {
  // The splittable pieces, costliest first (ties: the first).
  std::priority_queue<std::pair<int64_t, int64_t>> costliest;
  for (size_t b = 0; b < pieces.size(); ++b) {
    if (pieces[b].rollouts.size() >= 2) costliest.emplace(pieces[b].cost, -static_cast<int64_t>(b));
  }
  while (static_cast<int64_t>(pieces.size()) < want && !costliest.empty()) {
    const int64_t at = -costliest.top().second;
    costliest.pop();
    std::vector<int64_t> rollouts = pieces[at].rollouts;
    if (stop != nullptr && !stop->Continue(static_cast<int64_t>(rollouts.size()) +
                                           static_cast<int64_t>(pieces[at].nodes.size()))) {
      return stop->status();
    }
    std::sort(rollouts.begin(), rollouts.end(), [&](int64_t a, int64_t b) {
      const int64_t pa = index.preorder_pos[forest.rollout_leaf[a]];
      const int64_t pb = index.preorder_pos[forest.rollout_leaf[b]];
      return pa != pb ? pa < pb : a < b;
    });
    int64_t total = 0;
    for (int64_t j : rollouts) total += index.rollout_len[j];
    size_t cut = 1;
    for (int64_t sum = index.rollout_len[rollouts[0]]; cut + 1 < rollouts.size() && 2 * sum < total;
         ++cut) {
      sum += index.rollout_len[rollouts[cut]];
    }
    const int64_t root = pieces[at].root;
    ASSIGN_OR_RETURN(TreePiece first,
                     MakePiece(forest, index, options, align_to, root,
                               std::vector<int64_t>(rollouts.begin(), rollouts.begin() + cut)));
    ASSIGN_OR_RETURN(TreePiece second,
                     MakePiece(forest, index, options, align_to, root,
                               std::vector<int64_t>(rollouts.begin() + cut, rollouts.end())));
    pieces[at] = std::move(first);
    pieces.push_back(std::move(second));
    const int64_t added = static_cast<int64_t>(pieces.size()) - 1;
    if (pieces[at].rollouts.size() >= 2) costliest.emplace(pieces[at].cost, -at);
    if (pieces[added].rollouts.size() >= 2) costliest.emplace(pieces[added].cost, -added);
  }
  // A tree's pieces together again, trees in root order.
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const TreePiece& a, const TreePiece& b) { return a.root < b.root; });
  return absl::OkStatus();
}

absl::StatusOr<Cut> CutForest(const Forest& forest, const ForestIndex& index,
                              const PlanOptions& options, int64_t align_to,
                              const Capacity& capacity, StopCheck* stop) {
  return Cutter(forest, index, options, align_to, capacity, stop).Run();
}

}  // namespace packsched::planner::internal
