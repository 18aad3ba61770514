// The round coordinator: one computation per (stream, round) shared by every caller, rounds in
// order per stream and streams independent, a bounded cache, same-round content checks,
// failures not cached, limits, shutdown, and agreement over a group of ranks.

#include "server/service/coordinator.h"

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/local_collective.h"
#include "server/collective/store.h"
#include "server/group/collective_agreement.h"
#include "server/group/group.h"
#include "server/group/group_agreement.h"
#include "server/planner/planner.h"
#include "server/service/dynamic_cp.h"
#include "server/service/result_cache.h"
#include "tests/collective/in_process_collective.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/ignore_sigpipe.h"  // a two-rank Gloo group below
#include "tests/testing/lengths.h"

namespace packsched::service {
namespace {

using ::packsched::service::testing::Call;
using ::packsched::service::testing::Gate;
using ::packsched::service::testing::GatedCollective;
using ::packsched::service::testing::Input;
using ::packsched::service::testing::OfOne;
using ::packsched::service::testing::Request;
using ::packsched::service::testing::Result;
using ::packsched::service::testing::SubmitAndWait;
using ::testing::HasSubstr;

constexpr int64_t kCap = 18432;  // above the longest RealisticRlLengths sequence

// Threads of this process (Linux).
int64_t ThreadCount() {
  int64_t count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++count;
  }
  return count;
}

// Each stream of `options` agrees over the collectives `make` makes (a test's own).
void AgreeOver(RoundCoordinator::Options& options,
               group::CollectiveAgreements::CollectiveFactory make) {
  options.agreements = std::make_shared<group::CollectiveAgreements>(
      options.limits.collective_timeout, std::move(make));
}

RoundCoordinator::Options Gated(Gate* gate, ServiceLimits limits = {}) {
  RoundCoordinator::Options options;
  options.limits = limits;
  AgreeOver(options, [gate](absl::string_view) {
    return absl::StatusOr<std::unique_ptr<collective::Collective>>(
        std::make_unique<GatedCollective>(gate));
  });
  return options;
}

std::vector<int64_t> Batch(uint64_t seed, int64_t n = 256) {
  return packsched::testing::RealisticRlLengths(n, seed);
}

TEST(Coordinator, PlansLikeThePlannerAlone) {
  RoundCoordinator coordinator(OfOne());
  const std::vector<int64_t> lengths = Batch(1);
  const Result result = SubmitAndWait(coordinator, Input(Request("s", 7, lengths, kCap)));
  ASSERT_TRUE(result.ok()) << result.status();
  planner::PlanOptions options;
  options.max_token_len = kCap;
  const absl::StatusOr<planner::MicroBatchPlan> alone = planner::PlanMicroBatches(lengths, options);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*result)->num_micro_batches, static_cast<int64_t>(alone->parts.size()));
  EXPECT_EQ((*result)->plan.reorder, alone->reorder);
  EXPECT_EQ((*result)->global.num_sequences, static_cast<int64_t>(lengths.size()));
  EXPECT_EQ((*result)->global.world_size, 1);
}

TEST(Coordinator, ConcurrentCallersOfOneRoundShareOneComputation) {
  Gate gate;
  RoundCoordinator coordinator(Gated(&gate));
  const v1::PlanRequest request = Request("actor_update", 3, Batch(2), kCap);
  std::vector<std::unique_ptr<Call>> calls;
  calls.push_back(std::make_unique<Call>(coordinator, Input(request)));
  gate.WaitEntered(1);  // the round is running, held at the collective
  std::vector<std::thread> threads;
  absl::Mutex mu;
  for (int i = 0; i < 7; ++i) {
    threads.emplace_back([&] {
      auto call = std::make_unique<Call>(coordinator, Input(request));
      absl::MutexLock lock(&mu);
      calls.push_back(std::move(call));
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& call : calls) EXPECT_FALSE(call->done());
  gate.Open();
  const Result& first = calls[0]->Wait();
  ASSERT_TRUE(first.ok()) << first.status();
  for (const auto& call : calls) {
    const Result& result = call->Wait();
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->get(), first->get());  // the same object: computed once
  }
  const RoundCoordinator::Stats stats = coordinator.GetStats();
  EXPECT_EQ(stats.rounds, 1);
  EXPECT_EQ(stats.joined_in_flight, 7);
}

TEST(Coordinator, LateCallersAreServedFromTheCache) {
  RoundCoordinator coordinator(OfOne());
  const v1::PlanRequest request = Request("s", 1, Batch(3), kCap);
  const Result first = SubmitAndWait(coordinator, Input(request));
  const Result late = SubmitAndWait(coordinator, Input(request));
  ASSERT_TRUE(first.ok() && late.ok());
  EXPECT_EQ(first->get(), late->get());
  EXPECT_EQ(coordinator.GetStats().rounds, 1);
  EXPECT_EQ(coordinator.GetStats().cache_hits, 1);
}

TEST(Coordinator, DifferentContentForTheSameRoundIsFailedPrecondition) {
  Gate gate;
  RoundCoordinator coordinator(Gated(&gate));
  Call running(coordinator, Input(Request("s", 5, Batch(4), kCap)));
  gate.WaitEntered(1);
  // In flight, different lengths.
  const Result in_flight = SubmitAndWait(coordinator, Input(Request("s", 5, Batch(5), kCap)));
  EXPECT_EQ(in_flight.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(in_flight.status().message(), HasSubstr("round 5"));
  gate.Open();
  ASSERT_TRUE(running.Wait().ok());
  // Finished, different options.
  const Result cached = SubmitAndWait(coordinator, Input(Request("s", 5, Batch(4), kCap + 1)));
  EXPECT_EQ(cached.status().code(), absl::StatusCode::kFailedPrecondition);
  // The original content is still served.
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("s", 5, Batch(4), kCap))).ok());
}

