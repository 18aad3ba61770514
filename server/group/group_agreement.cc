#include "server/group/group_agreement.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/group/stream_group.h"
#include "spdlog/spdlog.h"

namespace packsched::group {
namespace {

class GroupAgreement final : public RoundAgreement {
 public:
  GroupAgreement(const Group& group, std::unique_ptr<StreamGroup> stream)
      : rank_(group.options().rank),
        world_size_(group.options().world_size),
        stream_(std::move(stream)) {}

  absl::StatusOr<AgreedRound> Agree(const RoundRecord& record) override {
    if (!agreed_once_ && world_size_ > 1) {
      // A restarted sidecar: its peers may have finished this round already (they will not come
      // to it again). Then take their agreed values instead of entering the round alone. (One
      // store read per stream and process: after the first agreed round, none.)
      absl::StatusOr<std::optional<std::string>> stored = stream_->GetResult(record.round);
      if (stored.ok() && stored->has_value()) {
        if (!record.error.ok()) return record.error;
        absl::StatusOr<AgreedRound> recovered = ParseAgreedResult(**stored, record);
        if (recovered.ok()) {
          recovered->world_size = world_size_;
          spdlog::info("stream {} round {}: recovered the agreed result its peers finished (k={})",
                       record.stream, record.round, recovered->k);
        }
        return recovered;
      }
    }
    // Forms (or re-forms after a failure) within the group's collective timeout.
    absl::StatusOr<AgreedRound> agreed = stream_->Agree(record);
    if (!agreed.ok()) return agreed;
    agreed_once_ = true;
    if (rank_ == 0 && world_size_ > 1) {
      // For a peer that restarts and asks for this round again (best effort: a store failure
      // leaves the round itself intact).
      if (absl::Status put =
              stream_->PutResult(record.round, SerializeAgreedResult(*agreed, record));
          !put.ok()) {
        spdlog::warn("stream {} round {}: storing the agreed result failed: {}", record.stream,
                     record.round, put.ToString());
      }
    }
    return agreed;
  }

  void Abort() override { stream_->Abort(); }
  GroupInfo info() const override { return stream_->info(); }

 private:
  const int64_t rank_;
  const int64_t world_size_;
  const std::unique_ptr<StreamGroup> stream_;
  // Whether this process has agreed a round of the stream with its peers (the worker's only).
  bool agreed_once_ = false;
};

}  // namespace

std::unique_ptr<RoundAgreement> GroupAgreements::ForStream(std::string stream) {
  return std::make_unique<GroupAgreement>(group_, group_.ForStream(std::move(stream)));
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
