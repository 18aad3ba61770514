#ifndef PACKSCHED_SERVER_GROUP_ROUND_H_
#define PACKSCHED_SERVER_GROUP_ROUND_H_

// One planning round's agreement (docs/design.md §1, §3): every rank contributes a fixed record;
// one all-reduce gives the agreed micro-batch bound and the global counts; only when the round
// fails are the full records gathered, so every rank fails it with the same status and a message
// that names the ranks and values involved. The records are round_record.h's (the agreement
// port's); IsRoundNumberMismatch, declared there, recognises the mismatch this writes.

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/collective/collective.h"
#include "server/group/round_record.h"

namespace packsched::group {

// Words of one rank's record in the gather that explains a failed round (the identity, the error
// code, the name and the message): the backends size their buffers for world_size of them up
// front (collective.h's kMaxGatheredRecordWords), so the failure path allocates nothing.
inline constexpr int kGatheredRecordWords = 5 + kRecordNameBytes / 8 + kRecordMessageBytes / 8;
static_assert(kGatheredRecordWords == collective::kMaxGatheredRecordWords,
              "collective.h's kMaxGatheredRecordWords must hold a round's gathered record");

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

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_ROUND_H_