TEST(Coordinator, FailuresAreNotCached) {
  RoundCoordinator coordinator(OfOne());
  // One sequence longer than the cap under the default reject policy.
  const v1::PlanRequest bad = Request("s", 9, {100, 50000}, kCap);
  const Result first = SubmitAndWait(coordinator, Input(bad));
  EXPECT_EQ(first.status().code(), absl::StatusCode::kInvalidArgument);
  const Result again = SubmitAndWait(coordinator, Input(bad));
  EXPECT_EQ(again.status(), first.status());
  EXPECT_EQ(coordinator.GetStats().rounds, 2);  // ran again, not served from a cache
  EXPECT_EQ(coordinator.GetStats().cache_hits, 0);
  // Validation errors (found before the round) join and fail the round the same way.
  const Result invalid = SubmitAndWait(coordinator, Input(Request("s", 10, {5, -3}, kCap)));
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.status().message(), HasSubstr("lengths[1] = -3"));
}

TEST(Coordinator, AnyStartValueGapsAndNoWaitingForLowerRounds) {
  RoundCoordinator coordinator(OfOne());
  for (int64_t round : {int64_t{-40}, int64_t{1000}, int64_t{1000000007}, int64_t{1} << 62}) {
    EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("s", round, Batch(6), kCap))).ok())
        << round;
  }
  const RoundCoordinator::Stats stats = coordinator.GetStats();
  ASSERT_EQ(stats.streams.size(), 1u);
  EXPECT_EQ(stats.streams[0].last_round, int64_t{1} << 62);
  EXPECT_EQ(stats.streams[0].rounds_completed, 4);
}

TEST(Coordinator, QueuedRoundsRunLowestFirst) {
  Gate gate;
  RoundCoordinator coordinator(Gated(&gate));
  absl::Mutex mu;
  std::vector<int64_t> finished;
  absl::Notification all_done;
  auto submit = [&](int64_t round) {
    coordinator.Submit(Input(Request("s", round, Batch(round), kCap)), [&, round](Result r) {
      EXPECT_TRUE(r.ok()) << r.status();
      absl::MutexLock lock(&mu);
      finished.push_back(round);
      if (finished.size() == 4) all_done.Notify();
    });
  };
  submit(10);
  gate.WaitEntered(1);  // 10 runs; the rest queue behind it in any arrival order
  submit(40);
  submit(20);
  submit(30);
  gate.Open();
  all_done.WaitForNotification();
  EXPECT_EQ(finished, (std::vector<int64_t>{10, 20, 30, 40}));
}

TEST(Coordinator, StreamsAreIndependent) {
  Gate blocked;
  Gate open;
  open.Open();
  RoundCoordinator::Options options;
  AgreeOver(options, [&](absl::string_view stream) {
    return absl::StatusOr<std::unique_ptr<collective::Collective>>(
        std::make_unique<GatedCollective>(stream == "critic" ? &blocked : &open));
  });
  RoundCoordinator coordinator(std::move(options));
  Call critic(coordinator, Input(Request("critic", 1, Batch(7), kCap)));
  blocked.WaitEntered(1);
  // The actor stream keeps planning (interleaved rounds) while the critic's round is held.
  for (int64_t round = 1; round <= 3; ++round) {
    EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("actor", round, Batch(8), kCap))).ok());
  }
  EXPECT_FALSE(critic.done());
  blocked.Open();
  EXPECT_TRUE(critic.Wait().ok());
}

// A coordinator whose streams each cache `rounds` finished rounds.
RoundCoordinator::Options CachingRounds(int64_t rounds) {
  RoundCoordinator::Options options = OfOne();
  options.limits.max_cached_rounds = rounds;
  return options;
}

TEST(Coordinator, CacheEvictsTheOldestRounds) {
  RoundCoordinator coordinator(CachingRounds(2));
  for (int64_t round = 1; round <= 3; ++round) {
    ASSERT_TRUE(SubmitAndWait(coordinator, Input(Request("s", round, Batch(round), kCap))).ok());
  }
  EXPECT_EQ(coordinator.GetStats().streams[0].cached, 2);
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(Request("s", 3, Batch(3), kCap))).ok());
  EXPECT_EQ(coordinator.GetStats().cache_hits, 1);
  EXPECT_EQ(coordinator.GetStats().rounds, 3);
}

