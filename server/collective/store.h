#ifndef PACKSCHED_SERVER_COLLECTIVE_STORE_H_
#define PACKSCHED_SERVER_COLLECTIVE_STORE_H_

// The rendezvous key-value store (docs/design.md §3): rank 0 serves it, every rank (rank 0
// included) uses it to bootstrap Gloo and NCCL, and the rank group above (server/group/) to agree
// on the backend and the generation, to publish arrival keys, and to keep the agreed result of
// each round. Keys and values are byte strings. It lives here, below the group, because the
// backends bootstrap through it (their formation takes a KeyValueStore).
//
// KeyValueStore is the interface; InMemoryStore (below) serves threads-as-ranks tests and rank
// 0's own server; a gRPC client (server/service/rendezvous.h) implements the same interface for
// the other ranks.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace packsched::collective {

// Every call is bounded by `deadline`: a remote store returns DeadlineExceeded (or Unavailable
// when it cannot be reached) instead of blocking past it. Thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Sets `key` to `value`, replacing any earlier value, and wakes every Get waiting for it.
  virtual absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) = 0;

  // Blocks until `key` exists and returns its value. Returns DeadlineExceeded (naming the key)
  // if it does not exist by `deadline`.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) = 0;

  // Returns the value of `key` at once, or std::nullopt if it does not exist.
  virtual absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key,
                                                            absl::Time deadline) = 0;

  // Atomically: if the current value of `key` equals `expected` (std::nullopt: the key does not
  // exist), sets it to `desired`. Returns the value stored after the call (`desired` when it was
  // set, else the value that prevented it; the empty string if the key does not exist). The
  // primitive for counters that several ranks may bump at once (generations) and for
  // first-writer-wins keys.
  virtual absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                                    std::optional<absl::string_view> expected,
                                                    absl::string_view desired,
                                                    absl::Time deadline) = 0;

  // Deletes every key that starts with `prefix`; returns how many were deleted. Keys of finished
  // generations and old rounds are deleted this way so the store does not grow without bound.
  virtual absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix, absl::Time deadline) = 0;

  // The same store, through calls that fail at once with Unavailable while it cannot be reached
  // instead of waiting (up to their deadline) for it to come up: for the calls that explain and
  // end a failed round, which must not wait for a rank 0 that has died. A store that is always
  // reachable (in memory) returns itself. The view lives as long as this store.
  virtual KeyValueStore& FailFast() { return *this; }

  // For a store reached over a connection (rank 0's, from another rank): waits until
  // `deadline` for a connection that is up to drop, making no request. Returns true once it has
  // dropped (rank 0 may have restarted: read the epoch again), false at the deadline (also while
  // no connection is up). Unimplemented for a store without one (in memory): the default.
  virtual absl::StatusOr<bool> AwaitDisconnect(absl::Time /*deadline*/) {
    return absl::UnimplementedError("this store has no connection to watch");
  }
};

// A KeyValueStore in this process's memory. Get waits on a condition variable; nothing is
// persisted. Thread-safe.
//
// Watch/CancelWatch complete a get without blocking a thread: what rank 0's rendezvous server
// (gRPC callback API) uses to answer a remote Get when the key is set, and to answer
// DeadlineExceeded (after CancelWatch) when its own timer fires first.
class InMemoryStore final : public KeyValueStore {
 public:
  using WatchCallback = std::function<void(std::string value)>;

  // Calls `done` exactly once with the value of `key` — at once, on this thread, if the key
  // exists; else on the thread of the Set that creates it — unless CancelWatch(id) returns true
  // first. `done` runs without the store's lock held and may call the store. Returns the id.
  int64_t Watch(absl::string_view key, WatchCallback done);

  // Returns true if the watch was still pending (its callback will never run), false if it has
  // run, is running, or never existed.
  bool CancelWatch(int64_t id);

  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key,
                                                    absl::Time deadline) override;
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired,
                                            absl::Time deadline) override;
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix, absl::Time deadline) override;

  // Number of keys held (for tests of cleanup and for limits).
  int64_t size() const;

 private:
  struct Watcher {
    int64_t id;
    WatchCallback done;
  };

  // Stores `value` under `key` and takes the key's watchers, for the caller to run unlocked.
  std::vector<Watcher> StoreLocked(absl::string_view key, absl::string_view value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> values_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<Watcher>, std::less<>> watchers_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::string> watched_key_ ABSL_GUARDED_BY(mu_);  // pending id -> key
  int64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_STORE_H_
