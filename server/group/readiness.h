#ifndef PACKSCHED_SERVER_GROUP_READINESS_H_
#define PACKSCHED_SERVER_GROUP_READINESS_H_

// The rank group's readiness, watched in the background: a sidecar serves (and answers health
// checks) before its peers are up, and this tells it — and, through the gRPC health service, a
// Kubernetes readiness probe — when every rank's sidecar has joined the run.

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/group/group.h"

namespace packsched::group {

class ReadinessWatch {
 public:
  // Starts a thread that calls group.AwaitMembers in slices of `slice` (so that stopping is
  // prompt), retrying store errors (rank 0 not up yet) every slice, and logging progress at info
  // every `log_every`. Calls `on_ready` (if not empty) once, on that thread, when the group is
  // complete. (The health status follows Group::serving() through its listener instead: it
  // also turns off between generations.)
  // REQUIRES: `group` outlives the watch, and nothing else calls AwaitMembers.
  ReadinessWatch(Group& group, std::function<void()> on_ready,
                 absl::Duration slice = absl::Milliseconds(250),
                 absl::Duration log_every = absl::Seconds(10));
  // Stops the thread and joins it: within one slice plus one store call.
  ~ReadinessWatch();

  ReadinessWatch(const ReadinessWatch&) = delete;
  ReadinessWatch& operator=(const ReadinessWatch&) = delete;

 private:
  void Run();
  // Waits `d` or until stopped; returns whether stopped.
  bool SleepUnlessStopped(absl::Duration d);

  Group& group_;
  const std::function<void()> on_ready_;
  const absl::Duration slice_;
  const absl::Duration log_every_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_READINESS_H_
