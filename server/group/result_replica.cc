#include "server/group/result_replica.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "server/base/status_macros.h"
#include "server/group/group_keys.h"
#include "spdlog/spdlog.h"

namespace packsched::group {
namespace {

// More entries than this waiting for the store (it has been unreachable for many rounds): drop
// them and write everything kept once it is back instead (kept_ is bounded; the queue would not
// be).
constexpr size_t kMaxPending = 1024;
// How long a lookup waits for the folded mark at a time while some rank has not yet written what
// it keeps into the epoch (then the result is read again): the first wait, doubled after each up
// to the longest, so that a lookup makes O(log) requests however long the marks take (all of a
// group's ranks may be waiting at once, on a rank 0 that is still folding the marks).
constexpr absl::Duration kMarkPoll = absl::Milliseconds(50);
constexpr absl::Duration kLongestMarkPoll = absl::Milliseconds(800);
// How long rank 0 waits for a missing mark at a time (then it drains its writes): long enough for
// a rank 0 loaded by thousands of peers to answer its own store (a shutdown cancels the wait).
constexpr absl::Duration kFoldWait = absl::Seconds(1);
// How long the watcher waits on the connection at a time before it checks whether it is stopped
// (a local wait: no request).
constexpr absl::Duration kWatchSlice = absl::Milliseconds(200);

}  // namespace

ResultReplica::ResultReplica(Group& group, ReplicaOptions options)
    : group_(group), options_(options), thread_(&ResultReplica::Run, this) {
  if (group_.options_.rank != 0) watcher_ = std::thread(&ResultReplica::Watch, this);
}

ResultReplica::~ResultReplica() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  if (watcher_.joinable()) watcher_.join();
}

void ResultReplica::Watch() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    absl::StatusOr<bool> dropped = group_.store_->AwaitDisconnect(absl::Now() + kWatchSlice);
    if (!dropped.ok()) return;  // no connection to watch: the poll alone
    if (*dropped) {
      absl::MutexLock lock(&mu_);
      disconnected_ = true;
    }
  }
}

void ResultReplica::Record(const std::string& stream, int64_t round, std::string result) {
  const bool trims = group_.options_.rank == 0;
  absl::MutexLock lock(&mu_);
  std::map<int64_t, std::string>& rounds = kept_[stream];
  rounds[round] = result;
  pending_.push_back({stream, round, std::move(result)});
  while (static_cast<int64_t>(rounds.size()) > group_.options_.kept_results) {
    // Rank 0 deletes what it no longer keeps; the other ranks' copies are the same keys.
    if (trims) pending_.push_back({stream, rounds.begin()->first, std::string()});
    rounds.erase(rounds.begin());
  }
  if (pending_.size() > kMaxPending) {
    pending_.clear();
    resync_ = true;
  }
}

void ResultReplica::Forget(const std::string& stream) {
  absl::MutexLock lock(&mu_);
  kept_.erase(stream);
}

int64_t ResultReplica::epochs_replicated() const {
  absl::MutexLock lock(&mu_);
  return epochs_replicated_;
}

bool ResultReplica::WaitUnlessStopped(absl::Duration d, bool wake_on_work) {
  absl::MutexLock lock(&mu_);
  auto done = [this, wake_on_work]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (wake_on_work && (!pending_.empty() || disconnected_));
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), d);
  return stop_;
}

absl::Status ResultReplica::Write(const std::string& epoch, const Pending& entry) {
  const std::string key =
      keys::Result(keys::StreamRoot(keys::EpochRoot(group_.options_.key_root, epoch), entry.stream),
                   entry.round);
  const absl::Time deadline = absl::Now() + options_.poll;
  if (entry.result.empty()) return group_.store_->DeletePrefix(key, deadline).status();
  return group_.store_->Set(key, entry.result, deadline);
}

absl::Status ResultReplica::Replicate(const std::string& epoch) {
  std::vector<Pending> all;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [stream, rounds] : kept_) {
      for (const auto& [round, result] : rounds) all.push_back({stream, round, result});
    }
    pending_.clear();  // everything recorded so far is in `all`
    resync_ = false;
  }
  for (const Pending& entry : all) RETURN_IF_ERROR(Write(epoch, entry));
  const GroupOptions& options = group_.options_;
  if (options.rank == 0) return absl::OkStatus();  // rank 0's own store: nothing to wait for
  const std::string epoch_root = keys::EpochRoot(options.key_root, epoch);
  const absl::Time deadline = absl::Now() + options_.poll;
  // A restarted rank 0 waits for every rank's membership under its new epoch (readiness).
  RETURN_IF_ERROR(group_.store_->Set(keys::Member(epoch_root, options.rank), "1", deadline));
  return group_.store_->Set(keys::Replicated(epoch_root, options.rank), std::to_string(all.size()),
                            deadline);
}

