#include "server/group/group_agreement.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/base/status_macros.h"
#include "server/group/stream_group.h"
#include "spdlog/spdlog.h"

namespace packsched::group {
namespace {

class GroupAgreement final : public RoundAgreement {
 public:
  GroupAgreement(const Group& group, std::unique_ptr<StreamGroup> stream, ResultReplica* replica)
      : world_size_(group.options().world_size),
        timeout_(group.options().collective_timeout),
        stream_(std::move(stream)),
        replica_(replica) {}

  ~GroupAgreement() override {
    if (replica_ != nullptr) replica_->Forget(stream_->stream());
  }

  absl::StatusOr<AgreedRound> Agree(const RoundRecord& record) override {
    // One deadline for the lookup and the round: a call ends within the collective timeout.
    const absl::Time deadline = absl::Now() + timeout_;
    if (replica_ != nullptr && lookup_.has_value()) {
      // The round may be one the peers finished without this rank (a restart, or a collective
      // that failed here and completed there): take their agreed values instead of running it.
      absl::StatusOr<std::optional<AgreedRound>> recovered =
          Recover(record, *lookup_ ? Settle() : absl::ZeroDuration(), deadline);
      if (!recovered.ok()) return recovered.status();
      if (recovered->has_value()) return **recovered;
    }
    absl::StatusOr<AgreedRound> agreed = stream_->Agree(record, deadline);
    if (!agreed.ok()) {
      if (replica_ == nullptr) return agreed;
      const absl::Status& failure = agreed.status();
      // A collective that failed may have completed on ranks that had what they needed: look the
      // round up before running it again, waiting a little for their write.
      lookup_ = absl::IsDeadlineExceeded(failure) || absl::IsAborted(failure) ||
                absl::IsUnavailable(failure);
      if (IsRoundNumberMismatch(failure)) {
        // The peers may be past this round already: if one of them finished it, so does this rank.
        absl::StatusOr<std::optional<AgreedRound>> recovered =
            Recover(record, absl::ZeroDuration(), deadline);
        if (recovered.ok() && recovered->has_value()) return **recovered;
      }
      return agreed;
    }
    lookup_.reset();
    if (replica_ != nullptr) {
      replica_->Record(record.stream, record.round, SerializeAgreedResult(*agreed, record));
    }
    return agreed;
  }

  void Abort() override { stream_->Abort(); }
  GroupInfo info() const override { return stream_->info(); }

 private:
  // How long a lookup after a failed collective waits for a peer's write still on its way.
  absl::Duration Settle() const { return std::min(timeout_ / 4, absl::Milliseconds(500)); }

  // The agreed values of `record`'s round if some rank recorded them, for this rank's record.
  absl::StatusOr<std::optional<AgreedRound>> Recover(const RoundRecord& record,
                                                     absl::Duration settle, absl::Time deadline) {
    ASSIGN_OR_RETURN(std::optional<std::string> stored,
                     replica_->Lookup(record.stream, record.round, settle, deadline));
    if (!stored.has_value()) return std::nullopt;
    if (!record.error.ok()) return record.error;
    ASSIGN_OR_RETURN(AgreedRound recovered, ParseAgreedResult(*stored, record));
    recovered.world_size = world_size_;
    lookup_.reset();
    spdlog::info("stream {} round {}: took the agreed result its peers finished (k={})",
                 record.stream, record.round, recovered.k);
    return recovered;
  }

  const int64_t world_size_;
  const absl::Duration timeout_;
  const std::unique_ptr<StreamGroup> stream_;
  ResultReplica* const replica_;  // null in a group of one
  // Whether the next round must be looked up before it runs (the worker's only): from the start
  // (a restarted sidecar: the peers may have finished it), and after a failure. The value: wait
  // for a late write (the failure was the collective's).
  std::optional<bool> lookup_ = false;
};

}  // namespace

GroupAgreements::GroupAgreements(Group& group, ReplicaOptions replica) : group_(group) {
  if (group.options().world_size > 1) {
    replica_ = std::make_unique<ResultReplica>(group, replica);
  }
}

GroupAgreements::~GroupAgreements() = default;

std::unique_ptr<RoundAgreement> GroupAgreements::ForStream(std::string stream) {
  return std::make_unique<GroupAgreement>(group_, group_.ForStream(std::move(stream)),
                                          replica_.get());
}

std::string SerializeAgreedResult(const AgreedRound& agreed, const RoundRecord& record) {
  return absl::StrCat("v1 ", agreed.k, " ", agreed.min_local_k, " ", agreed.num_sequences, " ",
                      agreed.loss_tokens, " ", agreed.sequences_with_loss, " ", record.options_hash,
                      " ", record.version);
}

absl::StatusOr<AgreedRound> ParseAgreedResult(absl::string_view text, const RoundRecord& mine) {
  const std::vector<absl::string_view> fields = absl::StrSplit(text, ' ');
  AgreedRound agreed;
  uint64_t options_hash = 0;
  int64_t version = 0;
  if (fields.size() != 8 || fields[0] != "v1" || !absl::SimpleAtoi(fields[1], &agreed.k) ||
      !absl::SimpleAtoi(fields[2], &agreed.min_local_k) ||
      !absl::SimpleAtoi(fields[3], &agreed.num_sequences) ||
      !absl::SimpleAtoi(fields[4], &agreed.loss_tokens) ||
      !absl::SimpleAtoi(fields[5], &agreed.sequences_with_loss) ||
      !absl::SimpleAtoi(fields[6], &options_hash) || !absl::SimpleAtoi(fields[7], &version)) {
    return absl::InternalError(absl::StrCat("stored round result '", text, "' is malformed"));
  }
  if (options_hash != mine.options_hash || version != mine.version) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stream '%s' round %d was finished by the peers with options fingerprint %016x and "
        "version %d; this rank has %016x and %d",
        mine.stream, mine.round, options_hash, version, mine.options_hash, mine.version));
  }
  if (agreed.k < mine.local_k) {
    return absl::FailedPreconditionError(
        absl::StrCat("stream '", mine.stream, "' round ", mine.round,
                     " was agreed with k = ", agreed.k, " by the peers, below this rank's bound ",
                     mine.local_k, ": the lengths differ from the ones this rank sent before"));
  }
  return agreed;
}

}  // namespace packsched::group
