#ifndef PACKSCHED_SERVER_PLANNER_TREE_CUT_H_
#define PACKSCHED_SERVER_PLANNER_TREE_CUT_H_

// Internal to the planner: a validated forest cut into the pieces tree_plan.h plans.
//
// A tree whose unique tokens fit the cap is one piece. A tree over the cap is cut into pieces
// of whole rollouts, each holding every node on its rollouts' paths, so a node in several
// pieces is forwarded once per piece. The cut keeps that repetition small:
//  - the rollouts go in heavy-first depth-first order: at each node the children by
//    decreasing subtree tokens (ties: ascending index), a node's own rollouts after its
//    children. A long chain of turns then comes before the branches that leave it early, so
//    the pieces that repeat a prefix repeat a short one (the shallow branches), and the
//    completions of a GRPO group come largest first (first-fit decreasing);
//  - each rollout goes to the piece that already holds the deepest node of its path and still
//    has room for the rest (of those, the fullest), else to any piece of its tree with room for
//    all of its path below the root, else to a new piece. Only the 64 most recent pieces at
//    either node are looked at, so one rollout costs O(its new nodes + 64);
//  - a tree of at most kExactCutRollouts kept rollouts whose greedy cut forwards more than the
//    floor below (so it may not be the fewest) is cut again exactly (tree_cut_exact.h), and
//    the exact cut replaces the greedy one when it forwards fewer tokens: on such trees the
//    cut forwards the fewest tokens any cut does.
// The floor (Forest.forwarded_lower_bound in Python computes the same): each node is forwarded
// once per piece that holds it, and the pieces holding node u number at least 1, the tokens
// below u over the room left under u's path (rounded up), the count of any child, and the
// number of u's children through which some rollout needs more than half the room left under
// u (no two of those share a piece).
// Rollouts over the cap follow options.overlong before the cut (kIsolate: a piece of their own,
// flagged overlong, ahead of the tree's other pieces).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/planner/forest.h"
#include "server/planner/options.h"
#include "server/planner/prepared.h"
#include "server/planner/stop_check.h"
#include "server/planner/tree_plan.h"

namespace packsched::planner::internal {

struct Cut {
  std::vector<TreePiece> pieces;  // trees in root order; a tree's pieces in the cut's order
  std::vector<int64_t> dropped;   // rollouts left out (kDrop), ascending
};

// `align_to` is the effective one, `capacity` the validated cap, `stop` the caller's stop check
// or null. InvalidArgument for a rollout over the cap under kReject (naming it) or a piece cost
// that overflows int64; the stop check's status once it says stop.
absl::StatusOr<Cut> CutForest(const Forest& forest, const ForestIndex& index,
                              const PlanOptions& options, int64_t align_to,
                              const Capacity& capacity, StopCheck* stop = nullptr);

// Splits pieces at rollout boundaries until there are `want` or none holds two rollouts: each
// time the costliest piece of two or more rollouts (ties: the first), its rollouts in preorder
// of their leaves, into the first ones up to half its rollouts' tokens and the rest; then a
// tree's pieces together, trees in root order. O(want log want + the split pieces' sizes).
// Pieces keep their fields' meanings (tree_plan.h). InvalidArgument for a piece cost that
// overflows int64; the stop check's status once it says stop (`stop` may be null).
absl::Status SplitPieces(const Forest& forest, const ForestIndex& index, const PlanOptions& options,
                         int64_t align_to, int64_t want, std::vector<TreePiece>& pieces,
                         StopCheck* stop = nullptr);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_TREE_CUT_H_
