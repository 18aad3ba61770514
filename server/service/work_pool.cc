#include "server/service/work_pool.h"

#include <sched.h>

#include <algorithm>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/base/thread_name.h"

namespace packsched::service {

WorkPool::WorkPool(int64_t threads, int64_t queue, const std::string& name)
    : queue_capacity_(std::max<int64_t>(queue, 0)) {
  threads = std::max<int64_t>(threads, 1);
  workers_.reserve(threads);
  for (int64_t i = 0; i < threads; ++i) {
    // std::thread throws when the system refuses a thread (RLIMIT_NPROC, pids.max): the one
    // place this code catches, so that the caller can refuse to start instead of aborting.
    try {
      workers_.emplace_back([this, thread_name = absl::StrCat(name, "-", i)] {
        NameThisThread(thread_name);
        Work();
      });
    } catch (const std::system_error& e) {
      started_ = absl::ResourceExhaustedError(
          absl::StrCat("started ", i, " of ", threads, " threads: ", e.what()));
      break;
    }
  }
}

WorkPool::~WorkPool() {
  Shutdown();
  for (std::thread& worker : workers_) worker.join();
}

int64_t WorkPool::DefaultThreads() {
  cpu_set_t set;
  int64_t cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int64_t>(std::thread::hardware_concurrency());
  return std::max<int64_t>(cores / 2, 1);
}

absl::Status WorkPool::Submit(Task task) {
  absl::MutexLock lock(&mu_);
  if (exiting_) return absl::UnavailableError("the sidecar is shutting down");
  // Each idle worker takes one waiting task: the queue holds what no worker can take yet.
  const int64_t waiting = static_cast<int64_t>(queue_.size()) - idle_;
  if (waiting >= queue_capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "every planning worker is busy (--planning_threads = ", threads(), ") and ", waiting,
        " requests are waiting (--planning_queue = ", queue_capacity_, "); retry later"));
  }
  queue_.push_back(std::move(task));
  return absl::OkStatus();
}

void WorkPool::Shutdown() {
  stopping_.store(true, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  exiting_ = true;
}

void WorkPool::Work() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || exiting_; };
      mu_.Await(absl::Condition(&ready));
      --idle_;
      if (queue_.empty()) return;  // exiting, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)(stopping_);
  }
}

}  // namespace packsched::service
