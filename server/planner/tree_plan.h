#ifndef PACKSCHED_SERVER_PLANNER_TREE_PLAN_H_
#define PACKSCHED_SERVER_PLANNER_TREE_PLAN_H_

// Tree packing's plan (docs/design.md "Tree packing"): a forest of rollouts (forest.h) cut into
// packing items, "pieces", planned by the sequence planner (planner.h) as if each piece were
// one sequence, then laid out row by row.
//
// A piece is a whole tree, or, for a tree whose unique tokens pass the cap, a subset of its
// rollouts with every node on their paths, so a shared prefix is repeated in each piece that
// holds it (tree_cut.h: how the cut keeps that small). A piece's tokens are
// its unique tokens, aligned as a sequence is (align_to); its cost is the sequence cost model
// generalised: under kTokens the aligned tokens; under kAttention
//   linear x aligned + quadratic x (sum over its nodes of (d + l)^2 - d^2  +  aligned^2 - tokens^2)
// for a node of l tokens after d tokens on its root path: each query token against its whole
// ancestor path, so that a chain (one rollout) costs exactly what the same sequence costs flat
// and the alignment padding costs what it costs there. A model's windowed and chunked layers
// count the same positions their way (AttentionScores(attention, d, d + l) per node, options.h:
// the window and the chunks run along the root path's depths, as the kernels' tree window does).
//
// The overlong policy applies to a rollout whose aligned length alone passes the cap: kReject
// names it, kDrop leaves it out (and every node only it uses), kIsolate makes it a piece of its
// own, alone in a micro-batch flagged overlong. max_seqs_per_micro_batch counts pieces.
// With context_parallel = cp > 1 pieces are aligned as sequences are (align_to = 2 * cp * tp by
// default), so each splits into 2 * cp equal chunks for the tree shard map, and a piece's cost is
// divided by cp (the work of one CP rank, as for a sequence).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/forest.h"
#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/planner/plan.h"
#include "server/planner/planner.h"

namespace packsched::planner {

namespace internal {
struct TreeState;
}  // namespace internal

struct TreePiece {
  int64_t root = 0;               // its tree
  std::vector<int64_t> rollouts;  // the rollouts it holds, ascending
  std::vector<int64_t> nodes;     // every node on their paths, in depth-first preorder
  int64_t tokens = 0;             // sum of the nodes' lengths: each token once
  int64_t aligned = 0;            // tokens rounded up to align_to
  int64_t cost = 0;               // see the top of this file
  bool overlong = false;          // one rollout over the cap (kIsolate)
};

// The layout of one micro-batch as the plan keeps it: linear in its pieces and rollouts (not in
// the nodes its pieces repeat). Piece b of the micro-batch (batch.indices[b], in that order)
// holds rollouts piece_rollouts[piece_rollout_begin[b] .. piece_rollout_begin[b + 1]) and every
// node on their paths; its rows start at batch.cu_seqlens_aligned[b]. Everything per node or per
// row is derived from it and the forest on demand (Entries, RowsOf, RolloutRows).
struct TreeLayout {
  std::vector<int64_t> rollouts;             // rollouts held, ascending
  std::vector<int64_t> piece_rollouts;       // the pieces' rollouts, piece after piece, ascending
  std::vector<int64_t> piece_rollout_begin;  // [P + 1]
};

// The layout node by node. Its "entries" are the nodes of the micro-batch's pieces, piece after
// piece, each piece in depth-first preorder (children in ascending node index); a node of a
// split tree may appear in several pieces.
//   position of row t of entry e  = position[e] + (t - row[e])   (its depth on the root path)
//   subtree_end of row t of entry e = subtree_end[e]
struct TreeEntries {
  std::vector<int64_t> nodes;          // [E] the forest node of each entry
  std::vector<int64_t> piece_begin;    // [P + 1] piece b's entries: [piece_begin[b], ...[b + 1])
  std::vector<int64_t> row;            // [E] its first packed row
  std::vector<int64_t> position;       // [E] its first token's position (tokens above it)
  std::vector<int64_t> subtree_end;    // [E] one past the last row of its subtree in the piece
  std::vector<int64_t> parent;         // [E] its parent's entry, -1 for a piece's root
  std::vector<int64_t> rollout_entry;  // [layout.rollouts] the entry of each one's last node
};

struct TreeMicroBatch {
  // The micro-batch as the sequence planner sees it: `indices` are piece ids (ascending), its
  // cu_seqlens and cu_seqlens_aligned delimit the pieces, its tokens are unique tokens.
  MicroBatch batch;
  TreeLayout layout;
};

struct TreePlan {
  std::vector<TreeMicroBatch> parts;
  std::vector<int64_t> dropped;       // rollouts left out (kDrop), ascending
  std::vector<int64_t> rollout_part;  // [R] each rollout's micro-batch, -1 if dropped or not here
  PlanStats stats;                    // the sequence planner's, over pieces
  int64_t num_rollouts = 0;           // R
  int64_t rollout_tokens = 0;    // tokens of the kept rollouts here: what flat packing forwards
  int64_t forwarded_tokens = 0;  // tokens of the pieces here (shared prefixes once per piece)
};

// A validated forest cut into pieces, with the local bound: TreeProblem is to a forest what
// Problem is to lengths (the sidecar's rounds agree on k between Create and Partition).
// Immutable after Create(); safe to share across threads; cheap to copy.
class TreeProblem {
 public:
  // InvalidArgument for a bad forest (IndexForest), bad options (as Problem::Create), a rollout
  // over the cap under kReject (naming it), or a piece cost that overflows int64.
  static absl::StatusOr<TreeProblem> Create(const Forest& forest, const PlanOptions& options,
                                            bool cap_optional = false);

