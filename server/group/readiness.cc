#include "server/group/readiness.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace packsched::group {

ReadinessWatch::ReadinessWatch(Group& group, std::function<void()> on_ready, absl::Duration slice,
                               absl::Duration log_every)
    : group_(group),
      on_ready_(std::move(on_ready)),
      slice_(slice),
      log_every_(log_every),
      thread_(&ReadinessWatch::Run, this) {}

ReadinessWatch::~ReadinessWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool ReadinessWatch::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), d);
  return stop_;
}

void ReadinessWatch::Run() {
  const GroupOptions& options = group_.options();
  const absl::Time start = absl::Now();
  absl::Time next_log = start + log_every_;
  absl::Status last_error;
  while (!SleepUnlessStopped(absl::ZeroDuration())) {
    const absl::Time slice_start = absl::Now();
    absl::StatusOr<bool> ready = group_.AwaitMembers(slice_start + slice_);
    if (ready.ok() && *ready) {
      spdlog::info("rank group ready: all {} ranks joined after {}", options.world_size,
                   absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))));
      if (on_ready_) on_ready_();
      return;
    }
    if (!ready.ok()) {
      last_error = ready.status();
      // A store error returns at once: wait out the rest of the slice before the next try.
      if (SleepUnlessStopped(slice_ - (absl::Now() - slice_start))) return;
    }
    if (absl::Now() >= next_log) {
      next_log = absl::Now() + log_every_;
      const std::string waited =
          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1)));
      const std::string error =
          last_error.ok() ? "" : absl::StrCat(" (last store error: ", last_error.ToString(), ")");
      if (options.rank == 0) {
        spdlog::info("waiting for the rank group: {} of {} ranks joined after {}{}",
                     group_.members_seen(), options.world_size, waited, error);
      } else {
        spdlog::info("waiting for the rank group ({} ranks) after {}{}", options.world_size, waited,
                     error);
      }
    }
  }
}

}  // namespace packsched::group
