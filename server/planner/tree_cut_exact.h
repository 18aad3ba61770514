#ifndef PACKSCHED_SERVER_PLANNER_TREE_CUT_EXACT_H_
#define PACKSCHED_SERVER_PLANNER_TREE_CUT_EXACT_H_

// Internal to the planner: the exact cut of one small tree (tree_cut.h), and the floor that
// says when the greedy cut needs no search.
//
// A cut of m rollouts of one tree into pieces forwards, per piece, the union of its rollouts'
// paths. Two paths share their common prefix, so adding rollout j to a piece P adds
// len(j) - max over i in P of common(i, j) tokens: every piece's tokens follow from the m x m
// common-prefix table, and the fewest tokens over all cuts is a dynamic programme over the
// subsets of the m rollouts (the piece holding the first rollout left, then the rest): 3^m / 2
// subset pairs at most.
//
// A GRPO group (every two rollouts share the same prefix, the prompt) is bin packing: a piece
// forwards the prompt once plus its completions, so the fewest tokens are the fewest bins of
// room - prompt for the completions. There Martello and Toth's bound L2 ("Lower bounds and
// reduction procedures for the bin packing problem", 1990) first tells whether any cut can
// beat the one known, and the search is the bins-and-last-fill programme over subsets
// (2^m x m steps).

#include <cstdint>
#include <optional>
#include <vector>

#include "server/planner/stop_check.h"

namespace packsched::planner::internal {

// The most rollouts ExactCut takes: 3^16 / 2 subset pairs at most, tens of milliseconds.
inline constexpr int kExactCutRollouts = 16;

// `len[i]`: the tokens of rollout i's path; `common[i * m + j]`: the tokens of the prefix
// rollouts i and j share (common[i * m + i] = len[i]); `room`: the most tokens a piece holds.
// REQUIRES: 1 <= m <= kExactCutRollouts, every len[i] <= room, common symmetric and at most
// min(len[i], len[j]).
struct ExactPieces {
  std::vector<uint32_t> pieces;  // bit masks over the rollouts, in the order of their lowest
  int64_t tokens = 0;            // forwarded by the cut
};

// `known`: the tokens of a cut already found.
// Returns a cut forwarding the fewest tokens, or no pieces when no cut forwards fewer than
// `known`; nullopt once `stop` (may be null) says stop. Steps counted: one per subset pair or
// (subset, rollout) looked at.
std::optional<ExactPieces> ExactCut(const std::vector<int64_t>& len,
                                    const std::vector<int64_t>& common, int64_t room, int64_t known,
                                    StopCheck* stop);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_TREE_CUT_EXACT_H_
