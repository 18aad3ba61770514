// The in-flight memory budget and the per-request estimate (docs/design.md §3, memory per
// request): a reservation over the budget is refused at once, naming the estimate and the flag;
// reservations end with their holder; the micro-batch count an estimate assumes is never below
// what the planner builds.

#include "server/service/memory_budget.h"

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "server/service/convert.h"
#include "server/service/request_memory.h"

namespace packsched::service {
namespace {

using ::testing::HasSubstr;

TEST(MemoryBudget, RefusesWhatDoesNotFitNamingEstimateAndFlag) {
  MemoryBudget budget(1000);
  absl::StatusOr<MemoryBudget::Reservation> first = budget.Reserve(600, "first");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(budget.in_flight(), 600);
  absl::StatusOr<MemoryBudget::Reservation> second = budget.Reserve(401, "second");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("second needs an estimated 401 bytes"));
  EXPECT_THAT(second.status().message(), HasSubstr("600 bytes already in flight"));
  EXPECT_THAT(second.status().message(), HasSubstr("--max_inflight_bytes = 1000"));
  EXPECT_EQ(budget.in_flight(), 600);              // a refusal reserves nothing
  EXPECT_TRUE(budget.Reserve(400, "third").ok());  // and fits exactly (released at once)
}

TEST(MemoryBudget, AReservationEndsWithItsHolderOnce) {
  MemoryBudget budget(1000);
  {
    absl::StatusOr<MemoryBudget::Reservation> r = budget.Reserve(700, "r");
    ASSERT_TRUE(r.ok());
    MemoryBudget::Reservation moved = *std::move(r);
    MemoryBudget::Reservation again = std::move(moved);
    EXPECT_EQ(again.bytes(), 700);
    EXPECT_EQ(budget.in_flight(), 700);
  }
  EXPECT_EQ(budget.in_flight(), 0);
  EXPECT_TRUE(budget.Reserve(1000, "all of it").ok());
}

TEST(MemoryBudget, ZeroMeansNoBudget) {
  MemoryBudget budget(0);
  absl::StatusOr<MemoryBudget::Reservation> r = budget.Reserve(int64_t{1} << 60, "huge");
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST(RequestMemory, TwentyByteAmplifiersAreEstimatedAtTheirMicroBatches) {
  const ServiceLimits limits;
  v1::PlanRequest plan;
  plan.set_stream("s");
  plan.add_lengths(1);
  plan.add_lengths(1);
  plan.mutable_options()->set_max_token_len(8);
  plan.mutable_options()->set_min_micro_batches(1'000'000);
  const RequestMemory p = EstimatePlanMemory(plan, limits);
  EXPECT_EQ(p.micro_batches, 1'000'000);
  EXPECT_EQ(p.bytes, PeakBytes(2, 1'000'000, static_cast<int64_t>(plan.ByteSizeLong()), 0));
  EXPECT_GT(p.bytes, limits.max_inflight_bytes);  // refused by the default budget

  v1::PartitionRequest partition;
  partition.add_lengths(1);
  partition.add_lengths(1);
  partition.set_num_micro_batches(1'000'000);
  const RequestMemory q = EstimatePartitionMemory(partition, limits);
  EXPECT_EQ(q.micro_batches, 1'000'000);
  EXPECT_GT(q.bytes, limits.max_inflight_bytes);

  // Values validation refuses count nothing (the request never allocates by them).
  partition.set_num_micro_batches(limits.max_micro_batches + 1);
  EXPECT_EQ(EstimatePartitionMemory(partition, limits).micro_batches, 0);
}

TEST(RequestMemory, DivisibleByRoundsTheCountUp) {
  v1::PlanRequest plan;
  plan.add_lengths(5);
  plan.mutable_options()->set_max_token_len(8);
  plan.mutable_options()->set_min_micro_batches(3);
  plan.mutable_options()->set_divisible_by(4);
  EXPECT_EQ(EstimatePlanMemory(plan, ServiceLimits()).micro_batches, 4);
}

// The bound behind a Plan's k: never below the planner's local bound, over mixes, caps and
// alignments.
TEST(RequestMemory, PlanCountIsNeverBelowThePlannersBound) {
  std::mt19937_64 rng(19);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 400);
    const int64_t cap = 64 + static_cast<int64_t>(rng() % 4096);
    v1::PlanRequest request;
    v1::PlanOptions* o = request.mutable_options();
    o->set_max_token_len(cap);
    o->set_align_to(1 + static_cast<int64_t>(rng() % 8));
    o->set_align_total_to(trial % 3 == 0 ? 1 + static_cast<int64_t>(rng() % 32) : 1);
    o->set_overlong(v1::OVERLONG_POLICY_ISOLATE);
    if (trial % 5 == 0) o->set_algorithm(v1::ALGORITHM_LPT);
    std::vector<int64_t> lengths;
    for (int i = 0; i < n; ++i) {
      lengths.push_back(1 + static_cast<int64_t>(rng() % (trial % 2 == 0 ? cap : cap / 3)));
      request.add_lengths(lengths.back());
    }
    const absl::StatusOr<planner::PlanOptions> options =
        ToPlanOptions(request.options(), ServiceLimits(), /*planner_picks_k=*/true);
    ASSERT_TRUE(options.ok()) << options.status();
    const absl::StatusOr<planner::Problem> problem = planner::Problem::Create(lengths, *options);
    ASSERT_TRUE(problem.ok()) << problem.status();
    EXPECT_GE(EstimatePlanMemory(request, ServiceLimits()).micro_batches, problem->local_k())
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace packsched::service
