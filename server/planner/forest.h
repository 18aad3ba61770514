#ifndef PACKSCHED_SERVER_PLANNER_FOREST_H_
#define PACKSCHED_SERVER_PLANNER_FOREST_H_

// A forest of rollouts (docs/design.md "Tree packing"): rollouts that share a prefix (a GRPO
// group's prompt, an agent's earlier turns) as paths of one tree, so that the shared tokens
// are forwarded once. Flat arrays, the same in Python (packsched.tree) and on the wire.
//
// Node n holds node_len[n] tokens; its parent node_parent[n] comes before it (-1 for a root).
// Rollout r is the path from its tree's root down to node rollout_leaf[r] (an inner node is
// allowed). A token's position is its depth: the tokens before it on its root path.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace packsched::planner {

namespace internal {
class StopCheck;  // stop_check.h
}  // namespace internal

// Limits on one forest (each over is InvalidArgument naming the field and value).
inline constexpr int64_t kMaxForestNodes = int64_t{1} << 26;
inline constexpr int64_t kMaxForestRollouts = int64_t{1} << 26;

struct Forest {
  std::vector<int64_t> node_len;      // [N], each in [1, 2^31 - 1]
  std::vector<int64_t> node_parent;   // [N], -1 or in [0, n)
  std::vector<int64_t> rollout_leaf;  // [R], each in [0, N)
  // Optional: empty, or [R] each rollout's declared length, which must equal the tokens on its
  // path (a check that the forest describes the rollouts the caller holds).
  std::vector<int64_t> rollout_len;
};

// What the plan needs to know about a valid forest, computed once in O(N + R).
struct ForestIndex {
  std::vector<int64_t> depth;         // [N] tokens before node n on its root path
  std::vector<int64_t> root;          // [N] the root of n's tree
  std::vector<int64_t> child_begin;   // [N + 1] node n's children are children[child_begin[n],
  std::vector<int64_t> children;      //   child_begin[n + 1]), ascending
  std::vector<int64_t> preorder;      // [N] the forest's nodes in depth-first preorder: trees in
                                      //   root order, children in ascending index
  std::vector<int64_t> preorder_pos;  // [N] n's position in `preorder`
  std::vector<int64_t> rollout_len;   // [R] tokens on each rollout's path
  std::vector<int64_t> roots;         // the roots, ascending
  int64_t unique_tokens = 0;          // sum of node_len: every token once
  int64_t rollout_tokens = 0;         // sum of rollout_len: what flat packing forwards
};

// Validates `forest` and indexes it. InvalidArgument naming the node or rollout for: arrays of
// different sizes, more than kMaxForestNodes nodes or kMaxForestRollouts rollouts, a node
// length out of range, a parent out of range or not before its child (which rules out
// cycles), a node on no rollout's path, a leaf out of range, a path over 2^31 - 1 tokens, a
// declared rollout length that is not its path's, or a token total that overflows int64.
absl::StatusOr<ForestIndex> IndexForest(const Forest& forest);

// The rule for an empty input (docs/design.md "The forest and the plan"): a forest with no
// rollouts is nothing to plan for PlanForest, PackForest, BalanceForest, `packsched plan
// --tree` and the sidecar, as no lengths are for the sequence doors; TreeProblem::Create and
// PartitionForestFixedK take it (a rank with no rollouts joins the agreed count with empty
// micro-batches). InvalidArgument "forest: no rollouts (rollout_leaf is empty): nothing to
// plan" when `forest` has none, else OK.
absl::Status CheckHasRollouts(const Forest& forest);

// The forest with every tree cut at its rollouts' groups (BalanceForest's group_ids, one per
// rollout, any int64): the rollouts of one tree and one group become a tree of their own, with
// every node on their paths; a node that rollouts of several groups go through is copied once
// per group. The copies are numbered by (node, group), so parents come before children and
// each copy's children keep their order. Rollout r stays rollout r with the same path tokens
// (rollout_len is kept), so a plan of the result, whose layouts name rollouts and not nodes, is
// a plan of `forest`. O(copies log copies); InvalidArgument, found after at most
// kMaxForestNodes steps, when the copies would pass kMaxForestNodes (as IndexForest refuses).
// `stop` (may be null) is asked as the planner's loops ask it (stop_check.h), one step per copy;
// its non-OK answer is returned.
// REQUIRES: `index` = IndexForest(forest); group_ids.size() == forest.rollout_leaf.size().
absl::StatusOr<Forest> SplitByGroup(const Forest& forest, const ForestIndex& index,
                                    absl::Span<const int64_t> group_ids,
                                    internal::StopCheck* stop = nullptr);

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_FOREST_H_
