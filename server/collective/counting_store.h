#ifndef PACKSCHED_SERVER_COLLECTIVE_COUNTING_STORE_H_
#define PACKSCHED_SERVER_COLLECTIVE_COUNTING_STORE_H_

// A KeyValueStore that counts the requests it hands to another, by method (docs/design.md §3,
// "The store's cost"): what the sidecar exports as packsched_rendezvous_requests_total, and what
// the scale test and simulation count per rank.
//
//   collective::CountingStore counted(*rendezvous);   // the group uses `counted`
//   counted.requests().get                            // Get calls made so far

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/store.h"

namespace packsched::collective {

// Requests made, by method; a call counts once whatever its outcome.
struct StoreRequests {
  int64_t set = 0;
  int64_t get = 0;
  int64_t try_get = 0;
  int64_t compare_and_set = 0;
  int64_t delete_prefix = 0;

  int64_t total() const { return set + get + try_get + compare_and_set + delete_prefix; }
};

// Forwards every call to `inner` (not owned; it must outlive this) and counts it. FailFast()
// forwards to inner.FailFast() and counts into the same counters. Thread-safe.
class CountingStore final : public KeyValueStore {
 public:
  explicit CountingStore(KeyValueStore& inner);

  // The counts so far (each counter read on its own: a snapshot that is not atomic as a whole).
  StoreRequests requests() const;

  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key,
                                                    absl::Time deadline) override;
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired,
                                            absl::Time deadline) override;
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix, absl::Time deadline) override;
  KeyValueStore& FailFast() override;
  // inner's: it makes no request, so nothing is counted.
  absl::StatusOr<bool> AwaitDisconnect(absl::Time deadline) override {
    return inner_.AwaitDisconnect(deadline);
  }

 private:
  struct Counters {
    std::atomic<int64_t> set{0};
    std::atomic<int64_t> get{0};
    std::atomic<int64_t> try_get{0};
    std::atomic<int64_t> compare_and_set{0};
    std::atomic<int64_t> delete_prefix{0};
  };
  CountingStore(KeyValueStore& inner, std::shared_ptr<Counters> counters);

  KeyValueStore& inner_;
  std::shared_ptr<Counters> counters_;
  std::unique_ptr<CountingStore> fail_fast_;  // null when `inner` is its own fail-fast view
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_COUNTING_STORE_H_
