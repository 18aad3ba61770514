// Coordinator mode: the global batch balanced over DP ranks, one common micro-batch count.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "tests/planner/plan_checks.h"
#include "tests/testing/lengths.h"

namespace packsched::planner {
namespace {

PlanOptions Capped(int64_t cap) {
  PlanOptions o;
  o.max_token_len = cap;
  return o;
}

// Every kept global index on exactly one rank; per-rank plans valid over the rank's lengths.
void ExpectValid(const std::vector<int64_t>& lengths, const PlanOptions& o,
                 const BalancedBatch& batch) {
  std::vector<int> seen(lengths.size(), 0);
  for (const RankBatch& rank : batch.ranks) {
    std::vector<int64_t> local;
    int64_t cost = 0;
    for (int64_t index : rank.indices) {
      ++seen[index];
      local.push_back(lengths[index]);
      cost += testing::CostOf(lengths[index], o);
    }
    EXPECT_TRUE(std::is_sorted(rank.indices.begin(), rank.indices.end()));
    EXPECT_EQ(rank.cost, cost);
    EXPECT_EQ(static_cast<int64_t>(rank.plan.parts.size()), batch.num_micro_batches);
    EXPECT_EQ(testing::CheckPlan(local, o, rank.plan, true), "");
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    const bool dropped =
        std::binary_search(batch.dropped.begin(), batch.dropped.end(), static_cast<int64_t>(i));
    EXPECT_EQ(seen[i], dropped ? 0 : 1) << "index " << i;
  }
}

TEST(BalanceBatch, EqualCountsBalancedCostOneK) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(1000 + seed, seed);
    const PlanOptions o = Capped(20000);
    const absl::StatusOr<BalancedBatch> batch = BalanceBatch(lengths, 8, o);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ExpectValid(lengths, o, *batch);
    int64_t fewest = INT64_MAX, most = 0, cheapest = INT64_MAX, dearest = 0;
    for (const RankBatch& rank : batch->ranks) {
      fewest = std::min<int64_t>(fewest, rank.indices.size());
      most = std::max<int64_t>(most, rank.indices.size());
      cheapest = std::min(cheapest, rank.cost);
      dearest = std::max(dearest, rank.cost);
    }
    EXPECT_LE(most - fewest, 1) << "seed " << seed;
    EXPECT_LT(static_cast<double>(dearest) / static_cast<double>(cheapest), 1.01)
        << "seed " << seed;
  }
}

TEST(BalanceBatch, CommonKIsTheLargestRankBound) {
  const std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(333, 4);
  const PlanOptions o = Capped(16384 + 2048);
  const absl::StatusOr<BalancedBatch> batch = BalanceBatch(lengths, 4, o);
  ASSERT_TRUE(batch.ok());
  int64_t k = 0;
  for (const RankBatch& rank : batch->ranks) {
    std::vector<int64_t> local;
    for (int64_t index : rank.indices) local.push_back(lengths[index]);
    k = std::max(k, Problem::Create(local, o)->local_k());
  }
  EXPECT_EQ(batch->num_micro_batches, k);
}

TEST(BalanceBatch, GroupsStayOnOneRank) {
  // GRPO-style: 64 prompts x 8 responses, groups interleaved in the input.
  const std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(512, 9);
  std::vector<int64_t> groups(512);
  for (int64_t i = 0; i < 512; ++i) groups[i] = (i * 37) % 64;
  const PlanOptions o = Capped(20000);
  const absl::StatusOr<BalancedBatch> batch = BalanceBatch(lengths, 8, o, groups);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ExpectValid(lengths, o, *batch);
  absl::flat_hash_map<int64_t, size_t> rank_of_group;
  for (size_t r = 0; r < batch->ranks.size(); ++r) {
    EXPECT_LE(batch->ranks[r].indices.size(), 64u + 7u);
    for (int64_t index : batch->ranks[r].indices) {
      auto [it, inserted] = rank_of_group.emplace(groups[index], r);
      EXPECT_EQ(it->second, r) << "group " << groups[index] << " split";
    }
  }
}

TEST(BalanceBatch, FewerSequencesThanRanksLeavesEmptyRanks) {
  const absl::StatusOr<BalancedBatch> batch = BalanceBatch({100, 200}, 4, Capped(1000));
  ASSERT_TRUE(batch.ok());
  int empty = 0;
  for (const RankBatch& rank : batch->ranks) {
    empty += rank.indices.empty();
    EXPECT_EQ(rank.plan.parts.size(), 1u);
  }
  EXPECT_EQ(empty, 2);
}

TEST(BalanceBatch, DroppedSequencesAreReportedGlobally) {
  PlanOptions o = Capped(100);
  o.overlong = OverlongPolicy::kDrop;
  const absl::StatusOr<BalancedBatch> batch = BalanceBatch({10, 500, 20, 30}, 2, o);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->dropped, std::vector<int64_t>{1});
  ExpectValid({10, 500, 20, 30}, o, *batch);
}

TEST(BalanceBatch, RejectsBadWorldSizeAndGroupIds) {
  EXPECT_EQ(BalanceBatch({1}, 0, Capped(10)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalanceBatch({1, 2}, 2, Capped(10), std::vector<int64_t>{1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalanceBatch({0}, 1, Capped(10)).status().code(), absl::StatusCode::kInvalidArgument);
}

// One group of many one-cap sequences makes k = n on its rank and gives every other rank k
// (empty) micro-batches too: world_size x k is bounded by max_micro_batches before any of them
// is allocated (the reviewer's 2,000 x 2,000 = 4,000,000 micro-batches from a 4 KB request).
TEST(BalanceBatch, WorldSizeTimesKAboveMaxMicroBatchesIsInvalidArgument) {
  const std::vector<int64_t> lengths(200, 10);
  const std::vector<int64_t> one_group(lengths.size(), 7);
  PlanOptions o = Capped(10);
  o.max_micro_batches = 200 * 200 - 1;
  const absl::StatusOr<BalancedBatch> over = BalanceBatch(lengths, 200, o, one_group);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(over.status().message()),
              ::testing::AllOf(::testing::HasSubstr("world_size = 200 x k = 200 = 40000"),
                               ::testing::HasSubstr("more than max_micro_batches = 39999")));

  // min_micro_batches alone already exceeds it: refused before any rank's problem is made.
  PlanOptions many = Capped(10);
  many.max_micro_batches = 1000;
  many.min_micro_batches = 10;
  EXPECT_THAT(std::string(BalanceBatch({5}, 101, many).status().message()),
              ::testing::HasSubstr("world_size = 101 x k = 10 = 1010"));

  o.max_micro_batches = 200 * 200;  // exactly at the limit: allowed
  const absl::StatusOr<BalancedBatch> at = BalanceBatch(lengths, 200, o, one_group);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->num_micro_batches, 200);
  ExpectValid(lengths, o, *at);
}

}  // namespace
}  // namespace packsched::planner
