#ifndef PACKSCHED_TESTS_PLANNER_FOREST_FIXTURES_H_
#define PACKSCHED_TESTS_PLANNER_FOREST_FIXTURES_H_

// Forests the tree-packing tests share.

#include <cstdint>
#include <random>
#include <vector>

#include "server/planner/forest.h"

namespace packsched::planner::testing_forests {

// A GRPO-shaped forest: per group a prompt node and one completion node per rollout.
inline Forest Groups(const std::vector<int64_t>& prompts,
                     const std::vector<std::vector<int64_t>>& completions) {
  Forest f;
  for (size_t g = 0; g < prompts.size(); ++g) {
    const int64_t root = static_cast<int64_t>(f.node_len.size());
    f.node_len.push_back(prompts[g]);
    f.node_parent.push_back(-1);
    for (int64_t c : completions[g]) {
      f.node_len.push_back(c);
      f.node_parent.push_back(root);
      f.rollout_leaf.push_back(static_cast<int64_t>(f.node_len.size()) - 1);
    }
  }
  return f;
}

// `trees` GRPO groups of `n` rollouts: prompts of 1,000 to 3,000 tokens, completions of 200 to
// 1,500, drawn from `seed`.
inline Forest GrpoMix(int trees, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> prompts;
  std::vector<std::vector<int64_t>> completions;
  for (int t = 0; t < trees; ++t) {
    prompts.push_back(1000 + static_cast<int64_t>(rng() % 2001));
    completions.emplace_back();
    for (int i = 0; i < n; ++i) {
      completions.back().push_back(200 + static_cast<int64_t>(rng() % 1301));
    }
  }
  return Groups(prompts, completions);
}

}  // namespace packsched::planner::testing_forests

#endif  // PACKSCHED_TESTS_PLANNER_FOREST_FIXTURES_H_
