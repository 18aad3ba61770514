#include "server/collective/cancellation.h"

#include <utility>

namespace packsched::collective {

void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  // Under the lock, so that Unregister returning means the callback is not running.
  for (auto& [id, callback] : callbacks_) callback();
  callbacks_.clear();
}

bool Cancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

int64_t Cancellation::Register(std::function<void()> on_cancel) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  if (cancelled_) {
    on_cancel();
  } else {
    callbacks_.emplace(id, std::move(on_cancel));
  }
  return id;
}

void Cancellation::Unregister(int64_t id) {
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
}

}  // namespace packsched::collective
