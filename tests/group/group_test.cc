// The group lifecycle over Gloo on loopback, threads as ranks (each with its own Group, as each
// sidecar process has), sharing one in-memory rendezvous store.

#include "server/group/group.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/group_keys.h"
#include "server/group/stream_group.h"
#include "tests/group/group_testing.h"

namespace packsched::group {
namespace {

using collective::Backend;
using collective::CanUseNccl;
using collective::GlooOptions;
using collective::InMemoryStore;
using collective::KeyValueStore;
using collective::ParseBackend;

using ::packsched::group::testing::ForwardingStore;
using ::packsched::group::testing::Rank;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Milliseconds(1500);
constexpr absl::Duration kMargin = absl::Milliseconds(700);

GroupOptions Options(int64_t rank, int64_t world_size, Backend backend = Backend::kGloo) {
  GroupOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.backend = backend;
  options.collective_timeout = kTimeout;
  options.gloo.hostname = "127.0.0.1";
  options.can_use_nccl = false;  // thread-ranks share one machine: never NCCL here
  return options;
}

std::vector<std::unique_ptr<Rank>> MakeRanks(KeyValueStore& store, int64_t world_size,
                                             Backend backend = Backend::kGloo) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int64_t r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<Rank>(store, Options(r, world_size, backend)));
  }
  return ranks;
}

RoundRecord Record(int64_t rank, int64_t round) {
  RoundRecord record;
  record.stream = "actor";
  record.round = round;
  record.options_hash = 77;
  record.version = 1;
  record.local_k = 1 + (rank * 3) % 5;
  record.num_sequences = 10 + rank;
  record.loss_tokens = 100 * (rank + 1);
  record.sequences_with_loss = 10 + rank;
  return record;
}

using Result = absl::StatusOr<AgreedRound>;

// Runs body(rank) on one thread per rank listed in `who`; results by rank (others: Cancelled).
std::vector<Result> OnRanks(int64_t world_size, const std::vector<int64_t>& who,
                            const std::function<Result(int64_t)>& body) {
  std::vector<Result> results(world_size, absl::CancelledError("did not run"));
  std::vector<std::thread> threads;
  for (int64_t r : who) threads.emplace_back([&, r] { results[r] = body(r); });
  for (std::thread& t : threads) t.join();
  return results;
}

// Every rank's AwaitMembers at once (each publishes its membership); rank 0's result.
absl::StatusOr<bool> OnRanksReady(std::vector<std::unique_ptr<Rank>>& ranks) {
  std::vector<absl::StatusOr<bool>> ready(ranks.size(), false);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back(
        [&, r] { ready[r] = ranks[r]->group->AwaitMembers(absl::Now() + absl::Seconds(5)); });
  }
  for (std::thread& t : threads) t.join();
  return ready[0];
}

std::vector<int64_t> All(int64_t world_size) {
  std::vector<int64_t> all(world_size);
  for (int64_t r = 0; r < world_size; ++r) all[r] = r;
  return all;
}

void ExpectAgreed(const std::vector<Result>& results, int64_t world_size, int64_t round) {
  int64_t k = 0, sequences = 0;
  for (int64_t r = 0; r < world_size; ++r) {
    k = std::max(k, Record(r, round).local_k);
    sequences += Record(r, round).num_sequences;
  }
  for (const Result& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->k, k);
    EXPECT_EQ(result->num_sequences, sequences);
  }
}

TEST(Group, RanksStartingInAnyOrderFormAndAgree) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 4);
  // Rank 0 (which publishes the run epoch) comes last.
  std::vector<Result> results = OnRanks(4, {0, 1, 2, 3}, [&](int64_t r) {
    absl::SleepFor(absl::Milliseconds(r == 0 ? 300 : 20 * r));
    return ranks[r]->stream->Agree(Record(r, 1));
  });
  ExpectAgreed(results, 4, 1);
  for (const auto& rank : ranks) {
    const GroupInfo info = rank->stream->info();
    EXPECT_TRUE(info.formed);
    EXPECT_EQ(info.backend, "gloo");
    EXPECT_EQ(info.generation, 0);
    EXPECT_EQ(info.epoch, ranks[0]->stream->info().epoch);
  }
}

TEST(Group, AutoWithoutNcclEverywherePicksGloo) {
  InMemoryStore store;
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int64_t r = 0; r < 3; ++r) {
    GroupOptions options = Options(r, 3, Backend::kAuto);
    options.can_use_nccl = r != 1;  // one rank without a GPU is enough to rule NCCL out
    ranks.push_back(std::make_unique<Rank>(store, options));
  }
  std::vector<Result> results =
      OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 0)); });
  ExpectAgreed(results, 3, 0);
  for (const auto& rank : ranks) EXPECT_EQ(rank->stream->info().backend, "gloo");
}

