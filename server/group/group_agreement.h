#ifndef PACKSCHED_SERVER_GROUP_GROUP_AGREEMENT_H_
#define PACKSCHED_SERVER_GROUP_GROUP_AGREEMENT_H_

// The agreement port (round_agreement.h) over the rank group (group.h): each stream agrees
// through its StreamGroup, which forms, heals and re-forms the stream's collective itself.
//
// Rounds that never split (docs/design.md §3): every rank that agrees a round keeps its agreed
// values and has them written into the rendezvous store (result_replica.h), so they survive the
// loss of any one sidecar, rank 0 included. A round may be one the peers finished without this
// rank — at a stream's first round in this process (the sidecar was restarted) and after a round
// failed here (its collective may have completed on ranks that had what they needed) — so such a
// round is looked up first (ResultReplica::Lookup): if a rank recorded it, this rank takes those
// agreed values instead of running it again (same k and counts, so the same plan), within the
// same collective timeout as the round. A round that fails with a round-number mismatch (the
// peers are past it) is looked up once more.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/group/group.h"
#include "server/group/result_replica.h"
#include "server/group/round.h"
#include "server/group/round_agreement.h"

namespace packsched::group {

class GroupAgreements final : public RoundAgreements {
 public:
  // REQUIRES: `group` outlives this and every agreement it makes. With more than one rank, starts
  // the result replica's writer (stopped by the destructor).
  explicit GroupAgreements(Group& group, ReplicaOptions replica = {});
  ~GroupAgreements() override;

  std::unique_ptr<RoundAgreement> ForStream(std::string stream) override;
  int64_t world_size() const override { return group_.options().world_size; }
  bool serving() const override { return group_.serving(); }
  void SetServingListener(std::function<void(bool)> listener) override {
    group_.SetServingListener(std::move(listener));
  }

 private:
  Group& group_;
  std::unique_ptr<ResultReplica> replica_;  // null in a group of one
};

// An agreed result as the rank group stores it ("v1 k min_local_k sequences loss_tokens
// sequences_with_loss options_hash version"): the agreed values and the identity a recovering
// rank must share.
std::string SerializeAgreedResult(const AgreedRound& agreed, const RoundRecord& record);

// The stored result `text` of `mine.round`, for a rank that brings `mine`: Internal if
// malformed; FailedPrecondition if the peers agreed it with other options or version, or with
// a k below this rank's own bound (its lengths differ from the ones it sent before).
absl::StatusOr<AgreedRound> ParseAgreedResult(absl::string_view text, const RoundRecord& mine);

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_GROUP_AGREEMENT_H_
