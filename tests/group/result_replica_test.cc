// Agreed results that outlive any one sidecar (result_replica.h), and the rank group's agreement
// taking them instead of running a finished round again (group_agreement.h): ranks are threads
// over Gloo on loopback and one in-memory store; a "restart" is a new Group (rank 0: a new run
// epoch) in place of the old one.

#include "server/group/result_replica.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/group_agreement.h"
#include "server/group/group_keys.h"
#include "server/group/round.h"
#include "tests/group/group_testing.h"
#include "tests/testing/ignore_sigpipe.h"  // Gloo groups whose peers go away

namespace packsched::group {
namespace {

using collective::InMemoryStore;

constexpr absl::Duration kTimeout = absl::Seconds(3);
constexpr ReplicaOptions kFast = {absl::Milliseconds(50), absl::Milliseconds(20)};

GroupOptions Options(int64_t rank, int64_t world_size) {
  GroupOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.backend = collective::Backend::kGloo;
  options.collective_timeout = kTimeout;
  options.gloo.hostname = "127.0.0.1";
  options.can_use_nccl = false;
  return options;
}

std::unique_ptr<Group> MakeGroup(InMemoryStore& store, GroupOptions options) {
  absl::StatusOr<std::unique_ptr<Group>> group = Group::Create(&store, std::move(options));
  EXPECT_TRUE(group.ok()) << group.status();
  return *std::move(group);
}

// Polls `done` every 10 ms until it holds or `within` has passed.
template <typename Done>
bool Eventually(Done done, absl::Duration within = absl::Seconds(5)) {
  const absl::Time give_up = absl::Now() + within;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(ResultReplica, ARecordedResultIsReadByAnotherRankAndRankZeroTrimsOldOnes) {
  InMemoryStore store;
  GroupOptions options0 = Options(0, 2);
  options0.kept_results = 2;
  std::unique_ptr<Group> rank0 = MakeGroup(store, options0);
  std::unique_ptr<Group> rank1 = MakeGroup(store, Options(1, 2));
  ResultReplica writer(*rank0, kFast);
  ResultReplica reader(*rank1, kFast);
  for (int64_t round : {7, 8, 9}) writer.Record("actor", round, absl::StrCat("k=", round));
  const absl::Time deadline = absl::Now() + kTimeout;
  ASSERT_TRUE(Eventually([&] {
    auto found = reader.Lookup("actor", 9, absl::ZeroDuration(), deadline);
    return found.ok() && found->has_value();
  }));
  EXPECT_TRUE(Eventually([&] {  // round 7 is beyond kept_results: deleted
    auto found = reader.Lookup("actor", 7, absl::ZeroDuration(), deadline);
    return found.ok() && !found->has_value();
  }));
  EXPECT_EQ(*reader.Lookup("actor", 8, absl::ZeroDuration(), deadline), "k=8");
  EXPECT_EQ(*reader.Lookup("actor", 10, absl::ZeroDuration(), deadline), std::nullopt);
  EXPECT_EQ(*reader.Lookup("critic", 9, absl::ZeroDuration(), deadline), std::nullopt);
}

// Rank 0's store starts empty under a new epoch when rank 0 restarts: every other rank writes
// what it keeps into it, with its membership and its mark, and the new rank 0 finds it.
TEST(ResultReplica, ARestartedRankZeroFindsWhatTheOthersKept) {
  InMemoryStore store;
  std::unique_ptr<Group> rank0 = MakeGroup(store, Options(0, 3));
  std::unique_ptr<Group> rank1 = MakeGroup(store, Options(1, 3));
  std::unique_ptr<Group> rank2 = MakeGroup(store, Options(2, 3));
  auto replica0 = std::make_unique<ResultReplica>(*rank0, kFast);
  ResultReplica replica1(*rank1, kFast);
  ResultReplica replica2(*rank2, kFast);
  ASSERT_TRUE(Eventually([&] { return replica1.epochs_replicated() == 1; }));
  replica1.Record("actor", 4, "agreed-4");  // rank 2 missed it; rank 1 kept it
  replica0.reset();
  rank0 = MakeGroup(store, Options(0, 3));  // a new epoch: nothing of the old one is read
  ResultReplica restarted(*rank0, kFast);
  // Rank 0 publishes its new epoch (as its readiness watch does at start-up).
  ASSERT_TRUE(rank0->AwaitMembers(absl::Now()).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<std::string>> found =
      restarted.Lookup("actor", 4, absl::ZeroDuration(), start + kTimeout);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, "agreed-4");
  EXPECT_LT(absl::Now() - start, kTimeout);
  EXPECT_TRUE(Eventually(
      [&] { return replica1.epochs_replicated() == 2 && replica2.epochs_replicated() == 2; }));
  // The others republished their membership too: the restarted rank 0 is ready without a round.
  absl::StatusOr<bool> ready = rank0->AwaitMembers(absl::Now() + kTimeout);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_TRUE(*ready);
  // A round nobody kept is not found once every mark is there: no waiting.
  const absl::Time again = absl::Now();
  EXPECT_EQ(*restarted.Lookup("actor", 5, absl::ZeroDuration(), again + kTimeout), std::nullopt);
  EXPECT_LT(absl::Now() - again, kTimeout / 2);
}

// Rank 0's store as a rank other than 0 reaches it over a connection: the in-memory store, and a
// connection that the test drops (rank 0 died) with Drop().
class ConnectedStore final : public group::testing::ForwardingStore {
 public:
  explicit ConnectedStore(InMemoryStore& inner) : inner_(inner) {}
  void Drop() {
    absl::MutexLock lock(&mu_);
    dropped_ = true;
  }
  absl::StatusOr<bool> AwaitDisconnect(absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&dropped_), deadline);
    return std::exchange(dropped_, false);
  }

