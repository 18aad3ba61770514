#ifndef PACKSCHED_SERVER_SERVICE_MEMORY_BUDGET_H_
#define PACKSCHED_SERVER_SERVICE_MEMORY_BUDGET_H_

// The sidecar's in-flight memory budget (--max_inflight_bytes; docs/design.md §3, memory per
// request): every request reserves its estimated peak (request_memory.h, RequestMemory) before
// anything sized by it is allocated, and gives it back when its call's messages are freed (after
// the response is written). A request that does not fit is refused at once with ResourceExhausted;
// nothing ever waits for room. No gRPC here.

#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace packsched::service {

class MemoryBudget {
 public:
  // Holds `bytes` of the budget until destroyed (or moved from). Movable, not copyable.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept
        : budget_(std::exchange(other.budget_, nullptr)), bytes_(other.bytes_) {}
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();
    int64_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}
    MemoryBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  // `limit` bytes in flight at most; 0 disables the budget (every reservation succeeds).
  // REQUIRES: limit >= 0.
  explicit MemoryBudget(int64_t limit) : limit_(limit) {}

  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Reserves `bytes` for `what` (a request's name in the error), or ResourceExhausted naming
  // the estimate, what is in flight and --max_inflight_bytes when they would exceed the limit.
  // Never blocks. Thread-safe. REQUIRES: bytes >= 0.
  absl::StatusOr<Reservation> Reserve(int64_t bytes, absl::string_view what);

  int64_t in_flight() const;
  int64_t limit() const { return limit_; }

 private:
  void Release(int64_t bytes);

  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_MEMORY_BUDGET_H_
