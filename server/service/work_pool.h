#ifndef PACKSCHED_SERVER_SERVICE_WORK_POOL_H_
#define PACKSCHED_SERVER_SERVICE_WORK_POOL_H_

// The sidecar's own workers for heavy requests (BalanceBatch, Partition): a fixed number of
// threads and a bounded queue, so that gRPC's callback threads only parse, reserve and hand off,
// and stay free for health checks, readiness and Plan however many heavy requests arrive.
// A task that finds the queue full is refused at once (ResourceExhausted naming the limits).
// Every task gets the pool's stop flag: Shutdown() sets it, so a task in progress (planning polls
// it, planner.h's BalanceOptions::stop) ends within its next check and a queued one starts
// already stopped. Thread-safe.

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace packsched::service {

class WorkPool {
 public:
  // A task: runs once on a worker. `stopping` reads true once the pool is shutting down.
  using Task = absl::AnyInvocable<void(const std::atomic<bool>& stopping) &&>;

  // `threads` >= 1 workers (named `name`-N), at most `queue` (>= 0) tasks waiting for one. A
  // worker the system refuses to create ends the starting there: started() says so.
  WorkPool(int64_t threads, int64_t queue, const std::string& name);
  // Shutdown(), then joins the workers.
  ~WorkPool();

  // Runs `task` on a worker, or returns ResourceExhausted (every worker busy and the queue
  // full) or Unavailable (shutting down) without running it.
  absl::Status Submit(Task task);

  // Sets the stop flag every task sees; the workers finish the tasks in progress and run the
  // queued ones (each sees the flag set, so they end at once), then exit. Idempotent.
  void Shutdown();

  // The default worker count: half the cores the process may run on, at least one — the other
  // half stays with gRPC's threads and the streams' rounds.
  static int64_t DefaultThreads();

  int64_t threads() const { return static_cast<int64_t>(workers_.size()); }

  // OK when every worker asked for was started; otherwise ResourceExhausted "started N of M
  // threads: <the system's reason>" (the pool still works with the N).
  absl::Status started() const { return started_; }
  int64_t queue_capacity() const { return queue_capacity_; }

 private:
  void Work();

  const int64_t queue_capacity_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  int64_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
  absl::Status started_;
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_WORK_POOL_H_
