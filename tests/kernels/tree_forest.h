#ifndef PACKSCHED_TESTS_KERNELS_TREE_FOREST_H_
#define PACKSCHED_TESTS_KERNELS_TREE_FOREST_H_

// Random forests and their packed layout for the tree-packing kernel tests, written from the
// contract (docs/design.md, "Tree packing"), sharing no code with the kernels: one piece per tree,
// nodes in depth-first preorder (children in ascending index), and per row its depth and the end
// of its node's subtree; per rollout (a root-to-node path) the rows of its tokens.

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace packsched::kernels::testing {

struct PackedForest {
  std::vector<int32_t> cu;                         // [pieces + 1]
  std::vector<int32_t> subtree_end;                // [rows]
  std::vector<int32_t> positions;                  // [rows]
  std::vector<std::vector<int64_t>> rollout_rows;  // rows of each rollout, in path order
};

// `trees` random trees of up to `max_nodes` nodes each, node lengths in [1, max_len]; every leaf
// is a rollout, and so is every inner node with probability 1/4.
inline PackedForest RandomForest(uint32_t seed, int trees, int max_nodes, int max_len) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  PackedForest f;
  f.cu.push_back(0);
  for (int tree = 0; tree < trees; ++tree) {
    const int n = uniform(1, max_nodes);
    std::vector<int> len(n), parent(n, -1);
    std::vector<std::vector<int>> children(n);
    for (int i = 0; i < n; ++i) {
      len[i] = uniform(1, max_len);
      if (i > 0) {
        parent[i] = uniform(0, i - 1);
        children[parent[i]].push_back(i);
      }
    }
    std::vector<int64_t> first(n);
    std::vector<int32_t> depth(n);
    std::function<void(int, int32_t)> visit = [&](int u, int32_t d) {
      first[u] = static_cast<int64_t>(f.subtree_end.size());
      depth[u] = d;
      for (int k = 0; k < len[u]; ++k) {
        f.positions.push_back(d + k);
        f.subtree_end.push_back(0);
      }
      for (int c : children[u]) visit(c, d + len[u]);
      for (int k = 0; k < len[u]; ++k) {
        f.subtree_end[first[u] + k] = static_cast<int32_t>(f.subtree_end.size());
      }
    };
    visit(0, 0);
    for (int u = 0; u < n; ++u) {
      if (!children[u].empty() && uniform(0, 3) != 0) continue;
      std::vector<int> path;
      for (int x = u; x >= 0; x = parent[x]) path.insert(path.begin(), x);
      std::vector<int64_t> rows;
      for (int x : path) {
        for (int k = 0; k < len[x]; ++k) rows.push_back(first[x] + k);
      }
      f.rollout_rows.push_back(rows);
    }
    f.cu.push_back(static_cast<int32_t>(f.subtree_end.size()));
  }
  return f;
}

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_TREE_FOREST_H_
