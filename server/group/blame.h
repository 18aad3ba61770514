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
// says why).
std::optional<std::string> MissingRanks(CleanupCalls& cleanup, int64_t world_size,
                                        const std::function<std::string(int64_t)>& key);

// How a failure's message says that the store could not be asked who was at fault.
std::string StoreUnreachable(const absl::Status& error);

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_BLAME_H_
