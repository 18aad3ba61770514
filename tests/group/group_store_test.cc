// The group when rank 0's rendezvous store is gone or stopped, and the store's size over many
// failed rounds: threads as ranks over Gloo on loopback, as in group_test.cc.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/stream_group.h"
#include "tests/group/group_testing.h"

namespace packsched::group {
namespace {

using collective::Backend;
using collective::InMemoryStore;
using collective::KeyValueStore;

using ::packsched::group::testing::ForwardingStore;
using ::packsched::group::testing::Rank;

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Milliseconds(1500);
// The cleanup after a failed round (750 ms at most) plus scheduling noise.
constexpr absl::Duration kMargin = absl::Milliseconds(1200);

// Rank 0's store as the other ranks see it: up, stopped (SIGSTOP: every call waits until its
// deadline), or dead (calls wait for it to come back until their deadline, as gRPC's
// wait_for_ready does, except through FailFast(), where they fail at once).
class Rank0Store final : public ForwardingStore {
 public:
  enum class Mode { kUp, kStopped, kDead };

  Rank0Store() : fail_fast_(new Rank0Store(inner_, mode_)) {}
  void SetMode(Mode mode) { mode_->store(mode); }
  int64_t size() const { return inner_->size(); }
  KeyValueStore& FailFast() override { return fail_fast_ != nullptr ? *fail_fast_ : *this; }

 private:
  Rank0Store(std::shared_ptr<InMemoryStore> inner, std::shared_ptr<std::atomic<Mode>> mode)
      : inner_(std::move(inner)), mode_(std::move(mode)), fails_fast_(true) {}

  KeyValueStore& Inner() override { return *inner_; }
  absl::Status Admit(absl::Time deadline) override {
    const Mode mode = mode_->load();
    if (mode == Mode::kUp) return absl::OkStatus();
    if (mode == Mode::kDead && fails_fast_) return absl::UnavailableError("connection refused");
    absl::SleepFor(deadline - absl::Now());
    return absl::DeadlineExceededError("rank 0 did not answer in time");
  }

