#include "server/group/collective_agreement.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/collective/local_collective.h"
#include "server/group/round.h"

namespace packsched::group {

class CollectiveAgreement final : public RoundAgreement {
 public:
  CollectiveAgreement(CollectiveAgreements& owner, std::string stream)
      : owner_(owner), stream_(std::move(stream)) {}

  absl::StatusOr<AgreedRound> Agree(const RoundRecord& record) override {
    std::shared_ptr<collective::Collective> group;
    {
      absl::MutexLock lock(&mu_);
      group = collective_;
    }
    if (group == nullptr) {
      absl::StatusOr<std::unique_ptr<collective::Collective>> made = owner_.Make(stream_);
      if (!made.ok()) return made.status();
      group = *std::move(made);
      absl::MutexLock lock(&mu_);
      if (aborted_) group->Abort();  // a shutdown came while it was made
      collective_ = group;
      info_.formed = true;
      info_.backend = std::string(group->backend());
      info_.generation = 0;
    }
    absl::StatusOr<AgreedRound> agreed =
        AgreeRound(*group, record, absl::Now() + owner_.collective_timeout_);
    if (!agreed.ok() &&
        (absl::IsDeadlineExceeded(agreed.status()) || absl::IsAborted(agreed.status()))) {
      // The group is unusable after a collective failure: form it again for the next round.
      absl::MutexLock lock(&mu_);
      collective_.reset();
      info_.formed = false;
      info_.last_error = agreed.status();
    }
    return agreed;
  }

  void Abort() override {
    absl::MutexLock lock(&mu_);
    aborted_ = true;
    if (collective_ != nullptr) collective_->Abort();
  }

  GroupInfo info() const override {
    absl::MutexLock lock(&mu_);
    return info_;
  }

 private:
  CollectiveAgreements& owner_;
  const std::string stream_;
  mutable absl::Mutex mu_;
  std::shared_ptr<collective::Collective> collective_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  GroupInfo info_ ABSL_GUARDED_BY(mu_);
};

CollectiveAgreements::CollectiveAgreements(absl::Duration collective_timeout,
                                           CollectiveFactory make)
    : collective_timeout_(collective_timeout), make_(std::move(make)) {}

std::unique_ptr<RoundAgreement> CollectiveAgreements::ForStream(std::string stream) {
  return std::make_unique<CollectiveAgreement>(*this, std::move(stream));
}

void CollectiveAgreements::SetServingListener(std::function<void(bool)> listener) {
  if (listener) listener(true);
}

absl::StatusOr<std::unique_ptr<collective::Collective>> CollectiveAgreements::Make(
    absl::string_view stream) {
  absl::StatusOr<std::unique_ptr<collective::Collective>> made =
      make_ ? make_(stream)
            : absl::StatusOr<std::unique_ptr<collective::Collective>>(
                  std::make_unique<collective::LocalCollective>());
  if (made.ok()) world_size_.store((*made)->world_size(), std::memory_order_release);
  return made;
}

}  // namespace packsched::group