TEST(Group, AutoOnThisMachineFallsBackToGloo) {
  if (CanUseNccl()) GTEST_SKIP() << "this machine has a GPU and NCCL";
  InMemoryStore store;
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    GroupOptions options = Options(r, 2, Backend::kAuto);
    options.can_use_nccl.reset();  // ask the machine
    ranks.push_back(std::make_unique<Rank>(store, options));
  }
  std::vector<Result> results =
      OnRanks(2, All(2), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 0)); });
  ExpectAgreed(results, 2, 0);
  EXPECT_EQ(ranks[0]->stream->info().backend, "gloo");
}

TEST(Group, MembersAreAwaitedInSlicesUntilEveryRankHasJoined) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  auto soon = [] { return absl::Now() + absl::Milliseconds(100); };
  // Rank 2 before rank 0 has published the epoch: not complete, no error.
  absl::StatusOr<bool> early = ranks[2]->group->AwaitMembers(soon());
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(*early);
  // Rank 0 sees itself, then waits for rank 1 (rank 2 has not published yet either: the epoch
  // was unknown to it).
  absl::StatusOr<bool> zero = ranks[0]->group->AwaitMembers(soon());
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_FALSE(*zero);
  EXPECT_EQ(ranks[0]->group->members_seen(), 1);
  EXPECT_FALSE(ranks[0]->group->ready());
  ASSERT_FALSE(*ranks[1]->group->AwaitMembers(soon()));  // joins; not complete yet
  ASSERT_FALSE(*ranks[0]->group->AwaitMembers(soon()));  // resumes: rank 1 seen, rank 2 not
  EXPECT_EQ(ranks[0]->group->members_seen(), 2);
  ASSERT_FALSE(*ranks[2]->group->AwaitMembers(soon()));  // joins now
  EXPECT_TRUE(*ranks[0]->group->AwaitMembers(soon()));
  EXPECT_EQ(ranks[0]->group->members_seen(), 3);
  for (int64_t r = 0; r < 3; ++r) {
    absl::StatusOr<bool> done = ranks[r]->group->AwaitMembers(soon());
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(*done) << "rank " << r;
    EXPECT_TRUE(ranks[r]->group->ready());
  }
  // No stream was formed for it: readiness costs store keys only.
  EXPECT_FALSE(ranks[0]->stream->info().formed);
}

TEST(Group, AGroupOfOneIsReadyAtOnce) {
  InMemoryStore store;
  GroupOptions options;
  options.backend = Backend::kLocal;
  auto group = Group::Create(&store, options);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_TRUE((*group)->serving());  // before anyone asks
  EXPECT_TRUE(*(*group)->AwaitMembers(absl::Now()));
  EXPECT_TRUE((*group)->ready());
}

TEST(Group, ARankThatNeverComesIsNamedWhenTheGroupCannotForm) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  std::vector<Result> results = OnRanks(3, {0, 1}, [&](int64_t r) -> Result {
    const absl::Time start = absl::Now();
    Result result = ranks[r]->stream->Agree(Record(r, 0));
    EXPECT_LT(absl::Now() - start, kTimeout + kMargin);
    return result;
  });
  for (int64_t r : {0, 1}) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(results[r].status().message()), HasSubstr("ranks [2] did not join"));
  }
}

TEST(Group, ARankMissingFromARoundIsNamedAndTheNextGenerationHeals) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               3, 1);

  // Round 2: rank 1 does not come.
  std::vector<Result> failed = OnRanks(3, {0, 2}, [&](int64_t r) -> Result {
    const absl::Time start = absl::Now();
    Result result = ranks[r]->stream->Agree(Record(r, 2));
    EXPECT_LT(absl::Now() - start, kTimeout + kMargin);
    return result;
  });
  for (int64_t r : {0, 2}) {
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(failed[r].status().message()),
                HasSubstr("round 2: ranks [1] did not arrive"));
    EXPECT_FALSE(ranks[r]->stream->info().formed);
  }

  // Round 3: everyone, rank 1 included (still holding generation 0), re-forms and agrees.
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 3)); }),
               3, 3);
  for (const auto& rank : ranks) EXPECT_EQ(rank->stream->info().generation, 1);
}