// A served round that was evicted is never run again — in a group it would enter the collective
// alone and hold the stream until the timeout — whatever content the late call brings.
TEST(Coordinator, AnEvictedRoundIsFailedPreconditionNotRunAgain) {
  RoundCoordinator coordinator(CachingRounds(2));
  for (int64_t round = 1; round <= 3; ++round) {
    ASSERT_TRUE(SubmitAndWait(coordinator, Input(Request("s", round, Batch(round), kCap))).ok());
  }
  for (uint64_t seed : {1, 9}) {  // the same content, and new lengths
    const Result again = SubmitAndWait(coordinator, Input(Request("s", 1, Batch(seed), kCap)));
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(again.status().message(),
                HasSubstr("round 1 was already served and has been evicted"));
    EXPECT_THAT(again.status().message(), HasSubstr("--max_cached_rounds = 2"));
  }
  // Below the evicted round: refused too, naming both rounds.
  const Result older = SubmitAndWait(coordinator, Input(Request("s", 0, Batch(0), kCap)));
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(older.status().message(), HasSubstr("round 0 is not cached and is below round 1"));
  EXPECT_EQ(coordinator.GetStats().rounds, 3);  // nothing ran again
  // Cached rounds are still served, new rounds still run, other streams are unaffected.
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("s", 2, Batch(2), kCap))).ok());
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("s", 4, Batch(4), kCap))).ok());
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("t", 1, Batch(1), kCap))).ok());
  EXPECT_EQ(coordinator.GetStats().rounds, 5);
}

// A tiny request can ask for a result of many megabytes (min_micro_batches): the cache is
// bounded by bytes over every stream too, oldest evicted first, and a result over the budget on
// its own is served but not kept.
TEST(Coordinator, CacheIsBoundedByBytesOverEveryStream) {
  v1::PlanRequest big = Request("a", 1, {1}, 1);
  big.mutable_options()->set_min_micro_batches(20000);  // ~20,000 parts: over a megabyte
  const Result probe = [&] {
    RoundCoordinator unbounded(OfOne());
    return SubmitAndWait(unbounded, Input(big));
  }();
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int64_t one = EstimatedBytes(**probe);
  ASSERT_GT(one, 1 << 20);

  ServiceLimits limits;
  limits.max_cached_bytes = 2 * one + one / 2;  // room for two such results
  RoundCoordinator::Options options = OfOne();
  options.limits = limits;
  RoundCoordinator coordinator(std::move(options));
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(big)).ok());  // a:1
  big.set_round(2);
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(big)).ok());  // a:2
  big.set_stream("b");
  big.set_round(1);
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(big)).ok());  // b:1 evicts a:1, the oldest
  RoundCoordinator::Stats stats = coordinator.GetStats();
  EXPECT_EQ(stats.cached_bytes, 2 * one);
  EXPECT_LE(stats.cached_bytes, limits.max_cached_bytes);
  ASSERT_EQ(stats.streams.size(), 2u);
  EXPECT_EQ(stats.streams[0].cached, 1);  // a:2
  EXPECT_EQ(stats.streams[1].cached, 1);  // b:1
  big.set_stream("a");
  EXPECT_EQ(SubmitAndWait(coordinator, Input(big)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // a:1 was evicted
  big.set_round(2);
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(big)).ok());  // a:2 from the cache
  EXPECT_EQ(coordinator.GetStats().cache_hits, 1);

  // Over the whole budget: served, not kept (and the kept rounds stay).
  v1::PlanRequest huge = Request("c", 1, {1}, 1);
  huge.mutable_options()->set_min_micro_batches(60000);
  const Result served = SubmitAndWait(coordinator, Input(huge));
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ((*served)->num_micro_batches, 60000);
  stats = coordinator.GetStats();
  EXPECT_EQ(stats.streams[2].cached, 0);
  EXPECT_EQ(stats.cached_bytes, 2 * one);
  const Result late = SubmitAndWait(coordinator, Input(huge));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("--max_cached_bytes"));
}

TEST(Coordinator, LimitsOnStreamsAndOutstandingRounds) {
  Gate gate;
  ServiceLimits limits;
  limits.max_streams = 1;
  limits.max_outstanding_rounds = 2;
  RoundCoordinator coordinator(Gated(&gate, limits));
  Call first(coordinator, Input(Request("s", 1, Batch(1), kCap)));
  Call second(coordinator, Input(Request("s", 2, Batch(2), kCap)));
  const Result third = SubmitAndWait(coordinator, Input(Request("s", 3, Batch(3), kCap)));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("--max_outstanding_rounds"));
  const Result other = SubmitAndWait(coordinator, Input(Request("t", 1, Batch(1), kCap)));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(other.status().message(), HasSubstr("--max_streams"));
  gate.Open();
  EXPECT_TRUE(first.Wait().ok());
  EXPECT_TRUE(second.Wait().ok());
}

