#include "server/service/memory_budget.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packsched::service {

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->Release(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = other.bytes_;
  }
  return *this;
}

MemoryBudget::Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Release(bytes_);
}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::Reserve(int64_t bytes,
                                                                absl::string_view what) {
  absl::MutexLock lock(&mu_);
  // Compared as `bytes > limit - in_flight`: no overflow for any bytes.
  if (limit_ > 0 && bytes > limit_ - in_flight_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs an estimated ", bytes, " bytes at its peak (docs/design.md §3), with ",
        in_flight_, " bytes already in flight: over the server limit --max_inflight_bytes = ",
        limit_, " (retry later, or send fewer sequences or micro-batches)"));
  }
  in_flight_ += bytes;
  return Reservation(this, bytes);
}

void MemoryBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  in_flight_ -= bytes;
}

int64_t MemoryBudget::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace packsched::service
