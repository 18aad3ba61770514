#ifndef PACKSCHED_SERVER_GROUP_ROUND_H_
#define PACKSCHED_SERVER_GROUP_ROUND_H_

// One planning round's agreement (docs/design.md §1, §3): every rank contributes a fixed record;
// one all-reduce gives the agreed micro-batch bound and the global counts; only when the round
// fails are the full records gathered, so every rank fails it with the same status and a message
// that names the ranks and values involved.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/collective/collective.h"

namespace packsched::group {

// Counts above this, on one rank, are refused (InvalidArgument joining the round), so that sums
// over up to 2^20 ranks cannot overflow int64.
inline constexpr int64_t kMaxRoundCount = int64_t{1} << 40;
// Bytes of the stream name and of an error message carried when a failed round is explained.
inline constexpr int kRecordNameBytes = 48;
inline constexpr int kRecordMessageBytes = 256;
// Words of one rank's record in the gather that explains a failed round (the identity, the error
// code, the name and the message): the backends size their buffers for world_size of them up
// front (collective.h's kMaxGatheredRecordWords), so the failure path allocates nothing.
inline constexpr int kGatheredRecordWords = 5 + kRecordNameBytes / 8 + kRecordMessageBytes / 8;
static_assert(kGatheredRecordWords == collective::kMaxGatheredRecordWords,
              "collective.h's kMaxGatheredRecordWords must hold a round's gathered record");

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

// Runs the round on `group`. Every rank of the group must call it for the same round (the
// collective's ordering rule). The result is the same on every rank:
//  - the ranks disagree on stream, round, options or version: FailedPrecondition naming the
//    field, a rank on each side and both values (checked before errors: a rank that is in another
//    round should not be blamed on its request);
//  - some rank's `error` is not OK: that status code, with the message of the lowest such rank,
//    prefixed with its rank (and the number of failed ranks when more than one);
//  - the collective fails: its DeadlineExceeded or Aborted (then the group must be formed again).
// Messages are cut to kRecordMessageBytes and stream names to kRecordNameBytes when explained.
absl::StatusOr<AgreedRound> AgreeRound(collective::Collective& group, const RoundRecord& mine,
                                       absl::Time deadline);

// Whether `status` is AgreeRound's failure for ranks that brought different round numbers.
bool IsRoundNumberMismatch(const absl::Status& status);

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_ROUND_H_
