// The shape of a plan: metadata, part order, empty and overlong parts, alignment, cap modes.

#include <algorithm>
#include <cstdint>
#include <vector>

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

TEST(PlanShape, MetadataDescribesEachPartInIndexOrder) {
  PlanOptions o = Capped(64);
  o.align_to = 8;
  o.align_total_to = 32;
  const std::vector<int64_t> lengths = {5, 17, 9, 3};
  const absl::StatusOr<MicroBatchPlan> plan = PartitionFixedK(lengths, 1, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->parts.size(), 1u);
  const MicroBatch& part = plan->parts[0];
  EXPECT_EQ(part.indices, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(part.cu_seqlens, (std::vector<int32_t>{0, 5, 22, 31, 34}));
  EXPECT_EQ(part.cu_seqlens_aligned, (std::vector<int32_t>{0, 8, 32, 48, 56}));
  EXPECT_EQ(part.tokens, 34);
  EXPECT_EQ(part.aligned_tokens, 56);
  EXPECT_EQ(part.total, 64);
  EXPECT_EQ(part.max_seqlen, 17);
  EXPECT_EQ(part.max_seqlen_aligned, 24);
  EXPECT_EQ(part.padded_tokens, 4 * 24);
}

TEST(PlanShape, CapAppliesToTheTotalAfterAlignTotalTo) {
  PlanOptions o = Capped(100);
  o.align_total_to = 64;  // a part may hold at most 64 tokens: 100 rounds down to 64
  const std::vector<int64_t> lengths = {40, 40, 20, 20};
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches(lengths, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(testing::CheckPlan(lengths, o, *plan, true), "");
  for (const MicroBatch& part : plan->parts) EXPECT_LE(part.total, 64);
}

TEST(PlanShape, EmptyPartsWhenFewerSequencesThanK) {
  const absl::StatusOr<Problem> problem = Problem::Create({7, 3}, Capped(100));
  ASSERT_TRUE(problem.ok());
  const absl::StatusOr<MicroBatchPlan> plan = problem->Partition(5);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->parts.size(), 5u);
  EXPECT_EQ(std::count_if(plan->parts.begin(), plan->parts.end(),
                          [](const MicroBatch& p) { return p.empty; }),
            3);
  for (const MicroBatch& part : plan->parts) {
    if (part.empty) {
      EXPECT_EQ(part.total, 0);
      EXPECT_EQ(part.cu_seqlens, std::vector<int32_t>{0});
    }
  }
}

TEST(PlanShape, EmptyBatchGivesMinMicroBatchesEmptyParts) {
  PlanOptions o = Capped(100);
  o.min_micro_batches = 2;
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches({}, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->parts.size(), 2u);
  EXPECT_TRUE(plan->reorder.empty());
}

TEST(PlanShape, IsolatePutsOverlongSequencesAloneAndFlagged) {
  PlanOptions o = Capped(100);
  o.overlong = OverlongPolicy::kIsolate;
  const std::vector<int64_t> lengths = {30, 150, 40, 500, 20};
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches(lengths, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(testing::CheckPlan(lengths, o, *plan, true), "");
  std::vector<int64_t> overlong;
  for (const MicroBatch& part : plan->parts) {
    if (part.overlong) overlong.push_back(part.indices[0]);
  }
  std::sort(overlong.begin(), overlong.end());
  EXPECT_EQ(overlong, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(plan->stats.over_cap_parts, 2);
  EXPECT_EQ(plan->parts.size(), 3u);  // 30 + 40 + 20 fit one part
}

TEST(PlanShape, DropLeavesOverlongSequencesOut) {
  PlanOptions o = Capped(100);
  o.overlong = OverlongPolicy::kDrop;
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches({30, 150, 40}, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dropped, std::vector<int64_t>{1});
  EXPECT_EQ(plan->revert[1], -1);
  EXPECT_EQ(plan->stats.num_kept, 2);
  EXPECT_EQ(plan->stats.total_tokens, 70);
}

TEST(PlanShape, ProblemKnowsItsDroppedSequencesBeforePartitioning) {
  PlanOptions o = Capped(100);
  o.overlong = OverlongPolicy::kDrop;
  const absl::StatusOr<Problem> problem = Problem::Create({150, 30, 101, 40, 100}, o);
  ASSERT_TRUE(problem.ok()) << problem.status();
  EXPECT_EQ(problem->dropped(), (std::vector<int64_t>{0, 2}));
  const absl::StatusOr<MicroBatchPlan> plan = problem->Partition(problem->local_k() + 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dropped, problem->dropped());
}

TEST(PlanShape, OrdersArrangePartsAsDocumented) {
  const std::vector<int64_t> lengths = packsched::testing::UniformLengths(60, 1, 900, 5);
  PlanOptions o = Capped(1000);
  o.order = PartOrder::kCostDesc;
  const absl::StatusOr<MicroBatchPlan> desc = PartitionFixedK(lengths, 40, o);
  ASSERT_TRUE(desc.ok());
  for (size_t p = 1; p < desc->parts.size(); ++p) {
    EXPECT_GE(desc->parts[p - 1].cost, desc->parts[p].cost);
  }
  o.order = PartOrder::kIndex;
  const absl::StatusOr<MicroBatchPlan> by_index = PartitionFixedK(lengths, 40, o);
  ASSERT_TRUE(by_index.ok());
  for (size_t p = 1; p < by_index->parts.size(); ++p) {
    const MicroBatch& a = by_index->parts[p - 1];
    const MicroBatch& b = by_index->parts[p];
    EXPECT_TRUE(b.empty || (!a.empty && a.indices[0] < b.indices[0]));
  }
  o.order = PartOrder::kInterleave;
  const absl::StatusOr<MicroBatchPlan> inter = PartitionFixedK(lengths, 40, o);
  ASSERT_TRUE(inter.ok());
  // Costs rise to a peak and fall again: small at both ends, large in the middle.
  const auto& parts = inter->parts;
  const size_t peak =
      std::max_element(parts.begin(), parts.end(),
                       [](const MicroBatch& a, const MicroBatch& b) { return a.cost < b.cost; }) -
      parts.begin();
  for (size_t p = 1; p <= peak; ++p) EXPECT_LE(parts[p - 1].cost, parts[p].cost);
  for (size_t p = peak + 1; p < parts.size(); ++p) EXPECT_GE(parts[p - 1].cost, parts[p].cost);
  EXPECT_GT(peak, 0u);
  EXPECT_LT(peak, parts.size() - 1);
}

TEST(PlanShape, PaddedCapModeBoundsCountTimesLongest) {
  PlanOptions o = Capped(1000);
  o.cap_mode = CapMode::kPadded;
  const std::vector<int64_t> lengths = {400, 100, 100, 100, 90, 300};
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches(lengths, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(testing::CheckPlan(lengths, o, *plan, true), "");
  for (const MicroBatch& part : plan->parts) EXPECT_LE(part.padded_tokens, 1000);
}

TEST(PlanShape, MaxSeqsPerMicroBatchRaisesTheCount) {
  PlanOptions o = Capped(1'000'000);
  o.max_seqs_per_micro_batch = 3;
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches({1, 1, 1, 1, 1, 1, 1}, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->parts.size(), 3u);
  for (const MicroBatch& part : plan->parts) EXPECT_LE(part.indices.size(), 3u);
}

TEST(PlanShape, EqualSizeGivesEveryPartTheSameCount) {
  PlanOptions o;
  o.equal_size = true;
  const std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(96, 2);
  const absl::StatusOr<MicroBatchPlan> plan = PartitionFixedK(lengths, 8, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->parts.size(), 8u);
  for (const MicroBatch& part : plan->parts) EXPECT_EQ(part.indices.size(), 12u);
  EXPECT_EQ(testing::CheckPlan(lengths, o, *plan, false), "");
  EXPECT_LT(plan->stats.imbalance, 1.2);
}

TEST(PlanShape, StatsReportPaddingSavedAgainstANaiveBatch) {
  const std::vector<int64_t> lengths = {10, 100, 30};
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches(lengths, Capped(200));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stats.naive_padded_tokens, 3 * 100);
  EXPECT_EQ(plan->stats.packed_tokens, 140);
  EXPECT_EQ(plan->stats.lower_bound_k, 1);
  EXPECT_EQ(plan->stats.local_k, 1);
}

TEST(PlanShape, RealisticBatchesReachTheVolumeBoundOrCloseToIt) {
  // k_local is usually ceil(total / cap): within 1% (+1) of it on realistic RL batches.
  for (uint64_t seed = 0; seed < 10; ++seed) {
    PlanOptions o = Capped(32768);
    const std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(2048, seed);
    const absl::StatusOr<Problem> problem = Problem::Create(lengths, o);
    ASSERT_TRUE(problem.ok());
    EXPECT_LE(problem->local_k(), problem->lower_bound_k() + problem->lower_bound_k() / 100 + 1)
        << "seed " << seed;
  }
}

}  // namespace
}  // namespace packsched::planner
