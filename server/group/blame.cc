#include "server/group/blame.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/group/group_keys.h"

namespace packsched::group {
namespace {

// Ranks named in one message at most; the rest are counted.
constexpr size_t kNamedRanks = 16;

}  // namespace

std::optional<std::string> MissingRanks(CleanupCalls& cleanup, int64_t world_size,
                                        const std::function<std::string(int64_t)>& key,
                                        std::vector<int64_t>* named) {
  std::vector<int64_t> missing;
  int64_t unnamed = 0;
  for (int64_t rank = 0; rank < world_size; ++rank) {
    absl::StatusOr<std::optional<std::string>> value = cleanup.TryGet(key(rank));
    if (!value.ok()) return std::nullopt;  // a store error says nothing about the rank
    if (value->has_value()) continue;
    if (missing.size() < kNamedRanks) {
      missing.push_back(rank);
    } else {
      ++unnamed;
    }
  }
  std::string text = absl::StrCat("[", absl::StrJoin(missing, ", "));
  if (unnamed > 0) absl::StrAppend(&text, ", and ", unnamed, " more");
  if (named != nullptr) *named = missing;
  return absl::StrCat(text, "]");
}

void PublishNotReady(CleanupCalls& cleanup, absl::string_view epoch_root,
                     absl::string_view formation, int64_t rank, const absl::Status& reason) {
  const absl::string_view text = reason.message().substr(0, keys::kNotReadyReasonBytes);
  if (!cleanup.Set(keys::NotReady(epoch_root, rank), text).ok()) return;
  cleanup.CompareAndSet(keys::FormationNotReady(formation), std::nullopt, absl::StrCat(rank))
      .IgnoreError();
}

namespace {

// "rank 3 not ready: <reason>" if `rank` has a reason in this epoch.
std::optional<std::string> ReasonOf(CleanupCalls& cleanup, absl::string_view epoch_root,
                                    int64_t rank) {
  absl::StatusOr<std::optional<std::string>> reason =
      cleanup.TryGet(keys::NotReady(epoch_root, rank));
  if (!reason.ok() || !reason->has_value() || (*reason)->empty()) return std::nullopt;
  return absl::StrCat("rank ", rank, " not ready: ", **reason);
}

}  // namespace

std::optional<std::string> NotReadyReason(CleanupCalls& cleanup, absl::string_view epoch_root,
                                          absl::string_view formation, int64_t self) {
  absl::StatusOr<std::optional<std::string>> first =
      cleanup.TryGet(keys::FormationNotReady(formation));
  int64_t rank = -1;
  if (!first.ok() || !first->has_value() || !absl::SimpleAtoi(**first, &rank) || rank == self) {
    return std::nullopt;
  }
  return ReasonOf(cleanup, epoch_root, rank);
}

std::optional<std::string> NotReadyReasons(CleanupCalls& cleanup, absl::string_view epoch_root,
                                           const std::vector<int64_t>& ranks) {
  std::vector<std::string> reasons;
  for (size_t i = 0; i < ranks.size() && i < kNotReadyAsked; ++i) {
    if (std::optional<std::string> reason = ReasonOf(cleanup, epoch_root, ranks[i])) {
      reasons.push_back(*std::move(reason));
    }
  }
  if (reasons.empty()) return std::nullopt;
  return absl::StrJoin(reasons, "; ");
}

void ClearNotReady(collective::KeyValueStore& store, absl::string_view epoch_root, int64_t rank,
                   absl::Time deadline) {
  store.FailFast().Set(keys::NotReady(epoch_root, rank), "", deadline).IgnoreError();
}

bool IsOwnFormationFailure(const absl::Status& error) {
  return !error.ok() && !absl::IsDeadlineExceeded(error) && !absl::IsAborted(error) &&
         !absl::IsUnavailable(error) && !absl::IsCancelled(error);
}

std::string StoreUnreachable(const absl::Status& error) {
  return absl::StrCat("rendezvous store (rank 0) unreachable: ", error.message());
}

}  // namespace packsched::group
