// What the coordinator tells the metrics sink: one sample per round it runs (not per cache hit),
// with the outcome and the plan's figures computed here from the plan itself, and the stream's
// removal when it is reclaimed; RoundSampleOf's over-the-cap split against the input lengths.

#include "server/service/round_metrics.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/sink.h"
#include "server/planner/planner.h"
#include "server/service/coordinator.h"
#include "tests/service/service_test_util.h"

namespace packsched::service {
namespace {

using ::packsched::service::testing::Input;
using ::packsched::service::testing::Request;
using ::packsched::service::testing::SubmitAndWait;

// Keeps what it was told.
class RecordingSink final : public metrics::Sink {
 public:
  struct Seen {
    std::string stream;
    int64_t round;
    absl::StatusCode code;
    int64_t micro_batches;
    int64_t sequences;
  };
  void Request(metrics::Method, absl::StatusCode) override {}
  void Round(const metrics::RoundSample& s) override {
    absl::MutexLock lock(&mu_);
    rounds_.push_back({std::string(s.stream), s.round, s.code, s.micro_batches, s.sequences});
  }
  void StreamRemoved(absl::string_view stream) override {
    absl::MutexLock lock(&mu_);
    removed_.emplace_back(stream);
  }
  std::vector<Seen> rounds() {
    absl::MutexLock lock(&mu_);
    return rounds_;
  }
  std::vector<std::string> removed() {
    absl::MutexLock lock(&mu_);
    return removed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Seen> rounds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> removed_ ABSL_GUARDED_BY(mu_);
};

TEST(RoundMetrics, OneSamplePerRoundRunAndTheStreamRemovedWhenReclaimed) {
  RecordingSink sink;
  RoundCoordinator::Options options = testing::OfOne();
  options.metrics = &sink;
  options.limits.stream_idle_timeout = absl::Milliseconds(200);
  RoundCoordinator coordinator(std::move(options));
  const std::vector<int64_t> lengths = {100, 900, 300, 700, 500};
  const testing::Result first = SubmitAndWait(coordinator, Input(Request("s", 1, lengths, 1000)));
  ASSERT_TRUE(first.ok()) << first.status();
  // The same round again: a cache hit, not a round.
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(Request("s", 1, lengths, 1000))).ok());
  // A round failed by its own bad input (a length of 0) still runs (its peers would fail too).
  EXPECT_EQ(SubmitAndWait(coordinator, Input(Request("s", 2, {5, 0}, 1000))).status().code(),
            absl::StatusCode::kInvalidArgument);

  const std::vector<RecordingSink::Seen> rounds = sink.rounds();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].stream, "s");
  EXPECT_EQ(rounds[0].round, 1);
  EXPECT_EQ(rounds[0].code, absl::StatusCode::kOk);
  EXPECT_EQ(rounds[0].micro_batches, static_cast<int64_t>((*first)->plan.parts.size()));
  EXPECT_EQ(rounds[0].sequences, 5);
  EXPECT_EQ(rounds[1].code, absl::StatusCode::kInvalidArgument);

  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (sink.removed().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(sink.removed(), std::vector<std::string>{"s"});
}

TEST(RoundMetrics, SampleSplitsOverTheCapAndCountsPadding) {
  // Three sequences over the cap of 1,000, each isolated: unavoidable; the rest fit.
  const std::vector<int64_t> lengths = {1500, 200, 2500, 300, 1200, 400};
  planner::PlanOptions options;
  options.max_token_len = 1000;
  options.overlong = planner::OverlongPolicy::kIsolate;
  absl::StatusOr<planner::MicroBatchPlan> plan = planner::PlanMicroBatches(lengths, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto result = std::make_shared<RoundResult>();
  result->plan = *plan;
  result->num_micro_batches = static_cast<int64_t>(plan->parts.size());
  int64_t over = 0;
  for (int64_t length : lengths) over += length > 1000 ? 1 : 0;
  // Rows a padded [n x longest] batch would hold, and the packed rows (each part's total).
  int64_t packed = 0;
  for (const planner::MicroBatch& part : plan->parts) packed += part.total;
  const double naive = 6.0 * 2500;

  const metrics::RoundSample s = RoundSampleOf("s", 4, std::shared_ptr<const RoundResult>(result),
                                               absl::Milliseconds(3), nullptr);
  EXPECT_EQ(s.code, absl::StatusCode::kOk);
  EXPECT_EQ(s.peer_failure, metrics::PeerFailure::kNone);
  EXPECT_EQ(s.over_cap_unavoidable, over);
  EXPECT_EQ(s.over_cap_avoidable, 0);
  EXPECT_EQ(s.sequences, 6);
  EXPECT_EQ(s.micro_batches, result->num_micro_batches);
  EXPECT_NEAR(s.padding_saved_ratio, 1.0 - packed / naive, 1e-12);
  // Token accounting: the lengths summed, the rows packed; no loss tokens, no loss-bearing ones.
  EXPECT_EQ(s.logical_tokens, 6100);
  EXPECT_EQ(s.forwarded_tokens, 6100);
  EXPECT_EQ(s.executed_tokens, packed);
  EXPECT_EQ(s.loss_tokens, 0);
  result->loss = planner::LossWeights{{}, {}, 77};
  EXPECT_EQ(RoundSampleOf("s", 4, std::shared_ptr<const RoundResult>(result), absl::Milliseconds(3),
                          nullptr)
                .loss_tokens,
            77);

  const metrics::RoundSample failed = RoundSampleOf(
      "s", 5, absl::DeadlineExceededError("rank 1 missing"), absl::Seconds(1), nullptr);
  EXPECT_EQ(failed.peer_failure, metrics::PeerFailure::kDeadline);
  EXPECT_EQ(failed.micro_batches, 0);
}

}  // namespace
}  // namespace packsched::service
