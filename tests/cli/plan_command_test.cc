// RunPlan: which entry point a request reaches, and the requests it refuses.

#include "server/cli/plan_command.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packsched::cli {
namespace {

using planner::Algorithm;
using ::testing::HasSubstr;

const std::vector<int64_t> kLengths = {3000, 8000, 2000, 5000, 1000, 7000};

TEST(RunPlanTest, PackingAlgorithmsGoToPackDataset) {
  for (Algorithm a : {Algorithm::kFirstFitDecreasing, Algorithm::kBestFitDecreasing}) {
    PlanRequest request;
    request.options.algorithm = a;
    request.options.max_token_len = 10240;
    absl::StatusOr<PlanRun> run = RunPlan(kLengths, request);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_STREQ(run->mode, "pack");
    EXPECT_EQ(run->plan.parts.size(), 3u);
  }
}

TEST(RunPlanTest, BalancingGoesToPlanMicroBatchesAndFixedKToPartitionFixedK) {
  PlanRequest request;
  request.options.max_token_len = 10240;
  absl::StatusOr<PlanRun> run = RunPlan(kLengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_STREQ(run->mode, "balance");
  EXPECT_EQ(static_cast<int64_t>(run->plan.parts.size()), run->plan.stats.local_k);
  EXPECT_GE(run->plan_seconds, 0.0);

  request.options.max_token_len = 0;
  request.num_parts = 4;
  run = RunPlan(kLengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_STREQ(run->mode, "fixed_k");
  EXPECT_EQ(run->plan.parts.size(), 4u);
}

TEST(RunPlanTest, RefusesInconsistentRequests) {
  PlanRequest no_cap;
  EXPECT_THAT(RunPlan(kLengths, no_cap).status().message(), HasSubstr("--max_token_len"));
  PlanRequest equal_size;
  equal_size.options.max_token_len = 10240;
  equal_size.options.equal_size = true;
  EXPECT_THAT(RunPlan(kLengths, equal_size).status().message(), HasSubstr("--num_parts"));
  PlanRequest packer_k;
  packer_k.num_parts = 2;
  packer_k.options.algorithm = Algorithm::kSequential;
  EXPECT_THAT(RunPlan(kLengths, packer_k).status().message(), HasSubstr("sequential"));
  PlanRequest negative;
  negative.num_parts = -1;
  EXPECT_EQ(RunPlan(kLengths, negative).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched::cli
