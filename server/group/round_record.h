#ifndef PACKSCHED_SERVER_GROUP_ROUND_RECORD_H_
#define PACKSCHED_SERVER_GROUP_ROUND_RECORD_H_

// What a round agreement (round_agreement.h) takes and gives: one rank's record of a planning
// round, and the outcome every rank agrees on (docs/design.md §1, §3). Part of the agreement
// port: nothing here knows how the ranks reach each other (round.h runs a round over a
// Collective).

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace packsched::group {

// Counts above this, on one rank, are refused (InvalidArgument joining the round), so that sums
// over up to 2^20 ranks cannot overflow int64.
inline constexpr int64_t kMaxRoundCount = int64_t{1} << 40;
// Bytes of the stream name and of an error message carried when a failed round is explained.
inline constexpr int kRecordNameBytes = 48;
inline constexpr int kRecordMessageBytes = 256;

// What one rank brings to a round.
struct RoundRecord {
  std::string stream;         // the stream's name; ranks must agree (compared by fingerprint)
  int64_t round = 0;          // ranks must agree
  uint64_t options_hash = 0;  // fingerprint of every option that changes k or the weights
  int64_t version = 0;        // build and protocol version; ranks must agree
  int64_t local_k = 0;        // this rank's bound k_r (ignored when `error` is not OK)
  int64_t num_sequences = 0;  // kept sequences (counts are ignored when `error` is not OK)
  int64_t loss_tokens = 0;
  int64_t sequences_with_loss = 0;
  // This rank's own failure (say, an invalid request). It still joins the round, so its peers
  // fail at once with this status instead of waiting for a timeout.
  absl::Status error;
};

// The round's outcome, identical on every rank.
struct AgreedRound {
  int64_t k = 0;              // max over ranks of local_k
  int64_t min_local_k = 0;    // min over ranks of local_k (reporting)
  int64_t num_sequences = 0;  // sums over ranks
  int64_t loss_tokens = 0;
  int64_t sequences_with_loss = 0;
  int64_t world_size = 1;  // ranks in the round
};

// Whether `status` is a round's failure for ranks that brought different round numbers (the
// FailedPrecondition AgreeRound writes; defined beside it, in round.cc).
bool IsRoundNumberMismatch(const absl::Status& status);
// Whether `status` is a round's failure for ranks that brought different options hashes (the
// same FailedPrecondition, naming the options; round.cc).
bool IsOptionsMismatch(const absl::Status& status);

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_ROUND_RECORD_H_
