#include "tests/collective/in_process_collective.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/collective/run_ranks.h"

namespace packsched::collective {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::RunRanks;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(InProcessCollective, ReducesEachElementWithItsOwnOp) {
  auto group = CreateInProcessGroup(4);
  auto results = RunRanks<std::vector<int64_t>>(group, [](Collective& rank) {
    const int64_t r = rank.rank();
    std::vector<int64_t> values = {r * 10, -r, r + 1};
    const std::vector<ReduceOp> ops = {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum};
    EXPECT_TRUE(rank.AllReduce(absl::MakeSpan(values), ops, Soon()).ok());
    return values;
  });
  for (const auto& values : results) EXPECT_THAT(values, ElementsAre(30, -3, 10));
}

TEST(InProcessCollective, GathersRecordsInRankOrder) {
  auto group = CreateInProcessGroup(3);
  auto results = RunRanks<std::vector<int64_t>>(group, [](Collective& rank) {
    const std::vector<int64_t> record = {rank.rank(), 100 + rank.rank()};
    std::vector<int64_t> out(6);
    EXPECT_TRUE(rank.AllGather(record, absl::MakeSpan(out), Soon()).ok());
    return out;
  });
  for (const auto& out : results) EXPECT_THAT(out, ElementsAre(0, 100, 1, 101, 2, 102));
}

TEST(InProcessCollective, ManyCallsInARowStayInStep) {
  auto group = CreateInProcessGroup(3);
  auto results = RunRanks<int64_t>(group, [](Collective& rank) {
    int64_t total = 0;
    for (int64_t call = 0; call < 200; ++call) {
      std::vector<int64_t> values = {call * rank.rank()};
      const std::vector<ReduceOp> ops = {ReduceOp::kSum};
      EXPECT_TRUE(rank.AllReduce(absl::MakeSpan(values), ops, Soon()).ok());
      total += values[0];
    }
    return total;
  });
  // Each call sums call * (0 + 1 + 2).
  for (int64_t total : results) EXPECT_EQ(total, 3 * (199 * 200 / 2));
}

TEST(InProcessCollective, AbortWakesAWaitingPeerAndBreaksTheGroup) {
  auto group = CreateInProcessGroup(2);
  absl::Status waiting;
  std::thread peer([&] {
    std::vector<int64_t> values = {1};
    const std::vector<ReduceOp> ops = {ReduceOp::kMax};
    waiting = group[0]->AllReduce(absl::MakeSpan(values), ops, Soon());
  });
  absl::SleepFor(absl::Milliseconds(50));
  group[1]->Abort();
  peer.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kAborted);
  std::vector<int64_t> values = {1};
  const std::vector<ReduceOp> ops = {ReduceOp::kMax};
  EXPECT_EQ(group[1]->AllReduce(absl::MakeSpan(values), ops, Soon()).code(),
            absl::StatusCode::kAborted);
}

TEST(InProcessCollective, ATimeoutNamesTheMissingRanks) {
  auto group = CreateInProcessGroup(4);
  std::vector<int64_t> values = {1};
  const std::vector<ReduceOp> ops = {ReduceOp::kMax};
  absl::Status status =
      group[2]->AllReduce(absl::MakeSpan(values), ops, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("[0, 1, 3]"));
}

TEST(InProcessCollective, DifferentSizesFailOnEveryRank) {
  auto group = CreateInProcessGroup(2);
  auto results = RunRanks<absl::Status>(group, [](Collective& rank) {
    std::vector<int64_t> values(rank.rank() + 1, 1);
    const std::vector<ReduceOp> ops(values.size(), ReduceOp::kSum);
    return rank.AllReduce(absl::MakeSpan(values), ops, Soon());
  });
  for (const absl::Status& status : results) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace packsched::collective