// A rank that finished the round (its collective completed before a link to the others failed;
// its agreed result is in the store) is not named as missing: the ranks whose collective timed
// out say that their peers finished it, and name nobody.
TEST(Group, ARankThatFinishedTheRoundIsNotNamedMissing) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               3, 1);
  // Rank 1 finished round 2 and wrote its result (result_replica.h) before the link failed.
  absl::StatusOr<std::optional<std::string>> epoch =
      store.TryGet(keys::Epoch("packsched/"), absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(epoch.ok() && epoch->has_value());
  const std::string result_key =
      keys::Result(keys::StreamRoot(keys::EpochRoot("packsched/", **epoch), "actor"), 2);
  ASSERT_TRUE(store.Set(result_key, "v1 5 1 33 600 33 77 1", absl::Now() + absl::Seconds(1)).ok());
  std::vector<Result> failed =
      OnRanks(3, {0, 2}, [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 2)); });
  for (int64_t r : {0, 2}) {
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(failed[r].status().message()),
                HasSubstr("round 2: its peers finished it"));
    EXPECT_THAT(std::string(failed[r].status().message()), Not(HasSubstr("[1]")));
  }
}

// The same when the generation must form first: a rank whose stream was made again (a restart)
// runs a round its peers finished without it; they do not come to form, and are not named.
TEST(Group, PeersThatFinishedTheRoundAreNotNamedWhenTheGroupCannotForm) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               3, 1);
  absl::StatusOr<std::optional<std::string>> epoch =
      store.TryGet(keys::Epoch("packsched/"), absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(epoch.ok() && epoch->has_value());
  ASSERT_TRUE(
      store
          .Set(keys::Result(keys::StreamRoot(keys::EpochRoot("packsched/", **epoch), "actor"), 2),
               "v1 5 1 33 600 33 77 1", absl::Now() + absl::Seconds(1))
          .ok());
  ranks[0]->stream.reset();
  ranks[0]->stream = ranks[0]->group->ForStream("actor");
  Result alone = ranks[0]->stream->Agree(Record(0, 2));
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(alone.status().message()), HasSubstr("round 2: its peers finished it"));
  EXPECT_THAT(std::string(alone.status().message()), Not(HasSubstr("[1, 2]")));
}

// Regression: the rank that arrives first times out first and closes its connections; a rank
// that arrived later, still waiting, used to see that as a reset (ABORTED) instead of the
// timeout naming the missing rank.
TEST(Group, RanksArrivingAtDifferentTimesAllReportTheMissingRank) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               3, 1);
  std::vector<Result> failed = OnRanks(3, {0, 1}, [&](int64_t r) -> Result {
    if (r == 0) absl::SleepFor(kTimeout / 3);  // rank 1's deadline comes well before rank 0's
    return ranks[r]->stream->Agree(Record(r, 2));
  });
  for (int64_t r : {0, 1}) {
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kDeadlineExceeded) << failed[r].status();
    EXPECT_THAT(std::string(failed[r].status().message()),
                HasSubstr("round 2: ranks [2] did not arrive"));
  }
}

TEST(Group, APeerThatDiesAbortsTheRoundAndItsRestartHealsTheGroup) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               3, 1);

  // Rank 2's process dies while ranks 0 and 1 wait in round 2.
  std::thread crash([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ranks[2].reset();
  });
  std::vector<Result> failed = OnRanks(3, {0, 1}, [&](int64_t r) -> Result {
    const absl::Time start = absl::Now();
    Result result = ranks[r]->stream->Agree(Record(r, 2));
    EXPECT_LT(absl::Now() - start, kTimeout);  // an abort, well before the timeout
    return result;
  });
  crash.join();
  for (int64_t r : {0, 1}) {
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kAborted) << failed[r].status();
  }

  // It restarts (empty memory, same rank); the survivors were never restarted.
  ranks[2] = std::make_unique<Rank>(store, Options(2, 3));
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 3)); }),
               3, 3);
  for (const auto& rank : ranks) EXPECT_EQ(rank->stream->info().generation, 1);
}

// What GetStatus.group_ready and the readiness probe report: off from a failed round until the
// group forms again (regression: the probe stayed on while group_ready was off).
TEST(Group, ServingIsOffBetweenGenerationsAndTellsItsListener) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 2);
  std::vector<bool> told;
  ranks[0]->group->SetServingListener([&](bool serving) { told.push_back(serving); });
  ExpectAgreed(OnRanks(2, All(2), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               2, 1);
  EXPECT_TRUE(ranks[0]->group->serving());

  ranks[1].reset();  // its process dies
  EXPECT_EQ(ranks[0]->stream->Agree(Record(0, 2)).status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(ranks[0]->group->serving());
  EXPECT_TRUE(ranks[0]->group->ready());  // every rank did join the run

  ranks[1] = std::make_unique<Rank>(store, Options(1, 2));
  ExpectAgreed(OnRanks(2, All(2), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 3)); }),
               2, 3);
  EXPECT_TRUE(ranks[0]->group->serving());
  EXPECT_THAT(told, ::testing::ElementsAre(false, true, false, true));
  ranks[0]->group->SetServingListener(nullptr);
}

