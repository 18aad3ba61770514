// BalanceForest with group_ids (one per rollout): each tree is cut at its rollouts' groups, a
// group's rollouts stay on one rank, every micro-batch keeps the cap, a group too large for one
// rank is refused by name, and at W = 8 every rank holds a rollout when there are 8 groups.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "server/planner/forest.h"
#include "server/planner/stop_check.h"
#include "server/planner/tree_plan.h"
#include "tests/planner/forest_fixtures.h"

namespace packsched::planner {
namespace {

constexpr int64_t kWorld = 8;

// `trees` GRPO trees of `n` rollouts: prompts of 1,000 to 3,000 tokens, completions of 200 to
// 1,500, with a third level (a second turn of 100 to 600 tokens) under every other completion.
Forest Mix(int trees, int n, uint64_t seed) {
  Forest f = testing_forests::GrpoMix(trees, n, seed);
  std::mt19937_64 rng(seed + 1);
  const size_t leaves = f.rollout_leaf.size();
  for (size_t r = 0; r < leaves; r += 2) {
    f.node_len.push_back(100 + static_cast<int64_t>(rng() % 501));
    f.node_parent.push_back(f.rollout_leaf[r]);
    f.rollout_leaf.push_back(static_cast<int64_t>(f.node_len.size()) - 1);
  }
  return f;
}

// Tokens of the union of `rollouts`' root paths in `f`: each node once.
int64_t UnionTokens(const Forest& f, const std::vector<int64_t>& rollouts) {
  std::set<int64_t> nodes;
  for (int64_t r : rollouts) {
    for (int64_t n = f.rollout_leaf[r]; n >= 0 && nodes.insert(n).second; n = f.node_parent[n]) {
    }
  }
  int64_t tokens = 0;
  for (int64_t n : nodes) tokens += f.node_len[n];
  return tokens;
}

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Checks `batch` against the contract, from the forest and the layouts alone: every rollout on
// exactly one rank, every group on one rank, no piece with rollouts of two groups, every
// micro-batch's aligned piece tokens within the cap. Returns the ranks holding a rollout.
int64_t CheckGroups(const Forest& f, const std::vector<int64_t>& group_ids,
                    const BalancedForest& batch, const PlanOptions& o) {
  std::vector<int> seen(f.rollout_leaf.size(), 0);
  std::map<int64_t, int64_t> rank_of_group;
  int64_t held = 0;
  for (size_t rank = 0; rank < batch.ranks.size(); ++rank) {
    const TreePlan& plan = batch.ranks[rank];
    EXPECT_EQ(static_cast<int64_t>(plan.parts.size()), batch.num_micro_batches);
    bool holds = false;
    for (const TreeMicroBatch& part : plan.parts) {
      const TreeLayout& layout = part.layout;
      int64_t aligned = 0;
      for (size_t b = 0; b + 1 < layout.piece_rollout_begin.size(); ++b) {
        const std::vector<int64_t> rollouts(
            layout.piece_rollouts.begin() + layout.piece_rollout_begin[b],
            layout.piece_rollouts.begin() + layout.piece_rollout_begin[b + 1]);
        for (int64_t r : rollouts) {
          EXPECT_EQ(group_ids[r], group_ids[rollouts[0]]) << "a piece holds two groups";
        }
        aligned += RoundUp(UnionTokens(f, rollouts), o.align_to);
      }
      EXPECT_LE(aligned, o.max_token_len) << "rank " << rank << ": a micro-batch over the cap";
      for (int64_t r : layout.rollouts) {
        ++seen[r];
        holds = true;
        const auto [it, inserted] = rank_of_group.emplace(group_ids[r], rank);
        EXPECT_EQ(it->second, static_cast<int64_t>(rank))
            << "group " << group_ids[r] << " on ranks " << it->second << " and " << rank;
      }
    }
    held += holds ? 1 : 0;
  }
  for (size_t r = 0; r < seen.size(); ++r) EXPECT_EQ(seen[r], 1) << "rollout " << r;
  return held;
}

PlanOptions Capped(int64_t cap) {
  PlanOptions o;
  o.max_token_len = cap;
  o.align_to = 8;
  return o;
}

TEST(TreeGroups, AGroupStaysOnOneRankAndTheCapHolds) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 rng(seed);
    const int trees = 1 + static_cast<int>(seed % 5);
    const Forest f = Mix(trees, 6 + static_cast<int>(seed % 7), seed);
    // Groups across trees and within them: 2 to 13 labels, any int64 values.
    const int64_t labels = 2 + static_cast<int64_t>(rng() % 12);
    std::vector<int64_t> group_ids;
    for (size_t r = 0; r < f.rollout_leaf.size(); ++r) {
      group_ids.push_back(1'000'003 * static_cast<int64_t>(rng() % labels) - 77);
    }
    for (Sync sync : {Sync::kStep, Sync::kMicroBatch}) {
      const PlanOptions o = Capped(seed % 2 ? 8192 : 6000);
      const absl::StatusOr<BalancedForest> batch =
          BalanceForest(f, kWorld, o, {.sync = sync}, group_ids);
      ASSERT_TRUE(batch.ok()) << batch.status();
      CheckGroups(f, group_ids, *batch, o);
    }
  }
}

