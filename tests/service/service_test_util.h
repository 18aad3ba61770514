#ifndef PACKSCHED_TESTS_SERVICE_SERVICE_TEST_UTIL_H_
#define PACKSCHED_TESTS_SERVICE_SERVICE_TEST_UTIL_H_

// Helpers for the coordinator tests: requests built the way the service builds them, a
// blocking Submit, and a collective whose rounds wait behind a gate.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/collective/local_collective.h"
#include "server/group/collective_agreement.h"
#include "server/service/convert.h"
#include "server/service/coordinator.h"

namespace packsched::service::testing {

using Result = absl::StatusOr<std::shared_ptr<const RoundResult>>;

inline v1::PlanRequest Request(const std::string& stream, int64_t round,
                               const std::vector<int64_t>& lengths, int64_t cap) {
  v1::PlanRequest request;
  request.set_stream(stream);
  request.set_round(round);
  request.mutable_lengths()->Assign(lengths.begin(), lengths.end());
  request.mutable_options()->set_max_token_len(cap);
  return request;
}

inline RoundInput Input(const v1::PlanRequest& request, const ServiceLimits& limits = {}) {
  absl::StatusOr<RoundInput> input = ToRoundInput(request, limits);
  return input.ok() ? *std::move(input) : RoundInput{};
}

// Options for a coordinator of a group of one (a LocalCollective per stream), the agreements
// the sidecar makes without group flags.
inline RoundCoordinator::Options OfOne() {
  RoundCoordinator::Options options;
  options.agreements =
      std::make_shared<group::CollectiveAgreements>(options.limits.collective_timeout);
  return options;
}

// A submitted call whose outcome can be awaited.
class Call {
 public:
  Call(RoundCoordinator& coordinator, RoundInput input) {
    coordinator.Submit(std::move(input), [this](Result result) {
      result_ = std::move(result);
      done_.Notify();
    });
  }
  bool done() const { return done_.HasBeenNotified(); }
  const Result& Wait() {
    done_.WaitForNotification();
    return result_;
  }

 private:
  absl::Notification done_;
  Result result_ = absl::UnknownError("not finished");
};

inline Result SubmitAndWait(RoundCoordinator& coordinator, RoundInput input) {
  Call call(coordinator, std::move(input));
  return call.Wait();
}

// A group of one whose AllReduce waits until the gate opens (or its deadline), counting the
// calls that entered — so a test can hold a round "running" while more callers arrive.
class Gate {
 public:
  void Open() { open_.Notify(); }
  // Blocks until `n` AllReduce calls have entered in total.
  void WaitEntered(int n) {
    absl::MutexLock lock(&mu_);
    while (entered_ < n) entered_cv_.Wait(&mu_);
  }

 private:
  friend class GatedCollective;
  absl::Notification open_;
  absl::Mutex mu_;
  absl::CondVar entered_cv_;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
};

class GatedCollective final : public ::packsched::collective::Collective {
 public:
  explicit GatedCollective(Gate* gate) : gate_(gate) {}
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  absl::string_view backend() const override { return "gated"; }
  absl::Status AllReduce(absl::Span<int64_t> values,
                         absl::Span<const ::packsched::collective::ReduceOp> ops,
                         absl::Time deadline) override {
    {
      absl::MutexLock lock(&gate_->mu_);
      ++gate_->entered_;
      gate_->entered_cv_.SignalAll();
    }
    // Waits for the gate, the deadline or Abort(), whichever comes first.
    while (!gate_->open_.WaitForNotificationWithTimeout(absl::Milliseconds(1))) {
      if (aborted_.load()) return absl::AbortedError("aborted at the gate");
      if (absl::Now() > deadline) return absl::DeadlineExceededError("gate closed");
    }
    return inner_.AllReduce(values, ops, deadline);
  }
  absl::Status AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                         absl::Time deadline) override {
    return inner_.AllGather(record, out, deadline);
  }
  void Abort() override {
    aborted_.store(true);
    inner_.Abort();
  }

 private:
  Gate* gate_;
  std::atomic<bool> aborted_{false};
  ::packsched::collective::LocalCollective inner_;
};

}  // namespace packsched::service::testing

#endif  // PACKSCHED_TESTS_SERVICE_SERVICE_TEST_UTIL_H_
