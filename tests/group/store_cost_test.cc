// The store's cost at scale (docs/design.md §3, "The store's cost"): W = 64 sidecars as threads,
// each with its own Group, agreements and result replica over Gloo on loopback, every one through
// its own request counter into one in-memory store (rank 0's). Joining the run, the first round
// (its lookup and the formation) and steady rounds must cost a rank other than 0 O(log W) store
// requests, rank 0 O(W), and the group O(W log W) — not the W − 2 reads per rank of a lookup that
// reads every rank's mark.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/collective/counting_store.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/group_agreement.h"
#include "server/group/group_keys.h"
#include "server/group/round.h"
#include "server/group/round_agreement.h"
#include "tests/testing/ignore_sigpipe.h"  // Gloo groups whose peers go away

namespace packsched::group {
namespace {

using collective::CountingStore;
using collective::InMemoryStore;

constexpr int64_t kWorld = 64;
constexpr absl::Duration kTimeout = absl::Seconds(40);
// Requests a rank other than 0 may make per log2 W, in each phase measured below.
constexpr double kPerLog2W = 6;
// Requests rank 0 may make per rank of the group (membership, the marks' fold, its own share).
constexpr double kRankZeroPerRank = 4;
// Requests any rank may make per steady round (its result's write in the background, and its
// arrival key and its deletion if the round is slow on these 2 cores), whatever W is.
constexpr int64_t kPerSteadyRound = 8;

struct Sidecar {
  Sidecar(InMemoryStore& store, int64_t rank) : counted(store) {
    GroupOptions options;
    options.rank = rank;
    options.world_size = kWorld;
    options.backend = collective::Backend::kGloo;
    options.collective_timeout = kTimeout;
    options.gloo.hostname = "127.0.0.1";
    options.can_use_nccl = false;
    absl::StatusOr<std::unique_ptr<Group>> created = Group::Create(&counted, std::move(options));
    EXPECT_TRUE(created.ok()) << created.status();
    group = *std::move(created);
    // No idle epoch polls within the test: what is counted is the protocol's work, not time.
    agreements = std::make_unique<GroupAgreements>(
        *group, ReplicaOptions{absl::Minutes(5), absl::Milliseconds(100)});
    stream = agreements->ForStream("actor");
  }
  ~Sidecar() {
    stream.reset();
    agreements.reset();
  }
  CountingStore counted;
  std::unique_ptr<Group> group;
  std::unique_ptr<GroupAgreements> agreements;
  std::unique_ptr<RoundAgreement> stream;
};

RoundRecord Record(int64_t rank, int64_t round) {
  RoundRecord record;
  record.stream = "actor";
  record.round = round;
  record.options_hash = 5;
  record.version = 1;
  record.local_k = 1 + rank % 3;
  record.num_sequences = 10 + rank;
  record.loss_tokens = 100;
  record.sequences_with_loss = 1;
  return record;
}

template <typename Body>
void OnEveryRank(std::vector<std::unique_ptr<Sidecar>>& ranks, Body body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) threads.emplace_back([&, r] { body(*ranks[r], r); });
  for (std::thread& t : threads) t.join();
}

std::vector<int64_t> Requests(const std::vector<std::unique_ptr<Sidecar>>& ranks) {
  std::vector<int64_t> out;
  for (const auto& rank : ranks) out.push_back(rank->counted.requests().total());
  return out;
}

// Checks the requests each rank made since `before`: at most `per_rank` on ranks other than 0,
// `rank_zero` on rank 0.
void ExpectAtMost(const std::vector<int64_t>& before, const std::vector<int64_t>& after,
                  double per_rank, double rank_zero, const std::string& phase) {
  int64_t total = 0;
  int64_t most = 0;
  for (size_t r = 0; r < after.size(); ++r) {
    const int64_t made = after[r] - before[r];
    total += made;
    if (r > 0) most = std::max(most, made);
    EXPECT_LE(made, r == 0 ? rank_zero : per_rank) << phase << ": rank " << r;
  }
  std::printf("%s: %lld requests in all, rank 0 %lld, at most %lld by another rank\n",
              phase.c_str(), static_cast<long long>(total),
              static_cast<long long>(after[0] - before[0]), static_cast<long long>(most));
  EXPECT_LE(total, rank_zero + per_rank * static_cast<double>(after.size() - 1)) << phase;
}

TEST(StoreCost, JoiningFormingAndRoundsCostLogWRequestsPerRank) {
  const double log2w = std::log2(static_cast<double>(kWorld));
  InMemoryStore store;
  std::vector<std::unique_ptr<Sidecar>> ranks;
  for (int64_t r = 0; r < kWorld; ++r) ranks.push_back(std::make_unique<Sidecar>(store, r));
  const std::vector<int64_t> start = Requests(ranks);

  // Joining: every rank's membership (readiness), and every replica's first pass (its mark).
  OnEveryRank(ranks, [](Sidecar& rank, size_t) {
    absl::StatusOr<bool> ready = rank.group->AwaitMembers(absl::Now() + kTimeout);
    ASSERT_TRUE(ready.ok()) << ready.status();
    EXPECT_TRUE(*ready);
  });
  // Rank 0 folds the marks once every rank's is there (the key's value is not read).
  absl::StatusOr<std::string> epoch = store.Get(keys::Epoch("packsched/"), absl::Now() + kTimeout);
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  ASSERT_TRUE(
      store.Get(keys::AllReplicated(keys::EpochRoot("packsched/", *epoch)), absl::Now() + kTimeout)
          .ok());
  const std::vector<int64_t> joined = Requests(ranks);
  ExpectAtMost(start, joined, kPerLog2W * log2w, kRankZeroPerRank * kWorld, "joining");

  // The first round: each rank looks it up (a restart would have missed it), forms the stream's
  // generation, and agrees.
  std::vector<absl::StatusOr<AgreedRound>> first(kWorld, absl::UnknownError("not run"));
  OnEveryRank(ranks, [&](Sidecar& rank, size_t r) {
    first[r] = rank.stream->Agree(Record(static_cast<int64_t>(r), 1));
  });
  for (size_t r = 0; r < first.size(); ++r) {
    ASSERT_TRUE(first[r].ok()) << "rank " << r << ": " << first[r].status();
    EXPECT_EQ(first[r]->k, 3);  // the largest local bound: 1 + rank % 3
    EXPECT_EQ(first[r]->num_sequences, 10 * kWorld + kWorld * (kWorld - 1) / 2);
  }
  const std::vector<int64_t> formed = Requests(ranks);
  ExpectAtMost(joined, formed, kPerLog2W * log2w, kRankZeroPerRank * kWorld, "first round");

  // Steady rounds: the formed collective, no store call on the round's path; each result is
  // written in the background (a few requests per rank and round, none growing with W).
  constexpr int64_t kSteady = 4;
  for (int64_t round = 2; round < 2 + kSteady; ++round) {
    OnEveryRank(ranks, [&](Sidecar& rank, size_t r) {
      absl::StatusOr<AgreedRound> agreed =
          rank.stream->Agree(Record(static_cast<int64_t>(r), round));
      EXPECT_TRUE(agreed.ok()) << "rank " << r << ": " << agreed.status();
    });
  }
  // The background writes of the last round land within a moment.
  absl::SleepFor(absl::Milliseconds(300));
  const std::vector<int64_t> steady = Requests(ranks);
  ExpectAtMost(formed, steady, kPerSteadyRound * kSteady, kPerSteadyRound * kSteady,
               "steady rounds");
  ranks.clear();
}

}  // namespace
}  // namespace packsched::group
