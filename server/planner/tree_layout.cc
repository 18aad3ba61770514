#include "server/planner/tree_layout.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace packsched::planner::internal {

TreePlan LayOut(MicroBatchPlan plan, absl::Span<const TreePiece> pieces, const Forest& forest,
                const ForestIndex& index, const std::vector<int64_t>& dropped) {
  TreePlan out;
  out.num_rollouts = static_cast<int64_t>(forest.rollout_leaf.size());
  out.dropped = dropped;
  out.rollout_part.assign(out.num_rollouts, -1);
  out.stats = plan.stats;
  out.parts.reserve(plan.parts.size());
  for (size_t p = 0; p < plan.parts.size(); ++p) {
    TreeMicroBatch part;
    part.batch = std::move(plan.parts[p]);
    TreeLayout& layout = part.layout;
    layout.piece_rollout_begin.push_back(0);
    for (const int64_t id : part.batch.indices) {
      const TreePiece& piece = pieces[id];
      for (const int64_t r : piece.rollouts) {
        layout.piece_rollouts.push_back(r);
        out.rollout_part[r] = static_cast<int64_t>(p);
        out.rollout_tokens += index.rollout_len[r];
      }
      out.forwarded_tokens += piece.tokens;
      layout.piece_rollout_begin.push_back(static_cast<int64_t>(layout.piece_rollouts.size()));
    }
    layout.rollouts = layout.piece_rollouts;
    std::sort(layout.rollouts.begin(), layout.rollouts.end());
    out.parts.push_back(std::move(part));
  }
  return out;
}

}  // namespace packsched::planner::internal

namespace packsched::planner {

TreeEntries Entries(const MicroBatch& batch, const TreeLayout& layout,
                    absl::Span<const int64_t> node_len, absl::Span<const int64_t> node_parent,
                    absl::Span<const int64_t> rollout_leaf) {
  TreeEntries out;
  out.piece_begin.push_back(0);
  out.rollout_entry.assign(layout.rollouts.size(), -1);
  absl::flat_hash_map<int64_t, int64_t> local;  // a piece's node -> its index in `nodes`
  std::vector<int64_t> nodes;
  std::vector<int64_t> first_child;  // children of nodes[j]: child[first_child[j] ...]
  std::vector<int64_t> child;
  std::vector<std::pair<int64_t, int64_t>> stack;  // (index in `nodes`, parent entry)
  for (size_t b = 0; b + 1 < layout.piece_rollout_begin.size(); ++b) {
    const int64_t begin = layout.piece_rollout_begin[b];
    const int64_t end = layout.piece_rollout_begin[b + 1];
    // The piece's nodes: its rollouts' paths, each walked up to the first node already seen.
    local.clear();
    nodes.clear();
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t n = rollout_leaf[layout.piece_rollouts[i]]; n >= 0 && local.emplace(n, 0).second;
           n = node_parent[n]) {
        nodes.push_back(n);
      }
    }
    // Parents come before children, so in ascending order the root is first and each node's
    // children are appended in ascending index.
    std::sort(nodes.begin(), nodes.end());
    const int64_t m = static_cast<int64_t>(nodes.size());
    for (int64_t j = 0; j < m; ++j) local[nodes[j]] = j;
    first_child.assign(m + 1, 0);
    for (int64_t j = 1; j < m; ++j) ++first_child[local[node_parent[nodes[j]]] + 1];
    for (int64_t j = 0; j < m; ++j) first_child[j + 1] += first_child[j];
    child.resize(std::max<int64_t>(m - 1, 0));
    std::vector<int64_t> fill(first_child.begin(), first_child.end() - 1);
    for (int64_t j = 1; j < m; ++j) child[fill[local[node_parent[nodes[j]]]]++] = j;
    // Depth-first preorder: rows, positions and parents on the way down.
    const int64_t base = static_cast<int64_t>(out.nodes.size());
    int64_t row = batch.cu_seqlens_aligned[b];
    if (m > 0) stack.emplace_back(0, -1);
    while (!stack.empty()) {
      const auto [j, parent] = stack.back();
      stack.pop_back();
      const int64_t node = nodes[j];
      const int64_t e = static_cast<int64_t>(out.nodes.size());
      local[node] = e;
      out.nodes.push_back(node);
      out.row.push_back(row);
      out.position.push_back(parent < 0 ? 0 : out.position[parent] + node_len[node_parent[node]]);
      out.parent.push_back(parent);
      row += node_len[node];
      out.subtree_end.push_back(row);
      for (int64_t c = first_child[j + 1]; c-- > first_child[j];) stack.emplace_back(child[c], e);
    }
    for (int64_t e = static_cast<int64_t>(out.nodes.size()); e-- > base;) {
      if (out.parent[e] >= 0) {
        out.subtree_end[out.parent[e]] =
            std::max(out.subtree_end[out.parent[e]], out.subtree_end[e]);
      }
    }
    out.piece_begin.push_back(static_cast<int64_t>(out.nodes.size()));
    // `local` now maps the piece's nodes to their entries: its rollouts' last entries.
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = layout.piece_rollouts[i];
      const auto it = std::lower_bound(layout.rollouts.begin(), layout.rollouts.end(), r);
      out.rollout_entry[it - layout.rollouts.begin()] = local[rollout_leaf[r]];
    }
  }
  return out;
}

TreeEntries Entries(const TreeMicroBatch& part, const Forest& forest) {
  return Entries(part.batch, part.layout, forest.node_len, forest.node_parent, forest.rollout_leaf);
}

TreeRows RowsOf(const MicroBatch& batch, const TreeEntries& entries,
                absl::Span<const int64_t> node_len) {
  TreeRows rows;
  rows.position.resize(batch.total);
  rows.subtree_end.resize(batch.total);
  auto fill_padding = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rows.position[t] = static_cast<int32_t>(t - begin);
      rows.subtree_end[t] = static_cast<int32_t>(end);
    }
  };
  for (size_t b = 0; b + 1 < entries.piece_begin.size(); ++b) {
    for (int64_t e = entries.piece_begin[b]; e < entries.piece_begin[b + 1]; ++e) {
      const int64_t len = node_len[entries.nodes[e]];
      for (int64_t j = 0; j < len; ++j) {
        rows.position[entries.row[e] + j] = static_cast<int32_t>(entries.position[e] + j);
        rows.subtree_end[entries.row[e] + j] = static_cast<int32_t>(entries.subtree_end[e]);
      }
    }
    fill_padding(batch.cu_seqlens_aligned[b] + (batch.cu_seqlens[b + 1] - batch.cu_seqlens[b]),
                 batch.cu_seqlens_aligned[b + 1]);
  }
  fill_padding(batch.aligned_tokens, batch.total);
  return rows;
}

TreeRows RowsOf(const TreeMicroBatch& part, const Forest& forest) {
  return RowsOf(part.batch, Entries(part, forest), forest.node_len);
}

std::vector<int64_t> RolloutRows(const TreeEntries& entries, absl::Span<const int64_t> node_len,
                                 size_t i) {
  std::vector<int64_t> path;
  for (int64_t e = entries.rollout_entry[i]; e >= 0; e = entries.parent[e]) path.push_back(e);
  std::vector<int64_t> rows;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    const int64_t len = node_len[entries.nodes[*it]];
    for (int64_t j = 0; j < len; ++j) rows.push_back(entries.row[*it] + j);
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
  view.stats.forwarded_tokens = plan.forwarded_tokens;
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
