#ifndef PACKSCHED_SERVER_COLLECTIVE_CANCELLATION_H_
#define PACKSCHED_SERVER_COLLECTIVE_CANCELLATION_H_

// A one-shot signal that ends a wait before its deadline: what lets StreamGroup::Abort (and so a
// shutting-down sidecar) stop a formation in progress instead of waiting out
// --collective_timeout. The waiter registers what wakes it (GlooCollective::Create: closing its
// half-formed pairs); the canceller calls Cancel().

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace packsched::collective {

// Thread-safe. Not copyable: share it by pointer (the canceller and the waiter must both hold it
// while either may use it).
class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Fires the signal: runs every registered callback once, on this thread, and makes every later
  // Register run its callback at once. Idempotent (later calls do nothing).
  void Cancel();

  bool cancelled() const;

  // Registers `on_cancel`, to run once when Cancel() is called — at once, on this thread, if it
  // already was. Returns the id to pass to Unregister. Callbacks run with this object's lock
  // held: they must be short and must not call back into it.
  int64_t Register(std::function<void()> on_cancel);

  // When this returns, the callback `id` is neither running nor will it run. Unknown ids are
  // ignored.
  void Unregister(int64_t id);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_CANCELLATION_H_