TEST(TreeGroups, ASharedPrefixIsForwardedOncePerGroup) {
  // Under a cap no group's part of a tree passes: one piece per (tree, group).
  const Forest f = Mix(3, 8, 5);
  std::vector<int64_t> group_ids;
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> members;  // (tree, group)
  for (size_t r = 0; r < f.rollout_leaf.size(); ++r) {
    group_ids.push_back(static_cast<int64_t>(r % 3));
    int64_t root = f.rollout_leaf[r];
    while (f.node_parent[root] >= 0) root = f.node_parent[root];
    members[{root, group_ids.back()}].push_back(static_cast<int64_t>(r));
  }
  int64_t expected = 0;
  for (const auto& [key, rollouts] : members) expected += UnionTokens(f, rollouts);
  const absl::StatusOr<BalancedForest> batch = BalanceForest(f, 4, Capped(65536), {}, group_ids);
  ASSERT_TRUE(batch.ok()) << batch.status();
  int64_t forwarded = 0;
  for (const TreePlan& rank : batch->ranks) forwarded += rank.forwarded_tokens;
  EXPECT_EQ(forwarded, expected);
  EXPECT_EQ(CheckGroups(f, group_ids, *batch, Capped(65536)), 3);  // 3 groups, 3 ranks
}

TEST(TreeGroups, EveryRankHoldsARolloutWhereTheGroupsAllowIt) {
  for (int trees : {1, 3, 7}) {
    // 17 rollouts per tree, in groups of 2 or 4: min(W, groups) ranks hold a rollout.
    const Forest f = Mix(trees, 11, 40 + trees);
    for (int64_t per_group : {2, 4}) {
      std::vector<int64_t> group_ids;
      for (size_t r = 0; r < f.rollout_leaf.size(); ++r) {
        group_ids.push_back(static_cast<int64_t>(r) / per_group);
      }
      const int64_t groups = group_ids.back() + 1;
      for (Sync sync : {Sync::kStep, Sync::kMicroBatch}) {
        const PlanOptions o = Capped(16384);
        const absl::StatusOr<BalancedForest> batch =
            BalanceForest(f, kWorld, o, {.sync = sync}, group_ids);
        ASSERT_TRUE(batch.ok()) << batch.status();
        EXPECT_EQ(CheckGroups(f, group_ids, *batch, o), std::min(kWorld, groups))
            << trees << " trees, groups of " << per_group;
        for (const TreePlan& rank : batch->ranks) {
          const bool empty = std::all_of(rank.rollout_part.begin(), rank.rollout_part.end(),
                                         [](int64_t p) { return p < 0; });
          for (const TreeMicroBatch& part : rank.parts) EXPECT_EQ(part.batch.filler, empty);
        }
      }
    }
  }
}

