#ifndef PACKSCHED_SERVER_GROUP_BLAME_H_
#define PACKSCHED_SERVER_GROUP_BLAME_H_

// Explaining a failed round or formation: the bounded store calls made after a failure
// (CleanupCalls), and naming the ranks at fault from their keys in the store (MissingRanks).
// Internal to the rank group (stream_group.cc, generations.cc).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/store.h"

namespace packsched::group {

namespace internal {
inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}
}  // namespace internal

// The store calls that explain and end a failed round or formation. They share one deadline (the
// round's own plus a margin), do not wait for an unreachable store (FailFast), and stop at the
// first call that finds it unreachable (Unavailable, or DeadlineExceeded from a call that does
// not wait for a key): a dead or stopped rank 0 then costs one bounded call, not one per call,
// and the failure is reported as the store's instead of as ranks missing.
class CleanupCalls {
 public:
  CleanupCalls(collective::KeyValueStore& store, absl::Time deadline)
      : store_(store.FailFast()), deadline_(deadline) {}

  // The first unreachable error, or OK.
  const absl::Status& unreachable() const { return unreachable_; }

  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.TryGet(key, deadline_), /*waits_for_key=*/false);
  }
  // Waits for `key` until `until` at most: DeadlineExceeded then means it was not set.
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time until) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.Get(key, std::min(until, deadline_)), /*waits_for_key=*/true);
  }
  absl::Status Set(absl::string_view key, absl::string_view value) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.Set(key, value, deadline_), false);
  }
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.CompareAndSet(key, expected, desired, deadline_), false);
  }

 private:
  template <typename T>
  T Track(T result, bool waits_for_key) {
    const absl::Status& status = internal::StatusOf(result);
    if (absl::IsUnavailable(status) || (absl::IsDeadlineExceeded(status) && !waits_for_key)) {
      unreachable_ = status;
    }
    return result;
  }

  collective::KeyValueStore& store_;
  const absl::Time deadline_;
  absl::Status unreachable_;
};

// "[1, 3]" for the ranks in [0, world_size) whose `key(rank)` is absent from the store (16 named
// at most, then "and N more"); std::nullopt if the store could not tell (cleanup.unreachable()
// says why). `named`, if given, receives the ranks named.
std::optional<std::string> MissingRanks(CleanupCalls& cleanup, int64_t world_size,
                                        const std::function<std::string(int64_t)>& key,
                                        std::vector<int64_t>* named = nullptr);

// A rank whose own side of a formation failed (not a wait for its peers: its transport could not
// come up) tells its peers why: its reason (at most keys::kNotReadyReasonBytes) under its
// per-epoch key, then its rank as the generation's first such rank (first writer wins). Best
// effort: a store error is ignored (the rank's own error says it already).
void PublishNotReady(CleanupCalls& cleanup, absl::string_view epoch_root,
                     absl::string_view formation, int64_t rank, const absl::Status& reason);

// "rank 3 not ready: <its reason>" for the first rank that published a reason in `formation`
// (PublishNotReady), other than `self`; std::nullopt if none did or the store cannot tell. Two
// store reads.
std::optional<std::string> NotReadyReason(CleanupCalls& cleanup, absl::string_view epoch_root,
                                          absl::string_view formation, int64_t self);

// The same for ranks that did not come to a formation (MissingRanks' named ranks): the last
// reason each of the first kNotReadyAsked of `ranks` published in this epoch, "; "-joined;
// std::nullopt if none has one. At most kNotReadyAsked store reads. A reason stays until the
// rank forms again (ClearNotReady), so a rank restarted with its fault fixed that has not formed
// yet is still reported with its old reason.
inline constexpr size_t kNotReadyAsked = 4;
std::optional<std::string> NotReadyReasons(CleanupCalls& cleanup, absl::string_view epoch_root,
                                           const std::vector<int64_t>& ranks);

// Clears this rank's reason once it has formed (best effort, one store call).
void ClearNotReady(collective::KeyValueStore& store, absl::string_view epoch_root, int64_t rank,
                   absl::Time deadline);

// Whether a formation's error is this rank's own (its transport could not come up) rather than
// a wait for its peers that ended (a deadline, a peer that went away, an unreachable store) or a
// cancellation.
bool IsOwnFormationFailure(const absl::Status& error);

// How a failure's message says that the store could not be asked who was at fault.
std::string StoreUnreachable(const absl::Status& error);

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_BLAME_H_