// Only a valid request creates a stream: invalid requests on any number of new names take no
// slot and no thread (regression: two of them used to lock out every stream until a restart).
TEST(Coordinator, InvalidRequestsOnNewStreamsLeaveEverySlotFree) {
  RoundCoordinator::Options options = OfOne();
  options.limits.max_streams = 2;
  RoundCoordinator coordinator(std::move(options));
  const int64_t threads = ThreadCount();
  for (int i = 0; i < 1000; ++i) {
    const Result invalid =
        SubmitAndWait(coordinator, Input(Request(absl::StrCat("bad", i), 1, {5, -3}, kCap)));
    ASSERT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_THAT(invalid.status().message(), HasSubstr("lengths[1] = -3"));
  }
  RoundCoordinator::Stats stats = coordinator.GetStats();
  EXPECT_TRUE(stats.streams.empty());
  EXPECT_EQ(stats.rounds, 0);
  EXPECT_EQ(ThreadCount(), threads);
  // Both slots are free.
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("a", 1, Batch(1), kCap))).ok());
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("b", 1, Batch(2), kCap))).ok());
  EXPECT_EQ(SubmitAndWait(coordinator, Input(Request("c", 1, Batch(3), kCap))).status().code(),
            absl::StatusCode::kResourceExhausted);
  // On a stream that exists, an invalid request joins its round and fails it (as in a group).
  const Result joined = SubmitAndWait(coordinator, Input(Request("a", 2, {5, -3}, kCap)));
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument);
  stats = coordinator.GetStats();
  ASSERT_EQ(stats.streams.size(), 2u);
  EXPECT_EQ(stats.streams[0].rounds_failed, 1);
}

// Waits (bounded) until `done(stats)` holds.
template <typename Predicate>
bool WaitForStats(RoundCoordinator& coordinator, Predicate done,
                  absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done(coordinator.GetStats())) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(Coordinator, IdleStreamsAreReclaimedWithTheirThreads) {
  RoundCoordinator::Options options = OfOne();
  options.limits.max_streams = 1;
  // Well above a stall of a loaded machine, so a stream is not reclaimed between two calls.
  options.limits.stream_idle_timeout = absl::Seconds(1);
  RoundCoordinator coordinator(std::move(options));
  const int64_t threads = ThreadCount();
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(Request("a", 1, Batch(1), kCap))).ok());
  EXPECT_EQ(coordinator.GetStats().streams.size(), 1u);
  // The slot is taken until "a" is reclaimed.
  EXPECT_EQ(SubmitAndWait(coordinator, Input(Request("b", 1, Batch(1), kCap))).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(WaitForStats(coordinator, [](const RoundCoordinator::Stats& s) {
    return s.streams.empty() && s.streams_reclaimed >= 1;
  }));
  EXPECT_EQ(coordinator.GetStats().tombstones, 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (ThreadCount() > threads && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(ThreadCount(), threads);

  // A late caller of the served round: refused by the tombstone, creating nothing.
  const Result late = SubmitAndWait(coordinator, Input(Request("a", 1, Batch(1), kCap)));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("reclaimed"));
  EXPECT_THAT(late.status().message(), HasSubstr("--stream_idle_timeout"));
  EXPECT_TRUE(coordinator.GetStats().streams.empty());
  EXPECT_EQ(coordinator.GetStats().rounds, 1);

  // The slot is free again: another stream, then a new round of "a" once that one is gone.
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(Request("b", 1, Batch(2), kCap))).ok());
  ASSERT_TRUE(WaitForStats(coordinator, [](const RoundCoordinator::Stats& s) {
    return s.streams.empty() && s.streams_reclaimed >= 2;
  }));
  ASSERT_TRUE(SubmitAndWait(coordinator, Input(Request("a", 2, Batch(3), kCap))).ok());
  RoundCoordinator::Stats stats = coordinator.GetStats();
  ASSERT_EQ(stats.streams.size(), 1u);
  EXPECT_EQ(stats.streams[0].name, "a");
  EXPECT_EQ(stats.tombstones, 1);  // "b"'s; "a" took its own back
  // The tombstone still holds on the live stream: round 1 (and below) is not run again.
  for (int64_t round : {1, 0}) {
    const Result old = SubmitAndWait(coordinator, Input(Request("a", round, Batch(1), kCap)));
    EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition) << round;
  }
  EXPECT_EQ(coordinator.GetStats().rounds, 3);
  // And on the stream's next reclamation, its tombstone is its highest round.
  ASSERT_TRUE(WaitForStats(coordinator, [](const RoundCoordinator::Stats& s) {
    return s.streams.empty() && s.streams_reclaimed >= 3;
  }));
  EXPECT_EQ(SubmitAndWait(coordinator, Input(Request("a", 2, Batch(3), kCap))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("a", 3, Batch(3), kCap))).ok());
}