TEST(TreeGroups, AGroupTooLargeForOneRankIsNamed) {
  const Forest f = Mix(2, 16, 9);  // 48 rollouts, about 40,000 unique tokens
  std::vector<int64_t> group_ids(f.rollout_leaf.size(), 5);
  std::vector<int64_t> large;
  for (size_t r = 0; r < f.rollout_leaf.size(); ++r) {
    if (r < 8) {
      group_ids[r] = 42;  // small
    } else {
      large.push_back(static_cast<int64_t>(r));
    }
  }
  PlanOptions o = Capped(8192);
  const absl::StatusOr<BalancedForest> fits = BalanceForest(f, kWorld, o, {}, group_ids);
  ASSERT_TRUE(fits.ok()) << fits.status();
  // Group 5's rank needs at least its unique tokens / the cap micro-batches: W times that is
  // over a ceiling one below it.
  const int64_t least = (UnionTokens(f, large) + o.max_token_len - 1) / o.max_token_len;
  ASSERT_GT(least, 2);
  o.max_micro_batches = kWorld * least - 1;
  const absl::StatusOr<BalancedForest> refused = BalanceForest(f, kWorld, o, {}, group_ids);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("group_ids: group 5 ("), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("max_micro_batches"), std::string::npos);
}

TEST(TreeGroups, GroupIdsOfTheWrongSizeAreRefused) {
  const Forest f = Mix(1, 4, 3);
  const std::vector<int64_t> group_ids = {1, 2};
  const absl::StatusOr<BalancedForest> batch = BalanceForest(f, 2, Capped(65536), {}, group_ids);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(batch.status().message().find("group_ids has 2 entries for 6 rollouts"),
            std::string::npos)
      << batch.status();
}

TEST(TreeGroups, SplitByGroupKeepsEveryRolloutsPath) {
  const Forest f = Mix(2, 5, 11);
  std::vector<int64_t> group_ids;
  for (size_t r = 0; r < f.rollout_leaf.size(); ++r) group_ids.push_back(r % 2 ? -3 : 7);
  const absl::StatusOr<ForestIndex> index = IndexForest(f);
  ASSERT_TRUE(index.ok());
  const absl::StatusOr<Forest> grouped = SplitByGroup(f, *index, group_ids);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  const Forest& split = *grouped;
  const absl::StatusOr<ForestIndex> split_index = IndexForest(split);  // checks rollout_len
  ASSERT_TRUE(split_index.ok()) << split_index.status();
  EXPECT_EQ(split_index->roots.size(), 4u);  // 2 trees x 2 groups
  for (size_t r = 0; r < f.rollout_leaf.size(); ++r) {
    // The same node lengths along the path, root first.
    std::vector<int64_t> a, b;
    for (int64_t n = f.rollout_leaf[r]; n >= 0; n = f.node_parent[n]) a.push_back(f.node_len[n]);
    for (int64_t n = split.rollout_leaf[r]; n >= 0; n = split.node_parent[n]) {
      b.push_back(split.node_len[n]);
    }
    EXPECT_EQ(a, b) << "rollout " << r;
  }
}

// A chain shared by every group is copied once per group: the copying asks the caller's stop,
// and its answer ends the cut.
TEST(TreeGroups, SplitByGroupAsksTheStop) {
  Forest f;
  constexpr int64_t kChain = 20000;
  for (int64_t n = 0; n < kChain; ++n) {
    f.node_len.push_back(1);
    f.node_parent.push_back(n - 1);
  }
  std::vector<int64_t> group_ids;
  for (int64_t g = 0; g < 8; ++g) {
    f.node_len.push_back(1);
    f.node_parent.push_back(kChain - 1);
    f.rollout_leaf.push_back(static_cast<int64_t>(f.node_len.size()) - 1);
    group_ids.push_back(g);
  }
  const absl::StatusOr<ForestIndex> index = IndexForest(f);
  ASSERT_TRUE(index.ok()) << index.status();
  int asked = 0;
  const std::function<absl::Status()> deadline = [&asked] {
    ++asked;
    return absl::DeadlineExceededError("the caller's deadline");
  };
  internal::StopCheck stop(deadline);
  const absl::StatusOr<Forest> stopped = SplitByGroup(f, *index, group_ids, &stop);
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kDeadlineExceeded) << stopped.status();
  EXPECT_EQ(asked, 1);
  const std::function<absl::Status()> never = [] { return absl::OkStatus(); };
  internal::StopCheck go_on(never);
  const absl::StatusOr<Forest> whole = SplitByGroup(f, *index, group_ids, &go_on);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(static_cast<int64_t>(whole->node_len.size()), 8 * (kChain + 1));
}

}  // namespace
}  // namespace packsched::planner
