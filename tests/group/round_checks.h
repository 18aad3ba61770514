#ifndef PACKSCHED_TESTS_GROUP_ROUND_CHECKS_H_
#define PACKSCHED_TESTS_GROUP_ROUND_CHECKS_H_

// Shared by the AgreeRound tests over the in-process harness (round_test) and over Gloo
// (gloo_round_test): run one round on every rank of a group, the answer every rank must get, and
// the checks that all ranks got it (or all failed alike).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/collective/collective.h"
#include "server/group/round.h"
#include "tests/collective/run_ranks.h"

namespace packsched::group::testing {

using collective::Collective;
using collective::testing::RunRanks;

using RoundResult = absl::StatusOr<AgreedRound>;
using RecordOf = std::function<RoundRecord(int64_t rank)>;
using RecordEdit = std::function<void(int64_t rank, RoundRecord& record)>;

// Runs AgreeRound on every rank of `group` (10 s deadline), rank r bringing record(r) after
// edit(r, ...).
inline std::vector<RoundResult> AgreeOnRanks(std::vector<std::unique_ptr<Collective>>& group,
                                             const RecordOf& record, const RecordEdit& edit) {
  return RunRanks<RoundResult>(group, [&](Collective& rank) -> RoundResult {
    RoundRecord mine = record(rank.rank());
    edit(rank.rank(), mine);
    return AgreeRound(rank, mine, absl::Now() + absl::Seconds(10));
  });
}

// What every rank must get when rank r brings record(r): the largest and the smallest local_k,
// the counts summed.
inline AgreedRound ExpectedAgreement(int64_t world_size, const RecordOf& record) {
  AgreedRound expected;
  expected.min_local_k = record(0).local_k;
  for (int64_t r = 0; r < world_size; ++r) {
    expected.k = std::max(expected.k, record(r).local_k);
    expected.min_local_k = std::min(expected.min_local_k, record(r).local_k);
    expected.num_sequences += record(r).num_sequences;
    expected.loss_tokens += record(r).loss_tokens;
    expected.sequences_with_loss += record(r).sequences_with_loss;
  }
  return expected;
}

// One result per rank, each OK and equal to `expected`.
inline void ExpectEveryRankAgreed(const std::vector<RoundResult>& results, int64_t world_size,
                                  const AgreedRound& expected) {
  ASSERT_EQ(results.size(), static_cast<size_t>(world_size));
  for (const RoundResult& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->k, expected.k);
    EXPECT_EQ(result->min_local_k, expected.min_local_k);
    EXPECT_EQ(result->num_sequences, expected.num_sequences);
    EXPECT_EQ(result->loss_tokens, expected.loss_tokens);
    EXPECT_EQ(result->sequences_with_loss, expected.sequences_with_loss);
  }
}

// Every rank failed, all with the same status.
inline void ExpectSameFailure(const std::vector<RoundResult>& results) {
  ASSERT_FALSE(results.empty());
  ASSERT_FALSE(results[0].ok());
  for (const RoundResult& result : results) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status(), results[0].status());
  }
}

}  // namespace packsched::group::testing

#endif  // PACKSCHED_TESTS_GROUP_ROUND_CHECKS_H_
