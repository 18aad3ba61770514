// The agreement port's implementations (round_agreement.h): CollectiveAgreements — a group of one
// by default, or over a test's collectives — and the rank group's stored results.

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/collective_agreement.h"
#include "server/group/group.h"
#include "server/group/group_agreement.h"
#include "tests/collective/in_process_collective.h"

namespace packsched::group {
namespace {

using ::testing::HasSubstr;

RoundRecord Record(int64_t rank, int64_t round) {
  RoundRecord record;
  record.stream = "actor";
  record.round = round;
  record.options_hash = 77;
  record.version = 1;
  record.local_k = 2 + rank;
  record.num_sequences = 10 + rank;
  record.loss_tokens = 100;
  record.sequences_with_loss = 10;
  return record;
}

TEST(CollectiveAgreements, AGroupOfOneByDefaultNeedsNoStore) {
  CollectiveAgreements agreements(absl::Seconds(5));
  EXPECT_EQ(agreements.world_size(), 1);
  EXPECT_TRUE(agreements.serving());
  std::unique_ptr<RoundAgreement> stream = agreements.ForStream("actor");
  EXPECT_FALSE(stream->info().formed);
  absl::StatusOr<AgreedRound> agreed = stream->Agree(Record(0, 3));
  ASSERT_TRUE(agreed.ok()) << agreed.status();
  EXPECT_EQ(agreed->k, 2);
  EXPECT_EQ(agreed->num_sequences, 10);
  EXPECT_EQ(agreed->world_size, 1);
  const GroupInfo info = stream->info();
  EXPECT_TRUE(info.formed);
  EXPECT_EQ(info.backend, "local");
  EXPECT_EQ(info.generation, 0);
}

TEST(CollectiveAgreements, AlwaysServing) {
  CollectiveAgreements agreements(absl::Seconds(5));
  std::vector<bool> told;
  agreements.SetServingListener([&](bool serving) { told.push_back(serving); });
  agreements.SetServingListener(nullptr);
  EXPECT_EQ(told, std::vector<bool>{true});
}

TEST(CollectiveAgreements, RanksOfATestsCollectivesAgree) {
  std::vector<std::unique_ptr<collective::Collective>> ranks = collective::CreateInProcessGroup(2);
  std::vector<std::unique_ptr<CollectiveAgreements>> agreements;
  for (auto& rank : ranks) {
    auto held = std::make_shared<std::unique_ptr<collective::Collective>>(std::move(rank));
    agreements.push_back(std::make_unique<CollectiveAgreements>(
        absl::Seconds(5),
        [held](absl::string_view) -> absl::StatusOr<std::unique_ptr<collective::Collective>> {
          if (*held == nullptr) return absl::UnavailableError("made once");
          return std::move(*held);
        }));
  }
  std::vector<absl::StatusOr<AgreedRound>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = agreements[r]->ForStream("actor")->Agree(Record(r, 5)); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->k, 3);
    EXPECT_EQ(result->num_sequences, 21);
    EXPECT_EQ(result->world_size, 2);
  }
  EXPECT_EQ(agreements[0]->world_size(), 2);
}

// A failed collective is dropped and made again for the next round; an aborted agreement fails
// every later round, the collective it makes then included.
TEST(CollectiveAgreements, RemakesAFailedCollectiveAndStaysAborted) {
  int made = 0;
  CollectiveAgreements agreements(
      absl::Seconds(5),
      [&](absl::string_view) -> absl::StatusOr<std::unique_ptr<collective::Collective>> {
        ++made;
        std::vector<std::unique_ptr<collective::Collective>> one =
            collective::CreateInProcessGroup(1);
        if (made == 1) one[0]->Abort();  // the first one is broken
        return std::move(one[0]);
      });
  std::unique_ptr<RoundAgreement> stream = agreements.ForStream("actor");
  absl::StatusOr<AgreedRound> first = stream->Agree(Record(0, 1));
  EXPECT_EQ(first.status().code(), absl::StatusCode::kAborted) << first.status();
  EXPECT_FALSE(stream->info().formed);
  EXPECT_EQ(stream->info().last_error, first.status());
  ASSERT_TRUE(stream->Agree(Record(0, 2)).ok());
  EXPECT_EQ(made, 2);
  stream->Abort();
  EXPECT_EQ(stream->Agree(Record(0, 3)).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(stream->Agree(Record(0, 4)).status().code(), absl::StatusCode::kAborted);
}

TEST(GroupAgreements, AStoreBackedGroupOfOneIsServing) {
  collective::InMemoryStore store;
  absl::StatusOr<std::unique_ptr<Group>> group = Group::Create(&store, GroupOptions{});
  ASSERT_TRUE(group.ok()) << group.status();
  GroupAgreements agreements(**group);
  EXPECT_EQ(agreements.world_size(), 1);
  std::vector<bool> told;
  agreements.SetServingListener([&](bool serving) { told.push_back(serving); });
  agreements.SetServingListener(nullptr);
  EXPECT_EQ(told, std::vector<bool>{true});
  std::unique_ptr<RoundAgreement> stream = agreements.ForStream("actor");
  absl::StatusOr<AgreedRound> agreed = stream->Agree(Record(0, 1));
  ASSERT_TRUE(agreed.ok()) << agreed.status();
  EXPECT_EQ(agreed->world_size, 1);
  EXPECT_EQ(stream->info().backend, "local");
}

TEST(StoredResult, RoundTripsAndChecksTheIdentity) {
  AgreedRound agreed;
  agreed.k = 7;
  agreed.min_local_k = 3;
  agreed.num_sequences = 512;
  agreed.loss_tokens = 9000;
  agreed.sequences_with_loss = 500;
  const RoundRecord mine = Record(0, 4);
  const std::string stored = SerializeAgreedResult(agreed, mine);
  EXPECT_EQ(stored, "v1 7 3 512 9000 500 77 1");
  absl::StatusOr<AgreedRound> parsed = ParseAgreedResult(stored, mine);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->k, 7);
  EXPECT_EQ(parsed->min_local_k, 3);
  EXPECT_EQ(parsed->num_sequences, 512);
  EXPECT_EQ(parsed->loss_tokens, 9000);
  EXPECT_EQ(parsed->sequences_with_loss, 500);

  EXPECT_EQ(ParseAgreedResult("v1 7 3", mine).status().code(), absl::StatusCode::kInternal);
  RoundRecord other_options = mine;
  other_options.options_hash = 78;
  EXPECT_THAT(ParseAgreedResult(stored, other_options).status().message(),
              HasSubstr("options fingerprint"));
  RoundRecord larger = mine;
  larger.local_k = 8;
  EXPECT_THAT(ParseAgreedResult(stored, larger).status().message(),
              HasSubstr("below this rank's bound 8"));
}

}  // namespace
}  // namespace packsched::group