// Tombstones are bounded: past kMaxTombstones the oldest is dropped, and a late caller of that
// stream's served round runs it again (documented; in a group of one it simply plans).
TEST(Coordinator, TombstonesAreBoundedOldestDroppedFirst) {
  RoundCoordinator::Options options = OfOne();
  options.limits.max_streams = 2 * RoundCoordinator::kMaxTombstones;
  options.limits.stream_idle_timeout = absl::Milliseconds(1);
  RoundCoordinator coordinator(std::move(options));
  const int64_t n = RoundCoordinator::kMaxTombstones + 1;
  const std::vector<int64_t> lengths = {5, 7};
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(
        SubmitAndWait(coordinator, Input(Request(absl::StrCat("s", i), 0, lengths, kCap))).ok());
    if (i == 0) {  // "s0" leaves the oldest tombstone (the others go in any order)
      ASSERT_TRUE(WaitForStats(coordinator,
                               [](const RoundCoordinator::Stats& s) { return s.tombstones == 1; }));
    }
  }
  ASSERT_TRUE(WaitForStats(coordinator,
                           [n](const RoundCoordinator::Stats& s) {
                             return s.streams_reclaimed >= n && s.streams.empty();
                           }))
      << coordinator.GetStats().streams_reclaimed << " reclaimed, "
      << coordinator.GetStats().streams.size() << " live";
  EXPECT_EQ(coordinator.GetStats().tombstones, RoundCoordinator::kMaxTombstones);
  EXPECT_EQ(SubmitAndWait(coordinator, Input(Request("s1", 0, lengths, kCap))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("s0", 0, lengths, kCap))).ok());
  EXPECT_EQ(coordinator.GetStats().rounds, n + 1);
}

// A stream with a round queued or running is not idle, however long the round takes; calls
// (cache hits included) keep it alive too.
TEST(Coordinator, BusyStreamsAreNotReclaimed) {
  Gate gate;
  ServiceLimits limits;
  limits.stream_idle_timeout = absl::Milliseconds(50);
  RoundCoordinator coordinator(Gated(&gate, limits));
  Call running(coordinator, Input(Request("s", 1, Batch(1), kCap)));
  gate.WaitEntered(1);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(coordinator.GetStats().streams_reclaimed, 0);
  EXPECT_EQ(coordinator.GetStats().streams.size(), 1u);
  gate.Open();
  ASSERT_TRUE(running.Wait().ok());
  ASSERT_TRUE(WaitForStats(coordinator, [](const RoundCoordinator::Stats& s) {
    return s.streams_reclaimed >= 1 && s.streams.empty();
  }));
}