TEST(Group, ARankRestartedBetweenRoundsEndsItsOldGenerationSoTheNextRoundSucceeds) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 3);
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               3, 1);
  // Rank 2 dies and restarts between rounds; the survivors have not noticed.
  ranks[2].reset();
  ranks[2] = std::make_unique<Rank>(store, Options(2, 3));
  // The restarted rank comes first: its first formation ends generation 0 (its old self joined
  // it), so the survivors re-form at their next call instead of failing on dead connections.
  std::vector<Result> results = OnRanks(3, All(3), [&](int64_t r) {
    if (r != 2) absl::SleepFor(absl::Milliseconds(300));
    return ranks[r]->stream->Agree(Record(r, 2));
  });
  ExpectAgreed(results, 3, 2);
  for (const auto& rank : ranks) EXPECT_EQ(rank->stream->info().generation, 1);
}

// A store whose generation bumps land late: a generation's end is recorded first and the
// number moves on after, and other ranks can read both in between.
class SlowBumps final : public ForwardingStore {
 public:
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired,
                                            absl::Time deadline) override {
    if (expected.has_value() && absl::EndsWith(key, "/generation")) {
      absl::SleepFor(absl::Milliseconds(400));
    }
    return store_.CompareAndSet(key, expected, desired, deadline);
  }

 private:
  KeyValueStore& Inner() override { return store_; }
  InMemoryStore store_;
};

// A survivor that learns of a restart from the recorded cause re-forms before the restarted
// rank's bump has landed: it must not join the ended generation (whose addresses include the
// dead process's) but the next one, with the restarted rank.
TEST(Group, AnEndedGenerationIsNeverJoinedEvenBeforeItsNumberMovesOn) {
  SlowBumps store;
  auto ranks = MakeRanks(store, 2);
  ExpectAgreed(OnRanks(2, All(2), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               2, 1);
  ranks[1].reset();
  ranks[1] = std::make_unique<Rank>(store, Options(1, 2));
  std::vector<Result> results = OnRanks(2, All(2), [&](int64_t r) {
    if (r == 0) absl::SleepFor(absl::Milliseconds(100));  // after rank 1 has recorded "restart"
    return ranks[r]->stream->Agree(Record(r, 2));
  });
  ExpectAgreed(results, 2, 2);
  for (const auto& rank : ranks) EXPECT_EQ(rank->stream->info().generation, 1);
}

// Rank 0 serves the store, so when rank 0 restarts the store starts empty too.
class RestartableStore final : public ForwardingStore {
 public:
  void Restart() {
    absl::MutexLock lock(&mu_);
    stores_.push_back(std::make_unique<InMemoryStore>());
  }

 private:
  // The store of the moment. Earlier ones stay alive: a call begun before a restart finishes on
  // the store it started with.
  KeyValueStore& Inner() override {
    absl::MutexLock lock(&mu_);
    return *stores_.back();
  }
  absl::Mutex mu_;
  std::vector<std::unique_ptr<InMemoryStore>> stores_ = [] {
    std::vector<std::unique_ptr<InMemoryStore>> stores;
    stores.push_back(std::make_unique<InMemoryStore>());
    return stores;
  }();
};

TEST(Group, WhenRankZeroRestartsWithItsStoreTheNextRoundFormsANewEpoch) {
  RestartableStore store;
  auto ranks = MakeRanks(store, 3);
  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 1)); }),
               3, 1);
  const std::string old_epoch = ranks[1]->stream->info().epoch;

  ranks[0].reset();
  store.Restart();
  ranks[0] = std::make_unique<Rank>(store, Options(0, 3));

  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 2)); }),
               3, 2);
  for (const auto& rank : ranks) {
    EXPECT_THAT(rank->stream->info().epoch, Not(old_epoch));
    EXPECT_EQ(rank->stream->info().epoch, ranks[0]->stream->info().epoch);
    EXPECT_EQ(rank->stream->info().generation, 0);
  }
}

