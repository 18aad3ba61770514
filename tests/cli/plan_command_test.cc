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

// Every option's range is checked before a length is read, in the planner's words after "--"
// (the options are named as the flags).
TEST(CheckRequestTest, OptionRangesAndLimitsBeforeAnyLength) {
  PlanRequest r;
  r.options.max_token_len = 10240;
  EXPECT_TRUE(CheckRequest(r).ok());
  r.options.min_micro_batches = 0;
  EXPECT_EQ(CheckRequest(r).message(), "--min_micro_batches = 0: must be in [1, 1000000]");
  r.options.min_micro_batches = 1;
  r.options.context_parallel = 2;
  r.options.align_to = 3;
  EXPECT_THAT(CheckRequest(r).message(), HasSubstr("--align_to = 3 is not a multiple of 4"));
  r.options.align_to = 1;
  r.num_parts = 1000001;
  EXPECT_EQ(CheckRequest(r).message(),
            "--num_parts = 1000001: must be at most --max_micro_batches = 1000000");
  r.num_parts = 0;
  r.world_size = (int64_t{1} << 20) + 1;
  EXPECT_EQ(CheckRequest(r).message(), "--world_size = 1048577: must be at most 1048576");
  r.world_size = 2;
  r.balance.micro_batch_cost = -1;
  EXPECT_THAT(CheckRequest(r).message(), HasSubstr("--micro_batch_cost = -1: must be in [0, "));
}

}  // namespace
}  // namespace packsched::cli
