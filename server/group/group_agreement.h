#ifndef PACKSCHED_SERVER_GROUP_GROUP_AGREEMENT_H_
#define PACKSCHED_SERVER_GROUP_GROUP_AGREEMENT_H_

// The agreement port (round_agreement.h) over the rank group (group.h): each stream agrees
// through its StreamGroup, which forms, heals and re-forms the stream's collective itself.
//
// Recovery: until a stream has agreed a round with its peers in this process, a round may be one
// the peers finished before this sidecar (re)started — they will not come to it again. Rank 0
// stores each agreed result (StreamGroup::PutResult, best effort), and a rank that has not agreed
// yet first looks its round up there (GetResult): if found, it takes the peers' agreed values
// instead of entering the round alone (same k and counts, so the same plan).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/group/group.h"
#include "server/group/round.h"
#include "server/group/round_agreement.h"

namespace packsched::group {

class GroupAgreements final : public RoundAgreements {
 public:
  // REQUIRES: `group` outlives this and every agreement it makes.
  explicit GroupAgreements(Group& group) : group_(group) {}

  std::unique_ptr<RoundAgreement> ForStream(std::string stream) override;
  int64_t world_size() const override { return group_.options().world_size; }
  bool serving() const override { return group_.serving(); }
  void SetServingListener(std::function<void(bool)> listener) override {
    group_.SetServingListener(std::move(listener));
  }

 private:
  Group& group_;
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
