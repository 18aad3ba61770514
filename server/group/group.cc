#include "server/group/group.h"

#include <atomic>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "server/base/status_macros.h"
#include "server/group/backend_agreement.h"
#include "server/group/group_keys.h"
#include "server/group/stream_group.h"

namespace packsched::group {
namespace {

std::string RandomEpoch() {
  std::random_device device;
  const uint64_t high = (uint64_t{device()} << 32) | device();
  const uint64_t low = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return absl::StrFormat("%016x", high ^ low);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Group>> Group::Create(collective::KeyValueStore* store,
                                                     GroupOptions options) {
  if (options.world_size < 1 || options.world_size > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be in [1, 2^20], got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [0, ", options.world_size, "), got ", options.rank));
  }
  if (options.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("collective_timeout must be positive");
  }
  if (options.backend == collective::Backend::kLocal && options.world_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the local backend is a group of one, not ", options.world_size));
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("a group of ", options.world_size, " with backend ",
                     collective::BackendName(options.backend), " needs a rendezvous store"));
  }
  if (options.gloo.algorithm != collective::GlooOptions::Algorithm::kRecursiveDoubling) {
    // Gloo's own algorithms form without the bounds a sidecar relies on (gloo_collective.h).
    return absl::InvalidArgumentError(
        "a rank group's Gloo all-reduce is recursive doubling; bcube and ring are for "
        "benchmarks only");
  }
  if (options.kept_results < 1) {
    return absl::InvalidArgumentError("kept_results must be at least 1");
  }
  std::string epoch = options.rank == 0 ? RandomEpoch() : std::string();
  return std::unique_ptr<Group>(new Group(store, std::move(options), std::move(epoch)));
}

Group::Group(collective::KeyValueStore* store, GroupOptions options, std::string epoch)
    : store_(store), options_(std::move(options)), epoch_(std::move(epoch)) {
  // A group of one is complete from the start (it serves without waiting for anyone).
  if (options_.world_size == 1) MarkReady();
}

std::unique_ptr<StreamGroup> Group::ForStream(std::string stream) {
  return std::unique_ptr<StreamGroup>(new StreamGroup(*this, std::move(stream)));
}

absl::StatusOr<std::string> Group::Epoch(absl::Time deadline) {
  const std::string key = keys::Epoch(options_.key_root);
  if (options_.rank == 0) {
    // Rank 0 serves the store in its own process: once published, the epoch stays there.
    if (epoch_published_.load(std::memory_order_acquire)) return epoch_;
    RETURN_IF_ERROR(store_->Set(key, epoch_, deadline));
    epoch_published_.store(true, std::memory_order_release);
    return epoch_;
  }
  absl::StatusOr<std::string> epoch = store_->Get(key, deadline);
  if (absl::IsDeadlineExceeded(epoch.status())) {
    return absl::DeadlineExceededError(
        "rank 0 has not published the run epoch in time: ranks [0] did not join");
  }
  return epoch;
}

absl::StatusOr<collective::Backend> Group::ResolveBackend(absl::string_view epoch_root,
                                                          absl::Time deadline) {
  if (options_.backend != collective::Backend::kAuto) return options_.backend;
  if (options_.world_size == 1) return collective::Backend::kLocal;
  {
    absl::MutexLock lock(&mu_);
    auto it = decided_.find(epoch_root);
    if (it != decided_.end()) return it->second;
  }
  const bool can = options_.can_use_nccl.value_or(collective::CanUseNccl());
  ASSIGN_OR_RETURN(collective::Backend decided, AgreeOnBackend(*store_, epoch_root, options_.rank,
                                                               options_.world_size, can, deadline));
  absl::MutexLock lock(&mu_);
  decided_.emplace(std::string(epoch_root), decided);
  return decided;
}

void Group::MarkReady() {
  members_seen_.store(options_.world_size, std::memory_order_release);
  ready_.store(true, std::memory_order_release);
  NotifyServing();
}

void Group::CountFailedStream(int64_t delta) {
  failed_streams_.fetch_add(delta, std::memory_order_acq_rel);
  NotifyServing();
}

void Group::NotifyServing() {
  absl::MutexLock lock(&listener_mu_);
  if (!listener_) return;
  // Read under the lock: whichever change is told last, it is told the value after every change.
  const bool now = serving();
  if (told_ == now) return;
  told_ = now;
  listener_(now);
}

void Group::SetServingListener(std::function<void(bool)> listener) {
  {
    absl::MutexLock lock(&listener_mu_);
    listener_ = std::move(listener);
    told_.reset();
  }
  NotifyServing();
}

absl::StatusOr<bool> Group::AwaitMembers(absl::Time deadline) {
  if (ready()) return true;
  if (options_.world_size == 1) {
    MarkReady();
    return true;
  }
  absl::StatusOr<std::string> epoch = Epoch(deadline);
  if (absl::IsDeadlineExceeded(epoch.status())) return false;
  if (!epoch.ok()) return epoch.status();
  const std::string epoch_root = keys::EpochRoot(options_.key_root, *epoch);
  if (!member_published_) {
    RETURN_IF_ERROR(store_->Set(keys::Member(epoch_root, options_.rank), "1", deadline));
    member_published_ = true;
  }
  auto wait = [&](const std::string& key) -> absl::StatusOr<bool> {
    absl::StatusOr<std::string> value = store_->Get(key, deadline);
    if (absl::IsDeadlineExceeded(value.status())) return false;
    if (!value.ok()) return value.status();
    return true;
  };
  if (options_.rank == 0) {
    // In rank order, resuming after the ranks already seen.
    for (int64_t r = members_seen_.load(); r < options_.world_size; ++r) {
      ASSIGN_OR_RETURN(const bool joined, wait(keys::Member(epoch_root, r)));
      if (!joined) return false;
      members_seen_.store(r + 1, std::memory_order_release);
    }
    RETURN_IF_ERROR(store_->Set(keys::Complete(epoch_root), "1", deadline));
  } else {
    ASSIGN_OR_RETURN(const bool complete, wait(keys::Complete(epoch_root)));
    if (!complete) return false;
  }
  MarkReady();
  return true;
}

}  // namespace packsched::group
