#include "server/group/round.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/base/fingerprint.h"
#include "server/base/status_macros.h"

namespace packsched::group {
namespace {

// The all-reduced vector: the agreed values, then MIN and MAX of each identity field (MIN != MAX
// reveals a mismatch without gathering anything).
enum Slot : int {
  kMaxK,
  kMinK,
  kSumSequences,
  kSumLossTokens,
  kSumSequencesWithLoss,
  kMaxError,  // 0 = every rank OK
  kMinIdentity,
  kMaxIdentity = kMinIdentity + 4,
  kNumSlots = kMaxIdentity + 4,
};

enum IdentityField : int { kStream, kRound, kOptions, kVersion, kNumIdentity };
// How a mismatch's message starts (IsRoundNumberMismatch reads it back).
constexpr absl::string_view kDisagree = "ranks disagree on the ";
constexpr std::array<const char*, kNumIdentity> kIdentityNames = {"stream", "round", "options",
                                                                  "version"};

// The gathered record: the identity, the error code, then the stream name and error message
// packed into int64 words.
constexpr int kNameWords = kRecordNameBytes / 8;
constexpr int kMessageWords = kRecordMessageBytes / 8;
constexpr int kNameOffset = kNumIdentity + 1;
constexpr int kMessageOffset = kNameOffset + kNameWords;
constexpr int kRecordWords = kMessageOffset + kMessageWords;
static_assert(kRecordWords == kGatheredRecordWords, "round.h's kGatheredRecordWords is stale");

void PackBytes(absl::string_view bytes, int64_t* words, int num_words) {
  std::memset(words, 0, sizeof(int64_t) * num_words);
  // An OK status's message is an empty view with a null data(): memcpy from null is UB.
  if (bytes.empty()) return;
  std::memcpy(words, bytes.data(), std::min<size_t>(bytes.size(), sizeof(int64_t) * num_words));
}

std::string UnpackBytes(const int64_t* words, int num_words) {
  const char* bytes = reinterpret_cast<const char*>(words);
  const size_t max = sizeof(int64_t) * num_words;
  return std::string(bytes, strnlen(bytes, max));
}

// The status this rank contributes: its own, or InvalidArgument for counts that could overflow.
absl::Status OwnError(const RoundRecord& mine) {
  if (!mine.error.ok()) return mine.error;
  for (int64_t count :
       {mine.local_k, mine.num_sequences, mine.loss_tokens, mine.sequences_with_loss}) {
    if (count < 0 || count > kMaxRoundCount) {
      return absl::InvalidArgumentError(
          absl::StrCat("round counts must be in [0, ", kMaxRoundCount, "], got ", count));
    }
  }
  return absl::OkStatus();
}

std::string DescribeValue(int field, const int64_t* record) {
  switch (field) {
    case kStream:
      return absl::StrCat("'", UnpackBytes(record + kNameOffset, kNameWords), "'");
    case kOptions:
      return absl::StrFormat("fingerprint %016x", static_cast<uint64_t>(record[kOptions]));
    default:
      return absl::StrCat(record[field]);
  }
}

// Every rank turns the same gathered records into the same status (nothing rank-local enters it).
absl::Status ExplainFailure(absl::Span<const int64_t> records, int64_t world_size) {
  auto record = [&](int64_t r) { return records.data() + r * kRecordWords; };
  auto failed_rank = [&](int64_t r) { return record(r)[kNumIdentity] != 0; };
  for (int field = 0; field < kNumIdentity; ++field) {
    // A rank with an error (invalid options, say) takes no part in the options comparison: its
    // peers fail with its error, not with a mismatch its invalid options caused.
    const bool skip_failed = field == kOptions;
    int64_t ref = 0;
    if (skip_failed) {
      while (ref < world_size && failed_rank(ref)) ++ref;
      if (ref == world_size) continue;
    }
    for (int64_t r = ref + 1; r < world_size; ++r) {
      if (skip_failed && failed_rank(r)) continue;
      if (record(r)[field] == record(ref)[field]) continue;
      return absl::FailedPreconditionError(
          absl::StrCat(kDisagree, kIdentityNames[field], " of a round (rank ", ref, ": stream ",
                       DescribeValue(kStream, record(ref)), " round ", record(ref)[kRound],
                       "): rank ", ref, " has ", DescribeValue(field, record(ref)), ", rank ", r,
                       " has ", DescribeValue(field, record(r))));
    }
  }
  int64_t first = -1;
  int64_t failed = 0;
  for (int64_t r = 0; r < world_size; ++r) {
    if (record(r)[kNumIdentity] == 0) continue;
    if (first < 0) first = r;
    ++failed;
  }
  if (first < 0) {
    // The reduction saw a failure the records do not show: a backend bug, never an input.
    return absl::InternalError("round failed but no rank reported an error");
  }
  const auto code = static_cast<absl::StatusCode>(record(first)[kNumIdentity]);
  std::string message = absl::StrCat("rank ", first, ": ",
                                     UnpackBytes(record(first) + kMessageOffset, kMessageWords));
  if (failed > 1) absl::StrAppend(&message, " (", failed, " ranks failed this round)");
  return absl::Status(code, message);
}

}  // namespace

absl::StatusOr<AgreedRound> AgreeRound(collective::Collective& group, const RoundRecord& mine,
                                       absl::Time deadline) {
  const absl::Status own = OwnError(mine);
  const std::array<int64_t, kNumIdentity> identity = {
      static_cast<int64_t>(Fingerprint64(mine.stream)), mine.round,
      static_cast<int64_t>(mine.options_hash), mine.version};

  std::array<int64_t, kNumSlots> values{};
  std::array<collective::ReduceOp, kNumSlots> ops{};
  const bool ok = own.ok();
  values[kMaxK] = ok ? mine.local_k : 0;
  values[kMinK] = ok ? mine.local_k : kMaxRoundCount;
  values[kSumSequences] = ok ? mine.num_sequences : 0;
  values[kSumLossTokens] = ok ? mine.loss_tokens : 0;
  values[kSumSequencesWithLoss] = ok ? mine.sequences_with_loss : 0;
  values[kMaxError] = static_cast<int64_t>(own.code());
  ops[kMaxK] = collective::ReduceOp::kMax;
  ops[kMinK] = collective::ReduceOp::kMin;
  ops[kSumSequences] = ops[kSumLossTokens] = ops[kSumSequencesWithLoss] =
      collective::ReduceOp::kSum;
  ops[kMaxError] = collective::ReduceOp::kMax;
  for (int field = 0; field < kNumIdentity; ++field) {
    values[kMinIdentity + field] = values[kMaxIdentity + field] = identity[field];
    ops[kMinIdentity + field] = collective::ReduceOp::kMin;
    ops[kMaxIdentity + field] = collective::ReduceOp::kMax;
  }
  if (!ok) {
    // Neutral in the options comparison: a rank whose options are invalid fingerprints bytes its
    // peers never see; its error (kMaxError) is what every rank must report.
    values[kMinIdentity + static_cast<int>(kOptions)] = std::numeric_limits<int64_t>::max();
    values[kMaxIdentity + static_cast<int>(kOptions)] = std::numeric_limits<int64_t>::min();
  }
  RETURN_IF_ERROR(group.AllReduce(absl::MakeSpan(values), ops, deadline));

  bool mismatch = false;
  for (int field = 0; field < kNumIdentity; ++field) {
    // MIN > MAX only when every rank was neutral (all failed): no mismatch then.
    mismatch |= values[kMinIdentity + field] < values[kMaxIdentity + field];
  }
  if (!mismatch && values[kMaxError] == 0) {
    AgreedRound agreed;
    agreed.k = values[kMaxK];
    agreed.world_size = group.world_size();
    agreed.min_local_k = values[kMinK];
    agreed.num_sequences = values[kSumSequences];
    agreed.loss_tokens = values[kSumLossTokens];
    agreed.sequences_with_loss = values[kSumSequencesWithLoss];
    return agreed;
  }

  // The uncommon path: gather every rank's full record to name who failed and why.
  std::array<int64_t, kRecordWords> record{};
  std::copy(identity.begin(), identity.end(), record.begin());
  record[kNumIdentity] = static_cast<int64_t>(own.code());
  PackBytes(mine.stream, record.data() + kNameOffset, kNameWords);
  PackBytes(own.message(), record.data() + kMessageOffset, kMessageWords);
  std::vector<int64_t> records(static_cast<size_t>(group.world_size()) * kRecordWords);
  RETURN_IF_ERROR(group.AllGather(record, absl::MakeSpan(records), deadline));
  return ExplainFailure(records, group.world_size());
}

bool IsRoundNumberMismatch(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         absl::StrContains(status.message(),
                           absl::StrCat(kDisagree, kIdentityNames[kRound], " of a round"));
}

bool IsOptionsMismatch(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         absl::StrContains(status.message(),
                           absl::StrCat(kDisagree, kIdentityNames[kOptions], " of a round"));
}

}  // namespace packsched::group
