#include "server/group/round.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/local_collective.h"
#include "tests/collective/in_process_collective.h"
#include "tests/group/round_checks.h"

namespace packsched::group {
namespace {

using collective::Collective;
using collective::CreateInProcessGroup;
using collective::LocalCollective;

using collective::testing::RunRanks;
using testing::ExpectedAgreement;
using testing::ExpectEveryRankAgreed;
using testing::ExpectSameFailure;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using Result = testing::RoundResult;

RoundRecord Record(int64_t rank) {
  RoundRecord record;
  record.stream = "actor_update";
  record.round = 7;
  record.options_hash = 0xfeedbeef;
  record.version = 1;
  record.local_k = 3 + rank * rank;  // distinct per rank, largest on the last rank
  record.num_sequences = 10 + rank;
  record.loss_tokens = 1000 * (rank + 1);
  record.sequences_with_loss = 9 + rank;
  return record;
}

std::string Message(const Result& result) { return std::string(result.status().message()); }

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// Runs AgreeRound on `world_size` in-process ranks, rank r bringing edit(r, Record(r)).
std::vector<Result> Agree(int64_t world_size, const testing::RecordEdit& edit) {
  auto group = CreateInProcessGroup(world_size);
  return testing::AgreeOnRanks(group, Record, edit);
}

TEST(AgreeRound, GroupOfOneAgreesWithItself) {
  LocalCollective local;
  const RoundRecord record = Record(0);
  Result result = AgreeRound(local, record, Soon());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->k, record.local_k);
  EXPECT_EQ(result->min_local_k, record.local_k);
  EXPECT_EQ(result->num_sequences, record.num_sequences);
  EXPECT_EQ(result->loss_tokens, record.loss_tokens);
  EXPECT_EQ(result->sequences_with_loss, record.sequences_with_loss);
}

TEST(AgreeRound, TakesTheLargestBoundAndSumsTheCounts) {
  for (int64_t world_size : {2, 3, 5}) {
    SCOPED_TRACE(world_size);
    ExpectEveryRankAgreed(Agree(world_size, [](int64_t, RoundRecord&) {}), world_size,
                          ExpectedAgreement(world_size, Record));
  }
}

TEST(AgreeRound, OneRanksErrorFailsEveryRankWithItsStatus) {
  std::vector<Result> results = Agree(4, [](int64_t rank, RoundRecord& record) {
    if (rank == 2) record.error = absl::InvalidArgumentError("lengths[5] = -3 must be >= 1");
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(results[0]), "rank 2: lengths[5] = -3 must be >= 1");
}

TEST(AgreeRound, SeveralErrorsReportTheLowestRankAndTheCount) {
  std::vector<Result> results = Agree(4, [](int64_t rank, RoundRecord& record) {
    if (rank == 1) record.error = absl::ResourceExhaustedError("too many sequences");
    if (rank == 3) record.error = absl::InvalidArgumentError("max_token_len = 0");
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(results[0]), StartsWith("rank 1: too many sequences"));
  EXPECT_THAT(Message(results[0]), HasSubstr("2 ranks failed"));
}

TEST(AgreeRound, MismatchedRoundsNameBothRanksAndValues) {
  std::vector<Result> results = Agree(3, [](int64_t rank, RoundRecord& record) {
    if (rank == 2) record.round = 8;
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(results[0]), HasSubstr("disagree on the round"));
  EXPECT_THAT(Message(results[0]), HasSubstr("rank 0 has 7, rank 2 has 8"));
}

TEST(AgreeRound, MismatchedStreamsAreNamed) {
  std::vector<Result> results = Agree(2, [](int64_t rank, RoundRecord& record) {
    if (rank == 1) record.stream = "critic";
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(results[0]), HasSubstr("'actor_update'"));
  EXPECT_THAT(Message(results[0]), HasSubstr("rank 1 has 'critic'"));
}

TEST(AgreeRound, MismatchedOptionsAndVersionsAreNamed) {
  std::vector<Result> options = Agree(2, [](int64_t rank, RoundRecord& record) {
    if (rank == 1) record.options_hash = 0x1234;
  });
  ExpectSameFailure(options);
  EXPECT_THAT(Message(options[0]), HasSubstr("disagree on the options"));
  EXPECT_THAT(Message(options[0]), HasSubstr("0000000000001234"));

  std::vector<Result> versions = Agree(2, [](int64_t rank, RoundRecord& record) {
    if (rank == 0) record.version = 2;
  });
  ExpectSameFailure(versions);
  EXPECT_THAT(Message(versions[0]), HasSubstr("rank 0 has 2, rank 1 has 1"));
}

TEST(AgreeRound, AMismatchIsReportedBeforeAnError) {
  std::vector<Result> results = Agree(3, [](int64_t rank, RoundRecord& record) {
    if (rank == 0) record.error = absl::InvalidArgumentError("bad request");
    if (rank == 1) record.round = 99;
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kFailedPrecondition);
}

// Regression: a rank whose options are invalid fingerprints different option bytes; it must not
// turn its own InvalidArgument into an options mismatch on its peers.
TEST(AgreeRound, ARankWithInvalidOptionsFailsEveryRankWithItsErrorNotAMismatch) {
  for (int64_t bad : {0, 2}) {
    SCOPED_TRACE(bad);
    std::vector<Result> results = Agree(3, [bad](int64_t rank, RoundRecord& record) {
      if (rank == bad) {
        record.options_hash = 0xbad0bad0;
        record.error = absl::InvalidArgumentError("max_token_len = 0 must be >= 1");
      }
    });
    ExpectSameFailure(results);
    EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(results[0]), absl::StrCat("rank ", bad, ": max_token_len = 0 must be >= 1"));
  }
}

TEST(AgreeRound, RanksThatAllFailWithDifferentOptionsReportTheirErrors) {
  std::vector<Result> results = Agree(2, [](int64_t rank, RoundRecord& record) {
    record.options_hash = 0x100 + rank;
    record.error = absl::InvalidArgumentError(absl::StrCat("bad option on ", rank));
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(results[0]), StartsWith("rank 0: bad option on 0"));
}

TEST(AgreeRound, HealthyRanksWithDifferentOptionsStillMismatchBesideAFailedRank) {
  std::vector<Result> results = Agree(3, [](int64_t rank, RoundRecord& record) {
    if (rank == 0) record.error = absl::InvalidArgumentError("bad request");
    if (rank == 2) record.options_hash = 0x1234;
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(results[0]), HasSubstr("disagree on the options"));
  EXPECT_THAT(Message(results[0]), HasSubstr("rank 1 has fingerprint 00000000feedbeef"));
  EXPECT_THAT(Message(results[0]), HasSubstr("rank 2 has fingerprint 0000000000001234"));
}

TEST(AgreeRound, CountsThatCouldOverflowJoinAsAnError) {
  std::vector<Result> results = Agree(2, [](int64_t rank, RoundRecord& record) {
    if (rank == 1) record.loss_tokens = kMaxRoundCount + 1;
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(results[0]), StartsWith("rank 1: round counts"));
}

TEST(AgreeRound, LongMessagesAreCutNotLost) {
  const std::string long_message(1000, 'x');
  std::vector<Result> results = Agree(2, [&](int64_t rank, RoundRecord& record) {
    if (rank == 0) record.error = absl::InvalidArgumentError(long_message);
  });
  ExpectSameFailure(results);
  EXPECT_EQ(Message(results[0]), "rank 0: " + long_message.substr(0, kRecordMessageBytes));
}

// Regression: packing an OK status's message (an empty view with a null data()) into the
// gathered record passed null to memcpy (UBSan).
TEST(AgreeRound, ErrorsWithEmptyMessagesAreExplainedToo) {
  std::vector<Result> results = Agree(3, [](int64_t rank, RoundRecord& record) {
    if (rank == 1) record.error = absl::InternalError("");
  });
  ExpectSameFailure(results);
  EXPECT_EQ(results[0].status(), absl::InternalError("rank 1: "));
}

TEST(AgreeRound, AMissingRankIsADeadlineNamingIt) {
  auto group = CreateInProcessGroup(3);
  std::vector<Result> results = RunRanks<Result>(group, [](Collective& rank) -> Result {
    if (rank.rank() == 1) return absl::CancelledError("rank 1 never calls");
    return AgreeRound(rank, Record(rank.rank()), absl::Now() + absl::Milliseconds(200));
  });
  for (int64_t r : {0, 2}) {
    ASSERT_FALSE(results[r].ok());
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(results[r].status().message()), HasSubstr("[1]"));
  }
}

TEST(AgreeRound, AnAbortedGroupFailsTheRound) {
  LocalCollective local;
  local.Abort();
  EXPECT_EQ(AgreeRound(local, Record(0), Soon()).status().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace packsched::group
