// Coordinator mode over a forest at W = 8: every rank holds a piece whenever there are at least
// W rollouts (trees split at rollout boundaries first), a split tree's pieces spread when that
// shortens the step, and the counts follow min_micro_batches and divisible_by.

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "server/planner/forest.h"
#include "server/planner/planner.h"
#include "server/planner/tree_plan.h"
#include "tests/planner/forest_fixtures.h"

namespace packsched::planner {
namespace {

using testing_forests::Groups;

constexpr int64_t kWorld = 8;

Forest Mix(int trees, int n, uint64_t seed) { return testing_forests::GrpoMix(trees, n, seed); }

PlanOptions Capped(int64_t cap) {
  PlanOptions o;
  o.max_token_len = cap;
  return o;
}

// Every rollout exactly once over the ranks, the same k on each; returns the ranks holding one.
int64_t CheckRanks(const Forest& f, const BalancedForest& batch) {
  std::vector<int> seen(f.rollout_leaf.size(), 0);
  int64_t held = 0;
  for (const TreePlan& rank : batch.ranks) {
    EXPECT_EQ(static_cast<int64_t>(rank.parts.size()), batch.num_micro_batches);
    int64_t rollouts = 0;
    for (const TreeMicroBatch& part : rank.parts) {
      for (int64_t r : part.layout.rollouts) ++seen[r];
      rollouts += static_cast<int64_t>(part.layout.rollouts.size());
    }
    held += rollouts > 0 ? 1 : 0;
  }
  for (size_t r = 0; r < seen.size(); ++r) EXPECT_EQ(seen[r], 1) << "rollout " << r;
  return held;
}

TEST(TreeBalance, EveryRankHoldsAPieceWithFewerTreesThanRanks) {
  for (int trees : {1, 3, 7}) {
    for (Sync sync : {Sync::kStep, Sync::kMicroBatch}) {
      // Trees that fit the cap whole: the plan still splits them for the ranks.
      const Forest f = Mix(trees, 8, 100 + trees);
      const absl::StatusOr<BalancedForest> batch =
          BalanceForest(f, kWorld, Capped(65536), {.sync = sync});
      ASSERT_TRUE(batch.ok()) << batch.status();
      EXPECT_EQ(CheckRanks(f, *batch), kWorld) << trees << " trees";
    }
  }
}

TEST(TreeBalance, SplitTreesSpreadWhenThatShortensTheStep) {
  // 3 groups of 16 over the 8,192 cap on 8 ranks: kept together, 5 ranks would hold nothing.
  const Forest f = Mix(3, 16, 7);
  const PlanOptions o = Capped(8192);
  const absl::StatusOr<BalancedForest> tree = BalanceForest(f, kWorld, o);
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(CheckRanks(f, *tree), kWorld);
  // Flat packing of the same rollouts forwards each prompt once per rollout: the tree plan's
  // busiest rank is no busier.
  const ForestIndex index = *IndexForest(f);
  const absl::StatusOr<BalancedBatch> flat = BalanceBatch(index.rollout_len, kWorld, o);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_LE(tree->step.step_sync_cost, flat->step.step_sync_cost);
}

TEST(TreeBalance, CountsFollowMinMicroBatchesAndDivisibleBy) {
  for (int trees : {1, 3, 7}) {
    PlanOptions o = Capped(8192);
    o.min_micro_batches = 3;
    o.divisible_by = 2;
    const Forest f = Mix(trees, 8, 200 + trees);
    const absl::StatusOr<BalancedForest> batch = BalanceForest(f, kWorld, o);
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_GE(batch->num_micro_batches, 3);
    EXPECT_EQ(batch->num_micro_batches % 2, 0);
    EXPECT_EQ(CheckRanks(f, *batch), kWorld);
  }
}

TEST(TreeBalance, FewerRolloutsThanRanksGiveTheOthersFiller) {
  // 3 rollouts on 8 ranks: each rollout its own piece on its own rank, the other 5 ranks only
  // empty micro-batches, each named filler; no micro-batch of a rank with a rollout is.
  const Forest f = Groups({100}, {{10, 20, 30}});
  const absl::StatusOr<BalancedForest> batch = BalanceForest(f, kWorld, Capped(1000));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(CheckRanks(f, *batch), 3);
  int64_t filler_ranks = 0;
  for (const TreePlan& rank : batch->ranks) {
    bool holds = false;
    for (const TreeMicroBatch& part : rank.parts) holds |= !part.layout.rollouts.empty();
    for (const TreeMicroBatch& part : rank.parts) {
      EXPECT_EQ(part.batch.filler, !holds);
      if (part.batch.filler) {
        EXPECT_TRUE(part.batch.empty);
      }
    }
    filler_ranks += holds ? 0 : 1;
  }
  EXPECT_EQ(filler_ranks, kWorld - 3);
  // With a rollout for every rank there is no filler.
  const Forest enough = Groups({100}, {{10, 20, 30, 40, 50, 60, 70, 80}});
  const absl::StatusOr<BalancedForest> full = BalanceForest(enough, kWorld, Capped(1000));
  ASSERT_TRUE(full.ok()) << full.status();
  for (const TreePlan& rank : full->ranks) {
    for (const TreeMicroBatch& part : rank.parts) EXPECT_FALSE(part.batch.filler);
  }
}

// 8 groups of 8,192 rollouts: the cut places 65,536 rollouts, about 4M steps, into about 500
// pieces, which BalanceBatch balances in well under 2^16 steps.
Forest Large() {
  std::vector<std::vector<int64_t>> completions(8);
  for (int g = 0; g < 8; ++g) {
    for (int i = 0; i < 8192; ++i) completions[g].push_back(100 + (i * 7919 + g) % 900);
  }
  return Groups({1000, 2000, 3000, 4000, 1000, 2000, 3000, 4000}, completions);
}

TEST(TreeBalance, TheCutAsksTheStopAllThroughIt) {
  const Forest f = Large();
  int64_t asks = 0;
  BalanceOptions counting;
  counting.stop = [&asks] {
    ++asks;
    return absl::OkStatus();
  };
  const absl::StatusOr<BalancedForest> batch = BalanceForest(f, kWorld, Capped(65536), counting);
  ASSERT_TRUE(batch.ok()) << batch.status();
  // One ask about every 2^16 steps of the cut: 65,536 rollouts at 64 steps each.
  EXPECT_GE(asks, 64);
}

TEST(TreeBalance, EndsWithTheFirstNonOkAnswer) {
  const Forest f = Large();
  for (int64_t at : {1, 3, 40}) {
    int64_t asks = 0;
    BalanceOptions stopping;
    stopping.stop = [&asks, at] {
      return ++asks < at ? absl::OkStatus() : absl::DeadlineExceededError("past the deadline");
    };
    const absl::StatusOr<BalancedForest> batch = BalanceForest(f, kWorld, Capped(65536), stopping);
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kDeadlineExceeded) << "at " << at;
    EXPECT_EQ(asks, at);
  }
}

}  // namespace
}  // namespace packsched::planner