 private:
  KeyValueStore& Inner() override { return inner_; }
  InMemoryStore& inner_;
  absl::Mutex mu_;
  bool dropped_ ABSL_GUARDED_BY(mu_) = false;
};

// A rank reads the epoch as soon as its connection to rank 0 drops, not at its next poll: what
// makes a restarted rank 0 heal within its reconnection.
TEST(ResultReplica, ADroppedConnectionToRankZeroIsANewEpochReadAtOnce) {
  InMemoryStore store;
  ConnectedStore connection(store);
  std::unique_ptr<Group> rank0 = MakeGroup(store, Options(0, 2));
  absl::StatusOr<std::unique_ptr<Group>> created = Group::Create(&connection, Options(1, 2));
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Group> rank1 = *std::move(created);
  auto replica0 = std::make_unique<ResultReplica>(*rank0, kFast);
  // A poll far beyond the test: only the watch can make it read the epoch again.
  ResultReplica replica1(*rank1, ReplicaOptions{absl::Hours(1), absl::Milliseconds(20)});
  ASSERT_TRUE(Eventually([&] { return replica1.epochs_replicated() == 1; }));
  replica1.Record("actor", 4, "agreed-4");
  // Written: the writer is idle again (it reads the epoch each time it wakes for work).
  ASSERT_TRUE(Eventually([&] {
    auto found = replica0->Lookup("actor", 4, absl::ZeroDuration(), absl::Now() + kTimeout);
    return found.ok() && found->has_value();
  }));

  replica0.reset();
  rank0 = MakeGroup(store, Options(0, 2));  // restarted: a new epoch
  ResultReplica restarted(*rank0, kFast);
  ASSERT_TRUE(rank0->AwaitMembers(absl::Now()).ok());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(replica1.epochs_replicated(), 1);  // its connection has not dropped (yet)

  const absl::Time dropped = absl::Now();
  connection.Drop();
  EXPECT_TRUE(Eventually([&] { return replica1.epochs_replicated() == 2; }, absl::Seconds(2)));
  EXPECT_LT(absl::Now() - dropped, absl::Seconds(1));
  EXPECT_EQ(*restarted.Lookup("actor", 4, absl::ZeroDuration(), absl::Now() + kTimeout),
            "agreed-4");
}

TEST(ResultReplica, RankZeroWaitsForAMissingRanksMarkOnlyUntilTheDeadline) {
  InMemoryStore store;
  std::unique_ptr<Group> rank0 = MakeGroup(store, Options(0, 2));
  ResultReplica replica(*rank0, kFast);  // rank 1 never comes
  ASSERT_TRUE(rank0->AwaitMembers(absl::Now()).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<std::string>> found =
      replica.Lookup("actor", 1, absl::ZeroDuration(), start + absl::Milliseconds(300));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, std::nullopt);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// After a failed collective a lookup waits up to `settle` for a peer's write still on its way.
TEST(ResultReplica, ALookupSettlesForALateWrite) {
  InMemoryStore store;
  std::unique_ptr<Group> rank0 = MakeGroup(store, Options(0, 2));
  std::unique_ptr<Group> rank1 = MakeGroup(store, Options(1, 2));
  ResultReplica replica0(*rank0, kFast);
  ResultReplica replica1(*rank1, kFast);
  ASSERT_TRUE(Eventually([&] { return replica1.epochs_replicated() == 1; }));
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(200));
    replica0.Record("actor", 3, "agreed-3");
  });
  const absl::Time deadline = absl::Now() + kTimeout;
  EXPECT_EQ(*replica1.Lookup("actor", 3, absl::ZeroDuration(), deadline), std::nullopt);
  EXPECT_EQ(*replica1.Lookup("actor", 3, absl::Seconds(2), deadline), "agreed-3");
  late.join();
}

// --- The rank group's agreement over the replica (GroupAgreements). ---