  std::shared_ptr<InMemoryStore> inner_ = std::make_shared<InMemoryStore>();
  std::shared_ptr<std::atomic<Mode>> mode_ = std::make_shared<std::atomic<Mode>>(Mode::kUp);
  const bool fails_fast_ = false;
  std::unique_ptr<Rank0Store> fail_fast_;
};

GroupOptions Options(int64_t rank, absl::Duration timeout = kTimeout) {
  GroupOptions options;
  options.rank = rank;
  options.world_size = 3;
  options.backend = Backend::kGloo;
  options.collective_timeout = timeout;
  options.gloo.hostname = "127.0.0.1";
  return options;
}

RoundRecord Record(int64_t round) {
  RoundRecord record;
  record.stream = "actor";
  record.round = round;
  record.local_k = 2;
  record.num_sequences = 4;
  return record;
}

struct Outcome {
  absl::Status status = absl::CancelledError("did not run");
  absl::Duration took;
};

// Runs body(rank) on one thread per rank in `who`.
std::vector<Outcome> OnRanks(const std::vector<int64_t>& who,
                             const std::function<absl::Status(int64_t)>& body) {
  std::vector<Outcome> outcomes(3);
  std::vector<std::thread> threads;
  for (int64_t r : who) {
    threads.emplace_back([&, r] {
      const absl::Time start = absl::Now();
      outcomes[r].status = body(r);
      outcomes[r].took = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return outcomes;
}

std::vector<std::unique_ptr<Rank>> FormedRanks(KeyValueStore& store,
                                               absl::Duration timeout = kTimeout) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int64_t r = 0; r < 3; ++r)
    ranks.push_back(std::make_unique<Rank>(store, Options(r, timeout)));
  for (const Outcome& o :
       OnRanks({0, 1, 2}, [&](int64_t r) { return ranks[r]->stream->Agree(Record(1)).status(); })) {
    EXPECT_TRUE(o.status.ok()) << o.status;
  }
  return ranks;
}

// Rank 0 is stopped: it neither calls the round nor answers the store. The survivors report the
// round's timeout by its deadline plus the cleanup margin, blaming the store, not themselves.
TEST(GroupStore, AStoppedRankZeroIsReportedAsTheStoreByTheRoundsDeadline) {
  Rank0Store store;
  auto ranks = FormedRanks(store);
  store.SetMode(Rank0Store::Mode::kStopped);
  std::vector<Outcome> outcomes =
      OnRanks({1, 2}, [&](int64_t r) { return ranks[r]->stream->Agree(Record(2)).status(); });
  store.SetMode(Rank0Store::Mode::kUp);
  for (int64_t r : {1, 2}) {
    EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kDeadlineExceeded) << outcomes[r].status;
    EXPECT_THAT(std::string(outcomes[r].status.message()),
                HasSubstr("rendezvous store (rank 0) unreachable"));
    EXPECT_THAT(std::string(outcomes[r].status.message()), Not(HasSubstr("ranks [")));
    EXPECT_LT(outcomes[r].took, kTimeout + kMargin) << "rank " << r;
  }
}

// Rank 0 died: the survivors' round aborts at once (its connections closed), and explaining it
// does not wait for the dead store.
TEST(GroupStore, ADeadRankZeroAbortsTheRoundWithoutWaitingForItsStore) {
  Rank0Store store;
  auto ranks = FormedRanks(store);
  store.SetMode(Rank0Store::Mode::kDead);
  ranks[0].reset();
  std::vector<Outcome> outcomes =
      OnRanks({1, 2}, [&](int64_t r) { return ranks[r]->stream->Agree(Record(2)).status(); });
  for (int64_t r : {1, 2}) {
    EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kAborted) << outcomes[r].status;
    EXPECT_THAT(std::string(outcomes[r].status.message()),
                HasSubstr("rendezvous store (rank 0) unreachable"));
    EXPECT_LT(outcomes[r].took, kTimeout) << "rank " << r;
  }
}

// Rounds and formations that fail while rank 2 is away leave nothing in the store once the group
// forms again: every ended generation's keys (arrival keys included) are deleted, however many.
TEST(GroupStore, FailedRoundsAndFormationsLeaveNoKeysBehind) {
  constexpr absl::Duration kShort = absl::Milliseconds(200);
  Rank0Store store;
  auto ranks = FormedRanks(store, kShort);
  const int64_t formed = store.size();
  int64_t round = 2;
  // Rank 2 forms each generation but never comes to its round (a restart each time: a fresh
  // process forms again), so ranks 0 and 1 publish arrival keys and time out.
  for (int i = 0; i < 2; ++i, ++round) {
    ranks[2] = std::make_unique<Rank>(store, Options(2, kShort));
    OnRanks({0, 1, 2}, [&](int64_t r) { return ranks[r]->stream->Form(); });
    std::vector<Outcome> outcomes =
        OnRanks({0, 1}, [&](int64_t r) { return ranks[r]->stream->Agree(Record(round)).status(); });
    for (int64_t r : {0, 1}) {
      EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kDeadlineExceeded)
          << outcomes[r].status;
    }
  }
  // Rank 2 is down: more failed formations than rank 0 used to clean at once.
  for (int i = 0; i < 6; ++i, ++round) {
    std::vector<Outcome> outcomes =
        OnRanks({0, 1}, [&](int64_t r) { return ranks[r]->stream->Agree(Record(round)).status(); });
    for (int64_t r : {0, 1}) {
      EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kDeadlineExceeded)
          << outcomes[r].status;
    }
  }
  EXPECT_GT(store.size(), formed);
  ranks[2] = std::make_unique<Rank>(store, Options(2, kShort));
  for (const Outcome& o : OnRanks(
           {0, 1, 2}, [&](int64_t r) { return ranks[r]->stream->Agree(Record(round)).status(); })) {
    ASSERT_TRUE(o.status.ok()) << o.status;
  }
  EXPECT_GT(ranks[0]->stream->info().generation, 8);
  EXPECT_EQ(store.size(), formed);
}

}  // namespace
}  // namespace packsched::group
