#include "server/group/arrival.h"

#include <utility>

#include "absl/time/clock.h"

namespace packsched::group {

ArrivalPublisher::ArrivalPublisher(collective::KeyValueStore& store, absl::Duration delay)
    : store_(store), delay_(delay), thread_(&ArrivalPublisher::Run, this) {}

ArrivalPublisher::~ArrivalPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ArrivalPublisher::Begin(std::string key, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  ++round_;
  active_ = true;
  published_ = false;
  key_ = std::move(key);
  due_ = absl::Now() + delay_;
  deadline_ = deadline;
}

bool ArrivalPublisher::End() {
  absl::MutexLock lock(&mu_);
  active_ = false;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !publishing_; };
  mu_.Await(absl::Condition(&idle));
  return published_;
}

void ArrivalPublisher::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto begun = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || active_; };
    mu_.Await(absl::Condition(&begun));
    if (stop_) return;
    const int64_t round = round_;
    // Until the round is due, unless it ends (or another begins) first.
    auto over = [this, round]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || !active_ || round_ != round;
    };
    if (mu_.AwaitWithDeadline(absl::Condition(&over), due_)) {
      // Ended in time: wait for the next round (or stop).
      auto next = [this, round]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || (active_ && round_ != round);
      };
      mu_.Await(absl::Condition(&next));
      continue;
    }
    publishing_ = true;
    const std::string key = key_;
    const absl::Time deadline = deadline_;
    mu_.Unlock();
    const bool ok = store_.Set(key, "1", deadline).ok();
    mu_.Lock();
    publishing_ = false;
    if (round_ == round) published_ = ok;
    auto done = [this, round]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || !active_ || round_ != round;
    };
    mu_.Await(absl::Condition(&done));
  }
}

}  // namespace packsched::group
