#include "server/planner/forest.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/planner/options.h"
#include "server/planner/stop_check.h"

namespace packsched::planner {

absl::StatusOr<ForestIndex> IndexForest(const Forest& forest) {
  const int64_t n = static_cast<int64_t>(forest.node_len.size());
  const int64_t r = static_cast<int64_t>(forest.rollout_leaf.size());
  if (static_cast<int64_t>(forest.node_parent.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("forest: node_parent has ",
                                                   forest.node_parent.size(), " entries for ", n,
                                                   " nodes in node_len"));
  }
  if (!forest.rollout_len.empty() && static_cast<int64_t>(forest.rollout_len.size()) != r) {
    return absl::InvalidArgumentError(
        absl::StrCat("forest: rollout_len has ", forest.rollout_len.size(), " entries for ", r,
                     " rollouts in rollout_leaf; give one each or none"));
  }
  if (n > kMaxForestNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("forest: ", n, " nodes, more than the limit ", kMaxForestNodes));
  }
  if (r > kMaxForestRollouts) {
    return absl::InvalidArgumentError(
        absl::StrCat("forest: ", r, " rollouts, more than the limit ", kMaxForestRollouts));
  }
  ForestIndex index;
  index.depth.resize(n);
  index.root.resize(n);
  index.child_begin.assign(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = forest.node_len[i];
    const int64_t parent = forest.node_parent[i];
    if (len < 1 || len > kMaxLength) {
      return absl::InvalidArgumentError(absl::StrCat("forest: node ", i, " has node_len = ", len,
                                                     ": must be in [1, ", kMaxLength, "]"));
    }
    if (parent < -1 || parent >= i) {
      return absl::InvalidArgumentError(
          absl::StrCat("forest: node ", i, " has node_parent = ", parent,
                       ": must be -1 (a root) or a node before it, in [0, ", i,
                       ") (parents come before their children, which also rules out a cycle)"));
    }
    if (parent < 0) {
      index.root[i] = i;
      index.roots.push_back(i);
    } else {
      index.root[i] = index.root[parent];
      index.depth[i] = index.depth[parent] + forest.node_len[parent];
      ++index.child_begin[parent + 1];
      if (index.depth[i] + len > kMaxLength) {
        return absl::InvalidArgumentError(absl::StrCat("forest: the path to node ", i, " holds ",
                                                       index.depth[i] + len,
                                                       " tokens, over the limit ", kMaxLength));
      }
    }
    const std::optional<int64_t> total = CheckedAdd(index.unique_tokens, len);
    if (!total) return absl::InvalidArgumentError("forest: the token total overflows int64");
    index.unique_tokens = *total;
  }
  for (int64_t i = 0; i < n; ++i) index.child_begin[i + 1] += index.child_begin[i];
  index.children.resize(n - static_cast<int64_t>(index.roots.size()));
  {
    std::vector<int64_t> cursor(index.child_begin.begin(), index.child_begin.end() - 1);
    for (int64_t i = 0; i < n; ++i) {
      if (forest.node_parent[i] >= 0) index.children[cursor[forest.node_parent[i]]++] = i;
    }
  }
  index.preorder.reserve(n);
  index.preorder_pos.resize(n);
  std::vector<int64_t> stack;
  for (int64_t root : index.roots) {
    stack.push_back(root);
    while (!stack.empty()) {
      const int64_t node = stack.back();
      stack.pop_back();
      index.preorder_pos[node] = static_cast<int64_t>(index.preorder.size());
      index.preorder.push_back(node);
      for (int64_t c = index.child_begin[node + 1]; c-- > index.child_begin[node];) {
        stack.push_back(index.children[c]);
      }
    }
  }

  std::vector<bool> used(n, false);
  index.rollout_len.resize(r);
  for (int64_t j = 0; j < r; ++j) {
    const int64_t leaf = forest.rollout_leaf[j];
    if (leaf < 0 || leaf >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forest: rollout ", j, " has rollout_leaf = ", leaf, ": must be a node in [0, ", n, ")"));
    }
    index.rollout_len[j] = index.depth[leaf] + forest.node_len[leaf];
    if (!forest.rollout_len.empty() && forest.rollout_len[j] != index.rollout_len[j]) {
      return absl::InvalidArgumentError(
          absl::StrCat("forest: rollout ", j, " declares rollout_len = ", forest.rollout_len[j],
                       " but its path to node ", leaf, " holds ", index.rollout_len[j], " tokens"));
    }
    const std::optional<int64_t> total = CheckedAdd(index.rollout_tokens, index.rollout_len[j]);
    if (!total)
      return absl::InvalidArgumentError("forest: the rollout token total overflows int64");
    index.rollout_tokens = *total;
    for (int64_t node = leaf; node >= 0 && !used[node]; node = forest.node_parent[node]) {
      used[node] = true;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!used[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forest: node ", i, " is on no rollout's path (every node must be some rollout's)"));
    }
  }
  return index;
}

absl::Status CheckHasRollouts(const Forest& forest) {
  if (!forest.rollout_leaf.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("forest: no rollouts (rollout_leaf is empty): nothing to plan");
}

absl::StatusOr<Forest> SplitByGroup(const Forest& forest, const ForestIndex& index,
                                    absl::Span<const int64_t> group_ids,
                                    internal::StopCheck* stop) {
  // Every (node, group) some rollout of the group goes through: a path walked up to the first
  // copy its group already has.
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> copy;
  std::vector<std::pair<int64_t, int64_t>> copies;
  for (size_t r = 0; r < forest.rollout_leaf.size(); ++r) {
    for (int64_t node = forest.rollout_leaf[r]; node >= 0; node = forest.node_parent[node]) {
      if (!copy.emplace(std::make_pair(node, group_ids[r]), 0).second) break;
      copies.emplace_back(node, group_ids[r]);
      if (stop != nullptr && !stop->Continue()) return stop->status();
      if (static_cast<int64_t>(copies.size()) > kMaxForestNodes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group_ids: cutting the trees at the groups copies shared nodes into more than ",
            kMaxForestNodes, " nodes (the forest limit); give rollouts that share a long prefix ",
            "fewer groups"));
      }
    }
  }
  std::sort(copies.begin(), copies.end());
  Forest out;
  out.node_len.reserve(copies.size());
  out.node_parent.reserve(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const auto [node, group] = copies[i];
    copy[copies[i]] = static_cast<int64_t>(i);
    const int64_t parent = forest.node_parent[node];
    out.node_len.push_back(forest.node_len[node]);
    out.node_parent.push_back(parent < 0 ? -1 : copy.at(std::make_pair(parent, group)));
  }
  out.rollout_leaf.reserve(forest.rollout_leaf.size());
  for (size_t r = 0; r < forest.rollout_leaf.size(); ++r) {
    out.rollout_leaf.push_back(copy.at(std::make_pair(forest.rollout_leaf[r], group_ids[r])));
  }
  out.rollout_len = index.rollout_len;
  return out;
}

}  // namespace packsched::planner
