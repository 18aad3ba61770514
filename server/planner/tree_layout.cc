#include "server/planner/tree_layout.h"

#include <algorithm>
#include <utility>

namespace packsched::planner::internal {

TreePlan LayOut(MicroBatchPlan plan, absl::Span<const TreePiece> pieces, const Forest& forest,
                const ForestIndex& index, const std::vector<int64_t>& dropped) {
  TreePlan out;
  out.num_rollouts = static_cast<int64_t>(forest.rollout_leaf.size());
  out.dropped = dropped;
  out.rollout_part.assign(out.num_rollouts, -1);
  out.stats = plan.stats;
  out.parts.reserve(plan.parts.size());
  // The entry of each node in the piece being laid out (every entry it writes is rewritten
  // before it is read again: a piece's nodes are all set before its parents are looked up).
  std::vector<int64_t> entry_of(forest.node_len.size(), -1);
  for (size_t p = 0; p < plan.parts.size(); ++p) {
    TreeMicroBatch part;
    part.batch = std::move(plan.parts[p]);
    TreeLayout& layout = part.layout;
    std::vector<std::pair<int64_t, int64_t>> held;  // (rollout, leaf entry)
    layout.piece_begin.push_back(0);
    for (size_t b = 0; b < part.batch.indices.size(); ++b) {
      const TreePiece& piece = pieces[part.batch.indices[b]];
      const int64_t first = static_cast<int64_t>(layout.nodes.size());
      int64_t row = part.batch.cu_seqlens_aligned[b];
      for (int64_t node : piece.nodes) {
        const int64_t e = static_cast<int64_t>(layout.nodes.size());
        entry_of[node] = e;
        layout.nodes.push_back(node);
        layout.row.push_back(row);
        layout.position.push_back(index.depth[node]);
        row += forest.node_len[node];
        layout.subtree_end.push_back(row);
        const int64_t parent = forest.node_parent[node];
        // A piece holds every node on its rollouts' paths, so its non-root nodes' parents
        // are in it, and laid out before them (preorder).
        layout.parent.push_back(node == piece.root ? -1 : entry_of[parent]);
      }
      for (int64_t e = static_cast<int64_t>(layout.nodes.size()); e-- > first;) {
        if (layout.parent[e] >= 0) {
          layout.subtree_end[layout.parent[e]] =
              std::max(layout.subtree_end[layout.parent[e]], layout.subtree_end[e]);
        }
      }
      for (int64_t r : piece.rollouts) {
        held.emplace_back(r, entry_of[forest.rollout_leaf[r]]);
        out.rollout_part[r] = static_cast<int64_t>(p);
        out.rollout_tokens += index.rollout_len[r];
      }
      out.forwarded_tokens += piece.tokens;
      layout.piece_begin.push_back(static_cast<int64_t>(layout.nodes.size()));
    }
    std::sort(held.begin(), held.end());
    for (const auto& [r, e] : held) {
      layout.rollouts.push_back(r);
      layout.rollout_entry.push_back(e);
    }
    out.parts.push_back(std::move(part));
  }
  return out;
}

}  // namespace packsched::planner::internal

namespace packsched::planner {

TreeRows RowsOf(const TreeMicroBatch& part, const Forest& forest) {
  const MicroBatch& batch = part.batch;
  const TreeLayout& layout = part.layout;
  TreeRows rows;
  rows.position.resize(batch.total);
  rows.subtree_end.resize(batch.total);
  auto fill_padding = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rows.position[t] = static_cast<int32_t>(t - begin);
      rows.subtree_end[t] = static_cast<int32_t>(end);
    }
  };
  for (size_t b = 0; b + 1 < layout.piece_begin.size(); ++b) {
    for (int64_t e = layout.piece_begin[b]; e < layout.piece_begin[b + 1]; ++e) {
      const int64_t len = forest.node_len[layout.nodes[e]];
      for (int64_t j = 0; j < len; ++j) {
        rows.position[layout.row[e] + j] = static_cast<int32_t>(layout.position[e] + j);
        rows.subtree_end[layout.row[e] + j] = static_cast<int32_t>(layout.subtree_end[e]);
      }
    }
    fill_padding(batch.cu_seqlens_aligned[b] + (batch.cu_seqlens[b + 1] - batch.cu_seqlens[b]),
                 batch.cu_seqlens_aligned[b + 1]);
  }
  fill_padding(batch.aligned_tokens, batch.total);
  return rows;
}

std::vector<int64_t> RolloutRows(const TreeMicroBatch& part, const Forest& forest, size_t i) {
  const TreeLayout& layout = part.layout;
  std::vector<int64_t> path;
  for (int64_t e = layout.rollout_entry[i]; e >= 0; e = layout.parent[e]) path.push_back(e);
  std::vector<int64_t> rows;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    const int64_t len = forest.node_len[layout.nodes[*it]];
    for (int64_t j = 0; j < len; ++j) rows.push_back(layout.row[*it] + j);
  }
  return rows;
}

MicroBatchPlan RolloutView(const TreePlan& plan, const ForestIndex& index) {
  MicroBatchPlan view;
  view.revert.assign(plan.num_rollouts, -1);
  view.dropped = plan.dropped;
  view.parts.reserve(plan.parts.size());
  for (const TreeMicroBatch& part : plan.parts) {
    MicroBatch batch;
    batch.empty = part.layout.rollouts.empty();
    batch.overlong = part.batch.overlong;
    batch.cost = part.batch.cost;
    for (int64_t r : part.layout.rollouts) {
      batch.indices.push_back(r);
      batch.tokens += index.rollout_len[r];
      batch.max_seqlen = std::max(batch.max_seqlen, index.rollout_len[r]);
      view.revert[r] = static_cast<int64_t>(view.reorder.size());
      view.reorder.push_back(r);
    }
    view.parts.push_back(std::move(batch));
  }
  view.stats = plan.stats;
  view.stats.num_sequences = plan.num_rollouts;
  view.stats.num_kept = static_cast<int64_t>(view.reorder.size());
  view.stats.total_tokens = plan.rollout_tokens;
  return view;
}

MicroBatchPlan ResponseView(const TreePlan& plan, const ForestIndex& index) {
  MicroBatchPlan view = RolloutView(plan, index);
  for (size_t p = 0; p < plan.parts.size(); ++p) view.parts[p] = plan.parts[p].batch;
  return view;
}

absl::StatusOr<LossCounts> CountLoss(const TreeProblem& problem,
                                     absl::Span<const int64_t> loss_tokens) {
  const int64_t r = static_cast<int64_t>(problem.forest().rollout_leaf.size());
  MicroBatchPlan kept;  // CountLoss reads reorder (the kept rollouts) and revert's size
  kept.revert.assign(r, 0);
  const std::vector<int64_t>& dropped = problem.dropped();
  for (int64_t j = 0, next = 0; j < r; ++j) {
    if (next < static_cast<int64_t>(dropped.size()) && dropped[next] == j) {
      ++next;
    } else {
      kept.reorder.push_back(j);
    }
  }
  return CountLoss(kept, loss_tokens);
}

}  // namespace packsched::planner
