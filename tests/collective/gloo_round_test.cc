// AgreeRound over real Gloo groups (threads as ranks on 127.0.0.1): the round protocol gives
// the same answer and the same failures as with the in-process harness.

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/round.h"
#include "server/collective/store.h"
#include "tests/collective/gloo_group.h"
#include "tests/collective/run_ranks.h"

namespace packsched::collective {
namespace {

using testing::FormGlooGroup;
using ::testing::HasSubstr;
using testing::RunRanks;

using Result = absl::StatusOr<AgreedRound>;

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

std::vector<Result> AgreeOverGloo(int64_t world_size,
                                  const std::function<void(int64_t, RoundRecord&)>& edit) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, world_size);
  EXPECT_TRUE(group.ok()) << group.status();
  if (!group.ok()) return {};
  return RunRanks<Result>(*group, [&](Collective& rank) -> Result {
    RoundRecord record = Record(rank.rank());
    edit(rank.rank(), record);
    return AgreeRound(rank, record, absl::Now() + absl::Seconds(10));
  });
}

void ExpectSameFailure(const std::vector<Result>& results) {
  ASSERT_FALSE(results.empty());
  for (const Result& result : results) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status(), results[0].status());
  }
}

TEST(AgreeRoundOverGloo, EveryRankGetsTheLargestBoundAndTheSums) {
  for (int64_t world_size : {2, 4, 8}) {
    std::vector<Result> results = AgreeOverGloo(world_size, [](int64_t, RoundRecord&) {});
    AgreedRound expected;
    expected.min_local_k = Record(0).local_k;
    for (int64_t r = 0; r < world_size; ++r) {
      expected.k = std::max(expected.k, Record(r).local_k);
      expected.min_local_k = std::min(expected.min_local_k, Record(r).local_k);
      expected.num_sequences += Record(r).num_sequences;
      expected.loss_tokens += Record(r).loss_tokens;
      expected.sequences_with_loss += Record(r).sequences_with_loss;
    }
    ASSERT_EQ(results.size(), static_cast<size_t>(world_size));
    for (const Result& result : results) {
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->k, expected.k);
      EXPECT_EQ(result->min_local_k, expected.min_local_k);
      EXPECT_EQ(result->num_sequences, expected.num_sequences);
      EXPECT_EQ(result->loss_tokens, expected.loss_tokens);
      EXPECT_EQ(result->sequences_with_loss, expected.sequences_with_loss);
    }
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
}  // namespace packsched::collective