void ResultReplica::Run() {
  const GroupOptions& options = group_.options_;
  std::string replicated;  // the epoch that holds everything kept here
  int64_t fold_next = 1;   // rank 0: the next rank whose mark FoldMarks waits for
  while (!WaitUnlessStopped(absl::ZeroDuration(), false)) {
    {
      absl::MutexLock lock(&mu_);
      disconnected_ = false;  // the read below is the one it asked for
    }
    // Rank 0: its own epoch, no store call. Others: one read, which also tells a restarted rank 0.
    // It waits (within the poll) for a restarted rank 0 to come up and publish its epoch.
    absl::StatusOr<std::string> epoch = group_.Epoch(absl::Now() + options_.poll);
    if (!epoch.ok()) {
      if (WaitUnlessStopped(options_.retry, false)) return;
      continue;
    }
    bool resync;
    {
      absl::MutexLock lock(&mu_);
      resync = resync_;
    }
    if (*epoch != replicated || resync) {
      if (absl::Status status = Replicate(*epoch); !status.ok()) {
        absl::MutexLock lock(&mu_);
        resync_ = true;
        continue;  // after the retry wait below
      }
      if (!replicated.empty() && *epoch != replicated) {
        spdlog::info("rank 0 restarted (run epoch {}): wrote the agreed results kept here into it",
                     *epoch);
      }
      replicated = *epoch;
      absl::MutexLock lock(&mu_);
      ++epochs_replicated_;
    }
    // Drain what is pending into this epoch.
    bool failed = false;
    while (true) {
      Pending entry;
      {
        absl::MutexLock lock(&mu_);
        if (stop_ || pending_.empty() || resync_) break;
        entry = pending_.front();
      }
      if (!Write(*epoch, entry).ok()) {
        failed = true;
        break;
      }
      absl::MutexLock lock(&mu_);
      // The entry written is the front one, unless Record's overflow rule cleared the queue
      // meanwhile; then resync_ is set and everything is written again anyway.
      if (!pending_.empty() && !resync_) pending_.pop_front();
    }
    if (failed) {
      // The store (rank 0) is unreachable: write everything kept once it is back, into whatever
      // epoch it then has.
      {
        absl::MutexLock lock(&mu_);
        resync_ = true;
      }
      if (WaitUnlessStopped(options_.retry, false)) return;
      continue;
    }
    // Rank 0 folds the marks of its epoch (it never changes in this process) until all are in.
    const bool folding = options.rank == 0 && fold_next <= options.world_size;
    const bool waited = folding && FoldMarks(*epoch, fold_next);
    // Idle: rank 0 until work arrives (while it still folds marks: at once after a wait for a
    // mark, a retry period after a store error); the others also wake every poll, and when their
    // connection to rank 0 drops, to read the epoch.
    const absl::Duration idle = options.rank != 0 ? options_.poll
                                : !folding        ? absl::InfiniteDuration()
                                : waited          ? absl::ZeroDuration()
                                                  : options_.retry;
    if (WaitUnlessStopped(idle, true)) return;
  }
}

bool ResultReplica::AllMarked(collective::KeyValueStore& store, const std::string& epoch,
                              absl::Time until) {
  const GroupOptions& options = group_.options_;
  {
    absl::MutexLock lock(&marks_mu_);
    if (marked_epoch_ == epoch) return true;
  }
  if (options.world_size > 2 || options.rank == 0) {
    // Not there by `until`, or the store could not tell: asked again at the next wait.
    if (!store.Get(keys::AllReplicated(keys::EpochRoot(options.key_root, epoch)), until).ok()) {
      return false;
    }
  }  // else no rank but rank 0 and this one
  absl::MutexLock lock(&marks_mu_);
  marked_epoch_ = epoch;  // for the rest of this epoch
  return true;
}

bool ResultReplica::FoldMarks(const std::string& epoch, int64_t& next) {
  const GroupOptions& options = group_.options_;
  const std::string epoch_root = keys::EpochRoot(options.key_root, epoch);
  // In rank order; a mark not there within kFoldWait is waited for again at the next pass (the
  // writer's queue is drained in between).
  while (next < options.world_size) {
    absl::StatusOr<std::string> mark =
        group_.store_->Get(keys::Replicated(epoch_root, next), absl::Now() + kFoldWait);
    if (!mark.ok()) return absl::IsDeadlineExceeded(mark.status());
    ++next;
  }
  if (next == options.world_size) {
    if (!group_.store_->Set(keys::AllReplicated(epoch_root), "1", absl::Now() + options_.poll)
             .ok()) {
      return false;
    }
    ++next;
  }
  return true;
}

absl::StatusOr<std::optional<std::string>> ResultReplica::Lookup(const std::string& stream,
                                                                 int64_t round,
                                                                 absl::Duration settle,
                                                                 absl::Time deadline) {
  const GroupOptions& options = group_.options_;
  collective::KeyValueStore& store = *group_.store_;
  ASSIGN_OR_RETURN(const std::string epoch, group_.Epoch(deadline));
  const std::string epoch_root = keys::EpochRoot(options.key_root, epoch);
  const std::string key = keys::Result(keys::StreamRoot(epoch_root, stream), round);
  // The store may have just started empty (rank 0 restarted): until every other rank has written
  // what it keeps into this epoch (its mark), a result not found may still come from any of
  // them. So while a mark is missing the result is read again after each wait for the folded
  // mark: found once one rank that finished the round has written it, however many ranks are
  // still down.
  ASSIGN_OR_RETURN(std::optional<std::string> found, store.TryGet(key, deadline));
  for (absl::Duration poll = kMarkPoll; !found.has_value();
       poll = std::min(2 * poll, kLongestMarkPoll)) {
    {
      absl::MutexLock lock(&marks_mu_);
      if (marked_epoch_ == epoch) break;  // every rank's results were in before this read
    }
    const bool all = AllMarked(store, epoch, std::min(deadline, absl::Now() + poll));
    // Read again either way: a rank writes its results before its mark.
    ASSIGN_OR_RETURN(found, store.TryGet(key, deadline));
    if (all) break;
    if (absl::Now() >= deadline) return std::nullopt;  // the round fails on its own deadline
  }
  if (found.has_value() || settle <= absl::ZeroDuration()) return found;
  absl::StatusOr<std::string> late = store.Get(key, std::min(deadline, absl::Now() + settle));
  if (absl::IsDeadlineExceeded(late.status())) return std::nullopt;
  if (!late.ok()) return late.status();
  return std::optional<std::string>(*std::move(late));
}

}  // namespace packsched::group