RoundRecord Record(int64_t rank, int64_t round) {
  RoundRecord record;
  record.stream = "actor";
  record.round = round;
  record.options_hash = 5;
  record.version = 1;
  record.local_k = 2 + rank;
  record.num_sequences = 10 + rank;
  record.loss_tokens = 100 * (rank + 1);
  record.sequences_with_loss = 9;
  return record;
}

struct Sidecar {
  Sidecar(InMemoryStore& store, int64_t rank, int64_t world_size)
      : group(MakeGroup(store, Options(rank, world_size))),
        agreements(std::make_unique<GroupAgreements>(*group, kFast)),
        stream(agreements->ForStream("actor")) {}
  ~Sidecar() {
    stream.reset();
    agreements.reset();
  }
  std::unique_ptr<Group> group;
  std::unique_ptr<GroupAgreements> agreements;
  std::unique_ptr<RoundAgreement> stream;
};

std::vector<absl::StatusOr<AgreedRound>> AgreeAll(std::vector<std::unique_ptr<Sidecar>>& ranks,
                                                  int64_t round) {
  std::vector<absl::StatusOr<AgreedRound>> results(ranks.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back(
        [&, r] { results[r] = ranks[r]->stream->Agree(Record(static_cast<int64_t>(r), round)); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

void ExpectSame(const AgreedRound& got, const AgreedRound& want) {
  EXPECT_EQ(got.k, want.k);
  EXPECT_EQ(got.min_local_k, want.min_local_k);
  EXPECT_EQ(got.num_sequences, want.num_sequences);
  EXPECT_EQ(got.loss_tokens, want.loss_tokens);
  EXPECT_EQ(got.sequences_with_loss, want.sequences_with_loss);
  EXPECT_EQ(got.world_size, want.world_size);
}

// For every rank r of a group of 3: rounds 1 and 2 finished on every rank; r restarts (rank 0
// with a new epoch and an empty store); r alone asks for round 2 again and gets the values the
// group agreed, within the collective timeout, while the others stay idle.
TEST(GroupAgreements, ARestartedRankAloneGetsTheAgreedRoundWhicheverRankItIs) {
  for (int64_t restarted = 0; restarted < 3; ++restarted) {
    SCOPED_TRACE(absl::StrCat("restarted rank ", restarted));
    InMemoryStore store;
    std::vector<std::unique_ptr<Sidecar>> ranks;
    for (int64_t r = 0; r < 3; ++r) ranks.push_back(std::make_unique<Sidecar>(store, r, 3));
    AgreeAll(ranks, 1);
    std::vector<absl::StatusOr<AgreedRound>> agreed = AgreeAll(ranks, 2);
    for (const auto& result : agreed) ASSERT_TRUE(result.ok()) << result.status();
    // Independently: k is the largest local bound, the counts are sums over the ranks.
    EXPECT_EQ(agreed[0]->k, 4);
    EXPECT_EQ(agreed[0]->num_sequences, 33);
    EXPECT_EQ(agreed[0]->loss_tokens, 600);

    ranks[restarted].reset();
    ranks[restarted] = std::make_unique<Sidecar>(store, restarted, 3);
    if (restarted == 0) {
      ASSERT_TRUE(ranks[0]->group->AwaitMembers(absl::Now()).ok());
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<AgreedRound> again = ranks[restarted]->stream->Agree(Record(restarted, 2));
    ASSERT_TRUE(again.ok()) << again.status();
    ExpectSame(*again, *agreed[0]);
    EXPECT_LT(absl::Now() - start, kTimeout);

    // And the group goes on together.
    for (const auto& result : AgreeAll(ranks, 3)) EXPECT_TRUE(result.ok()) << result.status();
  }
}

// A round that never finished anywhere is not taken from the store: run alone, it times out.
TEST(GroupAgreements, ARoundNobodyFinishedIsRunNotInvented) {
  InMemoryStore store;
  std::vector<std::unique_ptr<Sidecar>> ranks;
  for (int64_t r = 0; r < 2; ++r) ranks.push_back(std::make_unique<Sidecar>(store, r, 2));
  for (const auto& result : AgreeAll(ranks, 1)) ASSERT_TRUE(result.ok()) << result.status();
  absl::StatusOr<AgreedRound> alone = ranks[1]->stream->Agree(Record(1, 2));
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded) << alone.status();
  // Both ranks send round 2 again (the first resend may fail on the generation rank 1 ended): it
  // runs and agrees.
  bool agreed = false;
  for (int attempt = 0; attempt < 3 && !agreed; ++attempt) {
    std::vector<absl::StatusOr<AgreedRound>> results = AgreeAll(ranks, 2);
    agreed = results[0].ok() && results[1].ok();
    if (agreed) {
      EXPECT_EQ(results[0]->k, 3);
    }
  }
  EXPECT_TRUE(agreed);
}

}  // namespace
}  // namespace packsched::group
