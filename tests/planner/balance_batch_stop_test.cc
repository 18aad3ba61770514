// BalanceOptions::stop: BalanceBatch asks it all through a long run and ends with its first
// non-OK answer; a stop that never says stop changes nothing.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"

namespace packsched::planner {
namespace {

PlanOptions Capped(int64_t cap) {
  PlanOptions o;
  o.max_token_len = cap;
  return o;
}

std::vector<int64_t> Lengths(int64_t n) {
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < n; ++i) lengths.push_back(100 + (i * 7919) % 3000);
  return lengths;
}

struct Shape {
  Sync sync;
  bool grouped;
};

class StopTest : public ::testing::TestWithParam<Shape> {};

TEST_P(StopTest, AStopThatNeverStopsChangesNothing) {
  const std::vector<int64_t> lengths = Lengths(3000);
  std::vector<int64_t> groups;
  if (GetParam().grouped) {
    for (int64_t i = 0; i < 3000; ++i) groups.push_back(i / 3);
  }
  BalanceOptions plain;
  plain.sync = GetParam().sync;
  BalanceOptions asked = plain;
  int64_t asks = 0;
  asked.stop = [&asks] {
    ++asks;
    return absl::OkStatus();
  };
  absl::StatusOr<BalancedBatch> a = BalanceBatch(lengths, 64, Capped(8192), groups, plain);
  absl::StatusOr<BalancedBatch> b = BalanceBatch(lengths, 64, Capped(8192), groups, asked);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GE(asks, 1);
  EXPECT_EQ(a->num_micro_batches, b->num_micro_batches);
  ASSERT_EQ(a->ranks.size(), b->ranks.size());
  for (size_t r = 0; r < a->ranks.size(); ++r) {
    EXPECT_EQ(a->ranks[r].indices, b->ranks[r].indices);
    ASSERT_EQ(a->ranks[r].plan.parts.size(), b->ranks[r].plan.parts.size());
    for (size_t i = 0; i < a->ranks[r].plan.parts.size(); ++i) {
      EXPECT_EQ(a->ranks[r].plan.parts[i].indices, b->ranks[r].plan.parts[i].indices);
    }
  }
  EXPECT_EQ(a->step.step_sync_cost, b->step.step_sync_cost);
  EXPECT_EQ(a->step.micro_batch_sync_cost, b->step.micro_batch_sync_cost);
}

// A long run (world_size = n = 20,000) asks many times, and ends with the first non-OK answer,
// asking no more after it: a stop anywhere in the run is honoured.
TEST_P(StopTest, EndsWithTheFirstNonOkAnswerWherever) {
  const int64_t n = 20'000;
  const std::vector<int64_t> lengths = Lengths(n);
  std::vector<int64_t> groups;
  if (GetParam().grouped) {
    for (int64_t i = 0; i < n; ++i) groups.push_back(i);
  }
  BalanceOptions counting;
  counting.sync = GetParam().sync;
  int64_t total = 0;
  counting.stop = [&total] {
    ++total;
    return absl::OkStatus();
  };
  ASSERT_TRUE(BalanceBatch(lengths, n, Capped(4096), groups, counting).ok());
  ASSERT_GE(total, 4) << "a run of this size must ask its stop all along";
  for (const int64_t stop_at : {int64_t{1}, total / 2, total}) {
    BalanceOptions stopping = counting;
    int64_t asks = 0;
    stopping.stop = [&asks, stop_at] {
      ++asks;
      return asks >= stop_at ? absl::DeadlineExceededError("past the caller's deadline")
                             : absl::OkStatus();
    };
    absl::StatusOr<BalancedBatch> batch = BalanceBatch(lengths, n, Capped(4096), groups, stopping);
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kDeadlineExceeded) << "stop at " << stop_at;
    EXPECT_EQ(batch.status().message(), "past the caller's deadline");
    EXPECT_EQ(asks, stop_at);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, StopTest,
                         ::testing::Values(Shape{Sync::kStep, false}, Shape{Sync::kStep, true},
                                           Shape{Sync::kMicroBatch, false},
                                           Shape{Sync::kMicroBatch, true}));

}  // namespace
}  // namespace packsched::planner
