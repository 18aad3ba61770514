// The cut of a tree over the cap: the fewest tokens any cut into pieces of whole rollouts
// forwards, on every tree of up to 16 rollouts, against a brute force over every partition of
// the rollouts and against groups built with a known perfect packing.

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/forest.h"
#include "server/planner/tree_plan.h"
#include "tests/planner/forest_fixtures.h"

namespace packsched::planner {
namespace {

using testing_forests::Groups;

PlanOptions Capped(int64_t cap) {
  PlanOptions o;
  o.max_token_len = cap;
  return o;
}

// The fewest tokens over every partition of the forest's rollouts (one tree, each rollout
// within `cap`) into pieces within `cap`, a piece forwarding every node on its rollouts'
// paths once: each rollout in turn joins an earlier piece or starts one.
class BruteForce {
 public:
  BruteForce(const Forest& f, int64_t cap) : f_(f), cap_(cap) {}

  int64_t Fewest() {
    best_ = INT64_MAX;
    pieces_.clear();
    Place(0);
    return best_;
  }

 private:
  int64_t Tokens(const std::vector<int64_t>& rollouts) const {
    std::set<int64_t> nodes;
    for (int64_t r : rollouts) {
      for (int64_t n = f_.rollout_leaf[r]; n >= 0; n = f_.node_parent[n]) nodes.insert(n);
    }
    int64_t tokens = 0;
    for (int64_t n : nodes) tokens += f_.node_len[n];
    return tokens;
  }

  void Place(size_t r) {
    if (r == f_.rollout_leaf.size()) {
      int64_t total = 0;
      for (const std::vector<int64_t>& piece : pieces_) total += Tokens(piece);
      best_ = std::min(best_, total);
      return;
    }
    for (size_t p = 0; p <= pieces_.size(); ++p) {
      if (p == pieces_.size()) pieces_.emplace_back();
      pieces_[p].push_back(static_cast<int64_t>(r));
      if (Tokens(pieces_[p]) <= cap_) Place(r + 1);
      pieces_[p].pop_back();
      if (pieces_[p].empty()) pieces_.pop_back();
    }
  }

  const Forest& f_;
  const int64_t cap_;
  int64_t best_ = 0;
  std::vector<std::vector<int64_t>> pieces_;
};

// One random tree of `rollouts` rollouts: each new node hangs under a random earlier one, and
// a rollout ends at every leaf and at some inner nodes.
Forest RandomTree(std::mt19937_64& rng, int rollouts, int64_t max_len) {
  std::uniform_int_distribution<int64_t> len(1, max_len);
  Forest f;
  f.node_len.push_back(len(rng));
  f.node_parent.push_back(-1);
  std::vector<bool> inner = {false};
  while (true) {
    int64_t leaves = 0;
    for (bool i : inner) leaves += i ? 0 : 1;
    if (leaves >= rollouts) break;
    const int64_t parent = static_cast<int64_t>(rng() % f.node_len.size());
    f.node_len.push_back(len(rng));
    f.node_parent.push_back(parent);
    inner[parent] = true;
    inner.push_back(false);
  }
  for (size_t n = 0; n < inner.size(); ++n) {
    if (!inner[n]) f.rollout_leaf.push_back(static_cast<int64_t>(n));
  }
  while (static_cast<int>(f.rollout_leaf.size()) < rollouts) {
    f.rollout_leaf.push_back(static_cast<int64_t>(rng() % f.node_len.size()));
  }
  std::shuffle(f.rollout_leaf.begin(), f.rollout_leaf.end(), rng);
  return f;
}

TEST(TreeCut, GroupOfSevenIsCutIntoTwoPieces) {
  // 4,849 + 6,429 completion tokens at a cap of 8,192: the room of 3,343 beside the prompt
  // takes the completions in two pieces (1,481 + 947 + 905 = 3,333 and 1,099 + 214 + 942 +
  // 841 = 3,096), 2 x 4,849 + 6,429 = 16,127 tokens. First fit decreasing needs three.
  const Forest f = Groups({4849}, {{1099, 947, 214, 1481, 942, 905, 841}});
  const absl::StatusOr<TreePlan> plan = PlanForest(f, Capped(8192));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->forwarded_tokens, 16127);
  EXPECT_EQ(plan->forwarded_tokens, BruteForce(f, 8192).Fewest());
  const absl::StatusOr<TreeProblem> problem = TreeProblem::Create(f, Capped(8192));
  ASSERT_TRUE(problem.ok());
  EXPECT_EQ(problem->pieces().size(), 2u);
}

TEST(TreeCut, RandomTreesAreCutAtTheFewestTokens) {
  std::mt19937_64 rng(23);
  int split = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int rollouts = 2 + trial % 8;  // up to 9: Bell(9) = 21,147 partitions
    const Forest f = trial % 3 == 0 ? Groups({1 + static_cast<int64_t>(rng() % 500)}, {[&] {
                                               std::vector<int64_t> c(rollouts);
                                               for (int64_t& x : c)
                                                 x = 1 + static_cast<int64_t>(rng() % 400);
                                               return c;
                                             }()})
                                    : RandomTree(rng, rollouts, 300);
    const ForestIndex index = *IndexForest(f);
    const int64_t longest = *std::max_element(index.rollout_len.begin(), index.rollout_len.end());
    const int64_t cap = longest + static_cast<int64_t>(rng() % (index.unique_tokens - longest + 1));
    const absl::StatusOr<TreePlan> plan = PlanForest(f, Capped(cap));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->forwarded_tokens, BruteForce(f, cap).Fewest())
        << "trial " << trial << ", cap " << cap;
    split += plan->forwarded_tokens > index.unique_tokens ? 1 : 0;
  }
  EXPECT_GT(split, 150);  // most trials cut their tree
}

TEST(TreeCut, GroupsOfSixteenReachTheirPerfectPacking) {
  // Each group: k pieces' room beside the prompt cut into 16 completions at random, so k
  // pieces hold them exactly and no cut forwards fewer than k prompts.
  std::mt19937_64 rng(5);
  int reached = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t prompt = 500 + static_cast<int64_t>(rng() % 3000);
    const int64_t room = 2000 + static_cast<int64_t>(rng() % 3000);
    const int k = 3 + trial % 3;
    std::vector<int64_t> completions;
    for (int b = 0; b < k; ++b) {
      const int parts = b < 16 % k ? 16 / k + 1 : 16 / k;
      std::set<int64_t> cuts;
      while (static_cast<int>(cuts.size()) < parts - 1) {
        cuts.insert(1 + static_cast<int64_t>(rng() % (room - 1)));
      }
      int64_t at = 0;
      for (int64_t c : cuts) {
        completions.push_back(c - at);
        at = c;
      }
      completions.push_back(room - at);
    }
    std::shuffle(completions.begin(), completions.end(), rng);
    ASSERT_EQ(completions.size(), 16u);
    const Forest f = Groups({prompt}, {completions});
    const absl::StatusOr<TreePlan> plan = PlanForest(f, Capped(prompt + room));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->forwarded_tokens, k * prompt + k * room) << "trial " << trial;
    reached += plan->forwarded_tokens == k * prompt + k * room ? 1 : 0;
  }
  EXPECT_EQ(reached, 40);
}

}  // namespace
}  // namespace packsched::planner