  int64_t local_k() const;
  int64_t lower_bound_k() const;
  int64_t num_sequences() const;  // rollouts given
  int64_t num_kept() const;       // rollouts planned (not dropped)
  int64_t total_tokens() const;   // tokens of the pieces (what the plan forwards)
  const std::vector<TreePiece>& pieces() const;
  const std::vector<int64_t>& dropped() const;  // rollouts
  const Forest& forest() const;
  const ForestIndex& index() const;
  const Problem& problem() const;  // over the pieces

  // As Problem::Partition, then laid out. InvalidArgument as Problem::Partition.
  absl::StatusOr<TreePlan> Partition(int64_t k) const;

 private:
  explicit TreeProblem(std::shared_ptr<const internal::TreeState> state);
  std::shared_ptr<const internal::TreeState> state_;
};

// TreeProblem::Create + Partition(local_k()). InvalidArgument for a forest with no rollouts
// (CheckHasRollouts, forest.h), or as TreeProblem::Create.
absl::StatusOr<TreePlan> PlanForest(const Forest& forest, const PlanOptions& options);

// Exactly `k` micro-batches, the cap optional (as PartitionFixedK); a forest with no rollouts
// gets k empty ones.
absl::StatusOr<TreePlan> PartitionForestFixedK(const Forest& forest, int64_t k,
                                               const PlanOptions& options);

// Dataset packing of the pieces (options.algorithm ffd, bfd or sequential; as PackDataset).
// InvalidArgument for a forest with no rollouts, or as PackDataset.
absl::StatusOr<TreePlan> PackForest(const Forest& forest, const PlanOptions& options);

// Coordinator mode over a forest: the pieces balanced over ranks as BalanceBatch balances
// sequences. With fewer pieces than ranks, pieces are first split at rollout boundaries
// (tree_cut.h SplitPieces) until there are world_size of them or every piece holds one
// rollout. When a tree is split, two plans are made: its pieces spread over the ranks like
// any others, and its pieces on one rank (BalanceBatch's group_ids); the plan with more ranks
// holding a piece wins, then the one with the shorter step under balance.sync (ties: one
// rank). So every rank holds a piece whenever the forest has at least world_size kept
// rollouts. Rank r's plan holds global piece and rollout ids; its rollout_part marks only its
// own rollouts. The cut, the splits and the layouts ask balance.stop as BalanceBatch's loops
// do (its first non-OK answer is returned).
//
// `group_ids` (empty, or one per rollout, any int64): the rollouts of a group stay on one rank,
// as BalanceBatch's sequences of a group do. Each tree is first cut at its rollouts' groups
// (SplitByGroup, forest.h: a prefix that rollouts of several groups share is forwarded once per
// group), the result is cut into pieces within the cap as any forest, and the pieces of one
// group are one unit of BalanceBatch's group_ids: no piece holds rollouts of two groups, no
// group spans two ranks, every micro-batch keeps the cap. No further split for the ranks (a
// group's pieces share its rank): every rank holds a piece whenever there are at least
// world_size groups with kept rollouts. A group needs at least max(ceil(aligned tokens of its
// pieces, each overlong piece counted as one micro-batch, / max_token_len), ceil(pieces /
// max_seqs_per_micro_batch)) micro-batches on its rank; world_size times that over
// max_micro_batches is InvalidArgument naming the group.
//
// InvalidArgument for a forest with no rollouts, group_ids of the wrong size or a group too
// large (above); else errors as BalanceBatch, and as TreeProblem::Create for the forest.
struct BalancedForest {
  std::vector<TreePlan> ranks;
  int64_t num_micro_batches = 0;
  std::vector<int64_t> dropped;  // rollouts, ascending
  StepStats step;
};
absl::StatusOr<BalancedForest> BalanceForest(const Forest& forest, int64_t world_size,
                                             const PlanOptions& options,
                                             const BalanceOptions& balance = {},
                                             absl::Span<const int64_t> group_ids = {});

// The entries of a micro-batch, in O(entries log entries): the one implementation of the
// layout (the CLI, the C++ client's users and Python's TreeMicroBatch call it). The forest as
// its three arrays, so that callers holding them elsewhere (numpy) need not copy them.
// REQUIRES: `layout` and `batch` come from a plan of this forest (or its wire copy).
TreeEntries Entries(const MicroBatch& batch, const TreeLayout& layout,
                    absl::Span<const int64_t> node_len, absl::Span<const int64_t> node_parent,
                    absl::Span<const int64_t> rollout_leaf);
TreeEntries Entries(const TreeMicroBatch& part, const Forest& forest);

// Per packed row of `batch` (batch.total rows): position and subtree_end as the entries define
// them. A piece's alignment padding rows count positions 0, 1, ... and end at the piece's
// aligned end; the tail rows past aligned_tokens count positions from 0 and end at `total`: no
// real row sees a padding row or the reverse.
struct TreeRows {
  std::vector<int32_t> position;
  std::vector<int32_t> subtree_end;
};
TreeRows RowsOf(const MicroBatch& batch, const TreeEntries& entries,
                absl::Span<const int64_t> node_len);
TreeRows RowsOf(const TreeMicroBatch& part, const Forest& forest);

// The packed rows of rollout layout.rollouts[i], in its token order (restore indices): the
// rows of the entries from rollout_entry[i] up through `parent`, root first.
std::vector<int64_t> RolloutRows(const TreeEntries& entries, absl::Span<const int64_t> node_len,
                                 size_t i);

// The plan as a plan over rollouts, for CountLoss and ComputeLossWeights (loss_weights.h):
// part p's indices are the rollouts it holds; revert and reorder are over all R rollouts (-1
// for dropped ones and, in a rank's plan of BalanceForest, for other ranks' rollouts); tokens
// and max_seqlen are the rollouts' (no offsets: the rows are the layout's). Loss weights are
// per rollout as for sequences.
MicroBatchPlan RolloutView(const TreePlan& plan, const ForestIndex& index);

// RolloutView with the micro-batches over pieces (TreeMicroBatch::batch): what the sidecar
// answers a forest request with (reorder, revert and dropped over rollouts; micro_batches'
// indices are piece ids and their offsets delimit the pieces).
MicroBatchPlan ResponseView(const TreePlan& plan, const ForestIndex& index);

// CountLoss over the rollouts `problem` keeps, before any plan exists (what a rank sends into
// the round). `loss_tokens`: one per rollout; InvalidArgument as CountLoss.
absl::StatusOr<LossCounts> CountLoss(const TreeProblem& problem,
                                     absl::Span<const int64_t> loss_tokens);

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_TREE_PLAN_H_
