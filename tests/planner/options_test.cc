#include "server/planner/options.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packsched::planner {
namespace {

TEST(OptionNames, EveryEnumRoundTripsThroughItsName) {
  for (Algorithm a : {Algorithm::kKarmarkarKarp, Algorithm::kLpt, Algorithm::kFirstFitDecreasing,
                      Algorithm::kBestFitDecreasing, Algorithm::kSequential}) {
    EXPECT_EQ(*ParseAlgorithm(Name(a)), a);
  }
  for (CapMode m : {CapMode::kTokens, CapMode::kPadded}) EXPECT_EQ(*ParseCapMode(Name(m)), m);
  for (CostModel c : {CostModel::kTokens, CostModel::kAttention}) {
    EXPECT_EQ(*ParseCostModel(Name(c)), c);
  }
  for (OverlongPolicy p :
       {OverlongPolicy::kReject, OverlongPolicy::kIsolate, OverlongPolicy::kDrop}) {
    EXPECT_EQ(*ParseOverlongPolicy(Name(p)), p);
  }
  for (PartOrder o : {PartOrder::kCostDesc, PartOrder::kIndex, PartOrder::kInterleave}) {
    EXPECT_EQ(*ParsePartOrder(Name(o)), o);
  }
}

TEST(OptionNames, UnknownNameListsTheAcceptedOnes) {
  const absl::StatusOr<Algorithm> bad = ParseAlgorithm("greedy");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("'greedy' is not one of kk, lpt, ffd, bfd, sequential"));
}

TEST(OptionDefaults, AreTheDocumentedOnes) {
  const PlanOptions o;
  EXPECT_EQ(o.max_micro_batches, 1'000'000);
  EXPECT_EQ(o.algorithm, Algorithm::kKarmarkarKarp);
  EXPECT_EQ(o.cap_mode, CapMode::kTokens);
  EXPECT_EQ(o.overlong, OverlongPolicy::kReject);
  EXPECT_EQ(o.order, PartOrder::kCostDesc);
  EXPECT_EQ(o.min_micro_batches, 1);
  EXPECT_EQ(o.divisible_by, 1);
}

}  // namespace
}  // namespace packsched::planner