// Shutdown() joins every worker, live and reclaimed, and a stream reclaimed while shutting down
// is not lost.
TEST(Coordinator, ShutdownJoinsReclaimedWorkers) {
  RoundCoordinator::Options options = OfOne();
  options.limits.stream_idle_timeout = absl::Milliseconds(1);
  RoundCoordinator coordinator(std::move(options));
  const int64_t threads = ThreadCount();
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(
        SubmitAndWait(coordinator, Input(Request(absl::StrCat("s", i % 7), i, Batch(i, 16), kCap)))
            .ok());
  }
  coordinator.Shutdown();
  EXPECT_EQ(ThreadCount(), threads);
  EXPECT_EQ(SubmitAndWait(coordinator, Input(Request("s0", 100, Batch(1), kCap))).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(Coordinator, ShutdownAbortsTheRunningRoundAndFailsQueuedOnes) {
  Gate gate;  // never opened: only Shutdown's abort ends the running round
  RoundCoordinator coordinator(Gated(&gate));
  Call running(coordinator, Input(Request("s", 1, Batch(1), kCap)));
  gate.WaitEntered(1);
  Call queued(coordinator, Input(Request("s", 2, Batch(2), kCap)));
  coordinator.Shutdown();
  EXPECT_EQ(running.Wait().status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(queued.Wait().status().code(), absl::StatusCode::kUnavailable);
  const Result later = SubmitAndWait(coordinator, Input(Request("s", 3, Batch(3), kCap)));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable);
}

// A round blocked where Abort() does not reach — forming the group waits on the rendezvous
// store — ends through Options::cancel_waits, so Shutdown() does not wait out the collective
// timeout; and its caller is answered by Shutdown() itself (Aborted, naming the round).
TEST(Coordinator, ShutdownCancelsWaitsOutsideTheCollective) {
  absl::Notification entered;
  absl::Notification cancelled;
  RoundCoordinator::Options options;
  options.limits.collective_timeout = absl::Seconds(60);
  AgreeOver(options, [&](absl::string_view) {
    entered.Notify();
    // Stands in for a formation blocked on the store: only cancel_waits ends it early.
    if (!cancelled.WaitForNotificationWithTimeout(absl::Seconds(60))) {
      return absl::StatusOr<std::unique_ptr<collective::Collective>>(
          absl::DeadlineExceededError("waited out the timeout"));
    }
    return absl::StatusOr<std::unique_ptr<collective::Collective>>(
        absl::CancelledError("store cancelled"));
  });
  options.cancel_waits = [&] { cancelled.Notify(); };
  RoundCoordinator coordinator(std::move(options));
  Call running(coordinator, Input(Request("s", 1, Batch(1), kCap)));
  entered.WaitForNotification();
  coordinator.Shutdown();  // returns once the worker has left the blocked formation
  EXPECT_TRUE(cancelled.HasBeenNotified());
  ASSERT_TRUE(running.done());
  EXPECT_EQ(running.Wait().status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(running.Wait().status().message(), HasSubstr("round 1 was abandoned"));
}

// Outstanding callers are answered when Shutdown() begins, not when their rounds end: the server
// calls it before its grace period runs out, so clients get a final answer from the service
// rather than gRPC's own cancellation (which they would retry).
TEST(Coordinator, ShutdownAnswersOutstandingCallersBeforeTheirRoundsEnd) {
  absl::Notification entered;
  absl::Notification release;
  RoundCoordinator::Options options;
  AgreeOver(options, [&](absl::string_view) {
    entered.Notify();
    release.WaitForNotification();  // nothing Shutdown() does ends this
    return absl::StatusOr<std::unique_ptr<collective::Collective>>(
        std::make_unique<collective::LocalCollective>());
  });
  RoundCoordinator coordinator(std::move(options));
  Call running(coordinator, Input(Request("s", 1, Batch(1), kCap)));
  entered.WaitForNotification();
  Call queued(coordinator, Input(Request("s", 2, Batch(2), kCap)));
  std::thread stopping([&] { coordinator.Shutdown(); });
  EXPECT_EQ(running.Wait().status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(queued.Wait().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(queued.Wait().status().message(), HasSubstr("round 2 did not run"));
  release.Notify();
  stopping.join();
}

// Several sidecars (one coordinator per rank) agreeing over an in-process group.
class Ranks {
 public:
  explicit Ranks(int64_t world_size, absl::Duration timeout = absl::Seconds(20)) {
    auto group = collective::CreateInProcessGroup(world_size);
    for (auto& rank : group) {
      auto holder = std::make_shared<std::unique_ptr<collective::Collective>>(std::move(rank));
      RoundCoordinator::Options options;
      options.limits.collective_timeout = timeout;
      AgreeOver(options, [holder](absl::string_view) {
        if (*holder == nullptr) {
          return absl::StatusOr<std::unique_ptr<collective::Collective>>(
              absl::UnavailableError("the test group is used up"));
        }
        return absl::StatusOr<std::unique_ptr<collective::Collective>>(std::move(*holder));
      });
      coordinators_.push_back(std::make_unique<RoundCoordinator>(std::move(options)));
    }
  }
  RoundCoordinator& operator[](size_t r) { return *coordinators_[r]; }

 private:
  std::vector<std::unique_ptr<RoundCoordinator>> coordinators_;
};

TEST(CoordinatorGroup, RanksAgreeOnTheLargestBoundAndGlobalCounts) {
  Ranks ranks(2);
  v1::PlanRequest big = Request("s", 1, Batch(11, 512), kCap);
  v1::PlanRequest small = Request("s", 1, {100, 200, 300}, kCap);
  for (int64_t t : {50, 60, 70}) small.add_loss_tokens(t);
  for (int i = 0; i < big.lengths_size(); ++i) big.add_loss_tokens(big.lengths(i) / 2);
  Call c0(ranks[0], Input(big));
  Call c1(ranks[1], Input(small));
  const Result& r0 = c0.Wait();
  const Result& r1 = c1.Wait();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_GT((*r0)->local_k, (*r1)->local_k);
  EXPECT_EQ((*r0)->num_micro_batches, (*r0)->local_k);
  EXPECT_EQ((*r1)->num_micro_batches, (*r0)->local_k);
  EXPECT_EQ(static_cast<int64_t>((*r1)->plan.parts.size()), (*r0)->local_k);
  int64_t loss_tokens = 180;
  for (int i = 0; i < big.lengths_size(); ++i) loss_tokens += big.lengths(i) / 2;
  for (const Result* r : {&r0, &r1}) {
    EXPECT_EQ((**r)->global.world_size, 2);
    EXPECT_EQ((**r)->global.num_sequences, 515);
    EXPECT_EQ((**r)->global.loss_tokens, loss_tokens);
  }
  // token_mean: every sequence weighs 1 / (global loss tokens) on every rank.
  ASSERT_TRUE((*r1)->loss.has_value());
  EXPECT_DOUBLE_EQ((*r1)->loss->weights[0], 1.0 / static_cast<double>(loss_tokens));
}

TEST(CoordinatorGroup, WithoutSameMicroNumEachRankKeepsItsBound) {
  Ranks ranks(2);
  v1::PlanRequest big = Request("s", 1, Batch(12, 512), kCap);
  v1::PlanRequest small = Request("s", 1, {100, 200, 300}, kCap);
  big.mutable_options()->set_same_micro_num_in_dp(false);
  small.mutable_options()->set_same_micro_num_in_dp(false);
  Call c0(ranks[0], Input(big));
  Call c1(ranks[1], Input(small));
  ASSERT_TRUE(c0.Wait().ok());
  ASSERT_TRUE(c1.Wait().ok());
  EXPECT_EQ((*c1.Wait())->num_micro_batches, 1);
  EXPECT_EQ((*c1.Wait())->global.num_sequences, 515);  // counts are still agreed
}

// On a stream that exists (a valid round made it), an invalid request joins its round with its
// error, so every rank fails at once with the same status.
TEST(CoordinatorGroup, AnInvalidRequestFailsTheRoundOnEveryRankWithItsMessage) {
  Ranks ranks(2);
  {
    Call c0(ranks[0], Input(Request("s", 3, Batch(12), kCap)));
    Call c1(ranks[1], Input(Request("s", 3, Batch(13), kCap)));
    ASSERT_TRUE(c0.Wait().ok()) << c0.Wait().status();
    ASSERT_TRUE(c1.Wait().ok()) << c1.Wait().status();
  }
  Call c0(ranks[0], Input(Request("s", 4, Batch(13), kCap)));
  Call c1(ranks[1], Input(Request("s", 4, {10, 0, 10}, kCap)));
  const absl::Status s0 = c0.Wait().status();
  const absl::Status s1 = c1.Wait().status();
  EXPECT_EQ(s0.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s0, s1);
  EXPECT_THAT(s0.message(), HasSubstr("lengths[1] = 0"));
}

// An invalid request for a stream that does not exist yet creates nothing on its sidecar: its
// caller gets its own error at once, and the peers, who never meet it in the round, time out.
TEST(CoordinatorGroup, AnInvalidFirstRequestIsAnsweredAtOnceAndThePeersTimeOut) {
  Ranks ranks(2, absl::Milliseconds(300));
  Call c0(ranks[0], Input(Request("s", 1, Batch(13), kCap)));
  const Result invalid = SubmitAndWait(ranks[1], Input(Request("s", 1, {10, 0, 10}, kCap)));
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.status().message(), HasSubstr("lengths[1] = 0"));
  EXPECT_TRUE(ranks[1].GetStats().streams.empty());
  EXPECT_EQ(c0.Wait().status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(CoordinatorGroup, DifferentOptionsAreFailedPreconditionOnEveryRank) {
  Ranks ranks(2);
  Call c0(ranks[0], Input(Request("s", 4, Batch(14), kCap)));
  Call c1(ranks[1], Input(Request("s", 4, Batch(15), kCap * 2)));
  const absl::Status s0 = c0.Wait().status();
  EXPECT_EQ(s0.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s0, c1.Wait().status());
}

// PlanDynamicCp's agreement round (RoundInput::agree_only): the ranks compare the step's
// fingerprint and plan nothing in the round.
v1::PlanDynamicCpRequest Step(int64_t round, int64_t rank) {
  v1::PlanDynamicCpRequest r;
  for (const int64_t length : {4000, 300, 9000, 1200}) r.add_lengths(length);
  r.set_world_size(4);
  r.mutable_options()->set_max_tokens_per_rank(3000);
  r.set_stream("dcp");
  r.set_round(round);
  r.set_rank(rank);
  return r;
}

RoundInput StepRound(const v1::PlanDynamicCpRequest& request) {
  absl::StatusOr<RoundInput> input = ToDynamicCpRound(request, ServiceLimits{});
  return input.ok() ? *std::move(input) : RoundInput{};
}

TEST(CoordinatorGroup, AStepRoundAgreesTheStepAndPlansNothing) {
  Ranks ranks(2);
  Call c0(ranks[0], StepRound(Step(1, 0)));
  Call c1(ranks[1], StepRound(Step(1, 1)));
  for (Call* c : {&c0, &c1}) {
    const Result& r = c->Wait();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->num_micro_batches, 1);
    EXPECT_TRUE((*r)->plan.parts.empty());
    EXPECT_EQ((*r)->global.world_size, 2);
  }
  // Another rank's view of the same step on this sidecar is the same round: served from the
  // cache, not run again.
  ASSERT_TRUE(SubmitAndWait(ranks[0], StepRound(Step(1, 3))).ok());
  EXPECT_EQ(ranks[0].GetStats().cache_hits, 1);
  EXPECT_EQ(ranks[0].GetStats().rounds, 1);
}

TEST(CoordinatorGroup, AStepThatDiffersFailsTheRoundOnEveryRank) {
  Ranks ranks(2);
  v1::PlanDynamicCpRequest other = Step(2, 1);
  other.set_lengths(2, 9001);
  Call c0(ranks[0], StepRound(Step(2, 0)));
  Call c1(ranks[1], StepRound(other));
  const absl::Status s0 = c0.Wait().status();
  EXPECT_EQ(s0.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(group::IsOptionsMismatch(s0)) << s0;
  EXPECT_EQ(s0, c1.Wait().status());
  EXPECT_THAT(ExplainStepRound(s0).message(), HasSubstr("the ranks sent different steps"));
  EXPECT_THAT(s0.message(), HasSubstr("rank 1 has fingerprint"));
}

// A Plan round and a PlanDynamicCp round of the same (stream, round) on two ranks: a mismatch.
TEST(CoordinatorGroup, APlanRoundMeetingAStepRoundIsFailedPrecondition) {
  Ranks ranks(2);
  Call c0(ranks[0], Input(Request("dcp", 3, Batch(16), kCap)));
  Call c1(ranks[1], StepRound(Step(3, 1)));
  const absl::Status s0 = c0.Wait().status();
  EXPECT_EQ(s0.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s0, c1.Wait().status());
}

// Rounds that reach two sidecars in opposite orders: rank 0 runs 5 while rank 1 runs 6, then 6
// against 5. Both rounds fail on both ranks, and each rank's error names its own round first
// (the agreed message names rank 0's) and the rule callers must follow.
TEST(CoordinatorGroup, RoundsInOppositeOrdersFailBothNamingEachRanksOwnRound) {
  Ranks ranks(2);
  Call a5(ranks[0], Input(Request("s", 5, Batch(5), kCap)));
  Call a6(ranks[0], Input(Request("s", 6, Batch(6), kCap)));
  Call b6(ranks[1], Input(Request("s", 6, Batch(7), kCap)));
  b6.Wait();  // before rank 1 gets round 5, so its worker ran 6 first
  Call b5(ranks[1], Input(Request("s", 5, Batch(8), kCap)));
  for (auto [call, round] : {std::pair<Call*, int>{&a5, 5}, {&a6, 6}, {&b5, 5}, {&b6, 6}}) {
    const absl::Status status = call->Wait().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(
        std::string(status.message()),
        ::testing::StartsWith(absl::StrCat("stream 's' round ", round, " (this sidecar's)")));
    EXPECT_THAT(status.message(), HasSubstr("ranks disagree on the round"));
    EXPECT_THAT(status.message(), HasSubstr("must reach every sidecar in increasing order"));
  }
  EXPECT_THAT(b5.Wait().status().message(), HasSubstr("rank 0 has 6, rank 1 has 5"));
  // Other failures keep the agreed message as it is (identical on every rank).
  Call c0(ranks[0], Input(Request("s", 7, Batch(14), kCap)));
  Call c1(ranks[1], Input(Request("s", 7, Batch(15), kCap * 2)));
  EXPECT_EQ(c0.Wait().status(), c1.Wait().status());
  EXPECT_THAT(c0.Wait().status().message(), ::testing::Not(HasSubstr("this sidecar's")));
}

// Through the rank group's lifecycle (group/group.h), as the sidecar runs with --world_size:
// a group of one (the default: no store), and two ranks over Gloo on loopback.
TEST(CoordinatorRankGroup, AGroupOfOne) {
  RoundCoordinator coordinator(OfOne());
  EXPECT_TRUE(SubmitAndWait(coordinator, Input(Request("s", 1, Batch(21), kCap))).ok());
  const RoundCoordinator::Stats stats = coordinator.GetStats();
  EXPECT_EQ(stats.world_size, 1);
  EXPECT_EQ(stats.backend, "local");
  EXPECT_TRUE(stats.group_ready);
  EXPECT_EQ(stats.generation, 0);
}

TEST(CoordinatorRankGroup, TwoRanksOverGlooAgree) {
  collective::InMemoryStore store;
  std::vector<std::unique_ptr<group::Group>> groups;
  std::vector<std::unique_ptr<RoundCoordinator>> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    group::GroupOptions group_options;
    group_options.rank = r;
    group_options.world_size = 2;
    group_options.backend = collective::Backend::kGloo;
    group_options.gloo.hostname = "127.0.0.1";
    group_options.collective_timeout = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<group::Group>> group =
        group::Group::Create(&store, group_options);
    ASSERT_TRUE(group.ok()) << group.status();
    groups.push_back(*std::move(group));
    RoundCoordinator::Options options;
    options.agreements = std::make_shared<group::GroupAgreements>(*groups.back());
    ranks.push_back(std::make_unique<RoundCoordinator>(std::move(options)));
  }
  for (int64_t round = 1; round <= 2; ++round) {
    Call c0(*ranks[0], Input(Request("actor", round, Batch(22 + round, 512), kCap)));
    Call c1(*ranks[1], Input(Request("actor", round, {100, 200}, kCap)));
    const Result& r0 = c0.Wait();
    const Result& r1 = c1.Wait();
    ASSERT_TRUE(r0.ok()) << r0.status();
    ASSERT_TRUE(r1.ok()) << r1.status();
    EXPECT_EQ((*r1)->num_micro_batches, (*r0)->local_k);
    EXPECT_EQ((*r0)->global.num_sequences, 514);
    EXPECT_EQ((*r1)->global.world_size, 2);
  }
  const RoundCoordinator::Stats stats = ranks[1]->GetStats();
  EXPECT_EQ(stats.world_size, 2);
  EXPECT_EQ(stats.backend, "gloo");
  EXPECT_TRUE(stats.group_ready);
  EXPECT_GE(stats.generation, 0);
  for (auto& rank : ranks) rank->Shutdown();  // before the groups they use
}

}  // namespace
}  // namespace packsched::service
