#ifndef PACKSCHED_TESTS_PLANNER_FOREST_FIXTURES_H_
#define PACKSCHED_TESTS_PLANNER_FOREST_FIXTURES_H_

// Forests the tree-packing tests share.

#include <cstdint>
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

}  // namespace packsched::planner::testing_forests

#endif  // PACKSCHED_TESTS_PLANNER_FOREST_FIXTURES_H_
