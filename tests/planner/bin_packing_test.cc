// Dataset packing (ffd, bfd, sequential) through the public PackDataset.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "tests/planner/plan_checks.h"
#include "tests/testing/lengths.h"

namespace packsched::planner {
namespace {

PlanOptions Packing(Algorithm algorithm, int64_t cap) {
  PlanOptions o;
  o.algorithm = algorithm;
  o.max_token_len = cap;
  o.order = PartOrder::kIndex;
  return o;
}

TEST(PackDataset, SanityExampleNeedsThreeBins) {
  const std::vector<int64_t> lengths = {3000, 8000, 2000, 5000, 1000, 7000};
  for (Algorithm a : {Algorithm::kFirstFitDecreasing, Algorithm::kBestFitDecreasing}) {
    const absl::StatusOr<MicroBatchPlan> plan = PackDataset(lengths, Packing(a, 10240));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->parts.size(), 3u) << Name(a);
    EXPECT_EQ(testing::CheckPlan(lengths, Packing(a, 10240), *plan, true), "");
  }
}

TEST(PackDataset, SequentialKeepsInputOrder) {
  const std::vector<int64_t> lengths = {6, 5, 4, 3, 9, 1};
  const absl::StatusOr<MicroBatchPlan> plan =
      PackDataset(lengths, Packing(Algorithm::kSequential, 10));
  ASSERT_TRUE(plan.ok());
  // 6 | 5,4 | 3 | 9,1: a new bin exactly when the next sequence does not fit.
  ASSERT_EQ(plan->parts.size(), 4u);
  EXPECT_EQ(plan->parts[0].indices, (std::vector<int64_t>{0}));
  EXPECT_EQ(plan->parts[1].indices, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(plan->parts[2].indices, (std::vector<int64_t>{3}));
  EXPECT_EQ(plan->parts[3].indices, (std::vector<int64_t>{4, 5}));
}

TEST(PackDataset, SequentialDropFiltersOverlongSequences) {
  PlanOptions o = Packing(Algorithm::kSequential, 10);
  o.overlong = OverlongPolicy::kDrop;
  const absl::StatusOr<MicroBatchPlan> plan = PackDataset({4, 11, 5, 30}, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dropped, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(plan->revert, (std::vector<int64_t>{0, -1, 1, -1}));
}

TEST(PackDataset, BinsRespectCapInBothModesOnRealisticInputs) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(400, seed);
    for (Algorithm a :
         {Algorithm::kFirstFitDecreasing, Algorithm::kBestFitDecreasing, Algorithm::kSequential}) {
      for (CapMode mode : {CapMode::kTokens, CapMode::kPadded}) {
        PlanOptions o = Packing(a, 40000);
        o.cap_mode = mode;
        o.max_seqs_per_micro_batch = seed % 2 == 0 ? 0 : 5;
        const absl::StatusOr<MicroBatchPlan> plan = PackDataset(lengths, o);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(testing::CheckPlan(lengths, o, *plan, true), "")
            << Name(a) << " " << Name(mode) << " seed " << seed;
        EXPECT_EQ(plan->stats.over_cap_parts, 0);
        if (mode == CapMode::kTokens && o.max_seqs_per_micro_batch == 0) {
          // Any two bins together hold more than the cap, so at most twice the volume bound.
          EXPECT_LE(static_cast<int64_t>(plan->parts.size()), 2 * plan->stats.lower_bound_k);
        }
      }
    }
  }
}

TEST(PackDataset, RejectsBalancingAlgorithms) {
  const absl::StatusOr<MicroBatchPlan> plan =
      PackDataset({1, 2}, Packing(Algorithm::kKarmarkarKarp, 8));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched::planner