// Regression: the survivors never publish their membership under the restarted rank 0's new
// epoch, so its readiness waited forever although the group had formed again.
TEST(Group, ARestartedRankZeroIsReadyOnceAStreamHasFormed) {
  RestartableStore store;
  auto ranks = MakeRanks(store, 3);
  absl::StatusOr<bool> ready = OnRanksReady(ranks);
  ASSERT_TRUE(ready.ok() && *ready) << ready.status();
  ranks[0].reset();
  store.Restart();
  ranks[0] = std::make_unique<Rank>(store, Options(0, 3));
  absl::StatusOr<bool> before = ranks[0]->group->AwaitMembers(absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(*before);

  ExpectAgreed(OnRanks(3, All(3), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 2)); }),
               3, 2);
  absl::StatusOr<bool> after = ranks[0]->group->AwaitMembers(absl::Now() + absl::Milliseconds(200));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*after);
  EXPECT_TRUE(ranks[0]->group->ready());
  EXPECT_EQ(ranks[0]->group->members_seen(), 3);
}

TEST(Group, ARoundThatFailsOnItsRecordsKeepsTheGeneration) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 2);
  std::vector<Result> failed = OnRanks(2, All(2), [&](int64_t r) {
    RoundRecord record = Record(r, 5);
    if (r == 1) record.error = absl::InvalidArgumentError("lengths[3] = 0");
    return ranks[r]->stream->Agree(record);
  });
  for (const Result& result : failed) {
    EXPECT_EQ(result.status(), absl::InvalidArgumentError("rank 1: lengths[3] = 0"));
  }
  ExpectAgreed(OnRanks(2, All(2), [&](int64_t r) { return ranks[r]->stream->Agree(Record(r, 6)); }),
               2, 6);
  EXPECT_EQ(ranks[0]->stream->info().generation, 0);
}

TEST(Group, StreamsAreIndependentGroups) {
  InMemoryStore store;
  auto ranks = MakeRanks(store, 2);
  std::vector<std::unique_ptr<StreamGroup>> critic;
  for (auto& rank : ranks) critic.push_back(rank->group->ForStream("critic"));
  // Each stream on its own thread per rank; rank 0 starts "critic" first, rank 1 "actor" first.
  std::vector<Result> actor(2), other(2);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      if (r == 0) absl::SleepFor(absl::Milliseconds(100));
      actor[r] = ranks[r]->stream->Agree(Record(r, 1));
    });
    threads.emplace_back([&, r] {
      if (r == 1) absl::SleepFor(absl::Milliseconds(100));
      RoundRecord record = Record(r, 9);
      record.stream = "critic";
      other[r] = critic[r]->Agree(record);
    });
  }
  for (std::thread& t : threads) t.join();
  ExpectAgreed(actor, 2, 1);
  for (const Result& result : other) EXPECT_TRUE(result.ok()) << result.status();
}

// An Abort() (a shutdown) ends the stream group for good, even when it comes before the stream
// has formed: a later round fails at once instead of forming.
TEST(Group, AnAbortedStreamGroupFailsEveryLaterRound) {
  InMemoryStore store;
  GroupOptions options;
  auto group = Group::Create(&store, options);
  ASSERT_TRUE(group.ok()) << group.status();
  auto never_formed = (*group)->ForStream("actor");
  never_formed->Abort();
  EXPECT_EQ(never_formed->Agree(Record(0, 3)).status().code(), absl::StatusCode::kAborted);
  auto formed = (*group)->ForStream("critic");
  ASSERT_TRUE(formed->Agree(Record(0, 3)).ok());
  formed->Abort();
  Result after = formed->Agree(Record(0, 4));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kAborted) << after.status();
}

TEST(Group, RejectsBadOptions) {
  InMemoryStore store;
  EXPECT_EQ(Group::Create(&store, Options(3, 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Group::Create(&store, Options(0, 2, Backend::kLocal)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Group::Create(nullptr, Options(0, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A sidecar without a store is a group of one through CollectiveAgreements, never a Group.
  EXPECT_EQ(Group::Create(nullptr, GroupOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  GroupOptions no_timeout = Options(0, 2);
  no_timeout.collective_timeout = absl::ZeroDuration();
  EXPECT_EQ(Group::Create(&store, no_timeout).status().code(), absl::StatusCode::kInvalidArgument);
  // Gloo's own algorithms have no formation watchdog: benchmarks only, never a sidecar's group.
  for (auto algorithm : {GlooOptions::Algorithm::kBcube, GlooOptions::Algorithm::kRing}) {
    GroupOptions gloos_own = Options(0, 2);
    gloos_own.gloo.algorithm = algorithm;
    EXPECT_THAT(Group::Create(&store, gloos_own).status().message(), HasSubstr("benchmarks only"));
  }
  EXPECT_THAT(ParseBackend("mpi").status().message(), HasSubstr("auto, gloo, nccl or local"));
}

}  // namespace
}  // namespace packsched::group
