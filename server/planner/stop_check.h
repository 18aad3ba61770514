#ifndef PACKSCHED_SERVER_PLANNER_STOP_CHECK_H_
#define PACKSCHED_SERVER_PLANNER_STOP_CHECK_H_

// How the planner's long loops honour BalanceOptions::stop (planner.h): each loop adds the steps
// it has done, and the caller's check is asked once about every kStepsPerCheck steps (a step is a
// few nanoseconds to a few tens: a check every well under a millisecond). Once the check has
// answered non-OK the answer sticks: every later Continue() is false and status() is that answer.
// Not thread-safe: one per planning run.

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace packsched::planner::internal {

class StopCheck {
 public:
  static constexpr int64_t kStepsPerCheck = int64_t{1} << 16;

  // `stop`: the caller's check, or empty (never stops). Must outlive this object.
  explicit StopCheck(const std::function<absl::Status()>& stop) : stop_(stop) {}

  // Counts `steps` (>= 0) more steps; false once the caller's check has answered non-OK.
  bool Continue(int64_t steps = 1) {
    if (!status_.ok()) return false;
    if (!stop_) return true;
    pending_ += steps;
    if (pending_ < kStepsPerCheck) return true;
    pending_ = 0;
    status_ = stop_();
    return status_.ok();
  }

  // Asks the caller's check now, whatever the steps counted; false once it has answered non-OK.
  bool ContinueNow() {
    if (status_.ok() && stop_) status_ = stop_();
    return status_.ok();
  }

  // OK, or the caller's check's first non-OK answer.
  const absl::Status& status() const { return status_; }

 private:
  const std::function<absl::Status()>& stop_;
  int64_t pending_ = 0;
  absl::Status status_;
};

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_STOP_CHECK_H_
