// AgreeRound over real Gloo groups (threads as ranks on 127.0.0.1): the round protocol gives
// the same answer and the same failures as with the in-process harness.

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/round.h"
#include "tests/collective/gloo_group.h"
#include "tests/group/round_checks.h"

namespace packsched::group {
namespace {

using collective::InMemoryStore;

using collective::testing::FormGlooGroup;
using testing::ExpectedAgreement;
using testing::ExpectEveryRankAgreed;
using testing::ExpectSameFailure;
using ::testing::HasSubstr;

using Result = testing::RoundResult;

RoundRecord Record(int64_t rank) {
  RoundRecord record;
  record.stream = "actor_update";
  record.round = 41;
  record.options_hash = 0xabcdef;
  record.version = 3;
  record.local_k = 2 + (rank * 5) % 7;  // differs per rank, largest not on the last rank
  record.num_sequences = 100 + rank;
  record.loss_tokens = 5000 * (rank + 1);
  record.sequences_with_loss = 90 + rank;
  return record;
}

std::vector<Result> AgreeOverGloo(int64_t world_size, const testing::RecordEdit& edit) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, world_size);
  EXPECT_TRUE(group.ok()) << group.status();
  if (!group.ok()) return {};
  return testing::AgreeOnRanks(*group, Record, edit);
}

TEST(AgreeRoundOverGloo, EveryRankGetsTheLargestBoundAndTheSums) {
  for (int64_t world_size : {2, 4, 8}) {
    SCOPED_TRACE(world_size);
    ExpectEveryRankAgreed(AgreeOverGloo(world_size, [](int64_t, RoundRecord&) {}), world_size,
                          ExpectedAgreement(world_size, Record));
  }
}

TEST(AgreeRoundOverGloo, OneRanksErrorFailsEveryRankIdentically) {
  std::vector<Result> results = AgreeOverGloo(4, [](int64_t rank, RoundRecord& record) {
    if (rank == 3) record.error = absl::InvalidArgumentError("lengths[0] = 0 must be >= 1");
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(results[0].status().message(), "rank 3: lengths[0] = 0 must be >= 1");
}

TEST(AgreeRoundOverGloo, AMismatchFailsEveryRankIdenticallyNamingBoth) {
  std::vector<Result> results = AgreeOverGloo(4, [](int64_t rank, RoundRecord& record) {
    if (rank == 2) record.options_hash = 0x99;
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(results[0].status().message()), HasSubstr("disagree on the options"));
  EXPECT_THAT(std::string(results[0].status().message()), HasSubstr("rank 2 has fingerprint"));
}

}  // namespace
}  // namespace packsched::group
