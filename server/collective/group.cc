#include "server/collective/group.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/base/status_macros.h"
#include "server/collective/group_keys.h"
#include "server/collective/local_collective.h"

namespace packsched::collective {
namespace {

// Ranks named in one message at most; the rest are counted.
constexpr size_t kNamedRanks = 16;
// A rank publishes its arrival in a round only when the round is still running this long after
// it began (or a quarter of the collective timeout, if shorter): see arrival.h.
constexpr absl::Duration kArrivalDelay = absl::Milliseconds(100);
// How long a rank whose collective failed at once waits for the generation's recorded end.
constexpr absl::Duration kEndedWait = absl::Milliseconds(250);
// The store calls that record the end of a formation that was aborted (Abort()) end by then.
constexpr absl::Duration kAbortedCleanup = absl::Milliseconds(250);
// The store calls that explain and end a failed round or formation end by its deadline plus this.
constexpr absl::Duration kCleanupMargin = absl::Milliseconds(750);
// Rank 0 deletes the keys of ended generations (all of them, from the lowest not yet deleted):
// at most this many when it forms a generation, and this many after each round it completes, so
// that the backlog of a long outage (a generation per failed round) drains in a few calls each.
constexpr int64_t kGenerationsCleanedPerFormation = 64;
constexpr int64_t kGenerationsCleanedPerRound = 8;

// Forwards to a collective and remembers whether any call failed, so a round that fails on its
// records (the generation is fine) is told apart from one whose collective failed.
class FailureTracking final : public Collective {
 public:
  explicit FailureTracking(Collective& inner) : inner_(inner) {}
  bool failed() const { return failed_; }

  int64_t rank() const override { return inner_.rank(); }
  int64_t world_size() const override { return inner_.world_size(); }
  absl::string_view backend() const override { return inner_.backend(); }
  absl::Status AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                         absl::Time deadline) override {
    return Track(inner_.AllReduce(values, ops, deadline));
  }
  absl::Status AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                         absl::Time deadline) override {
    return Track(inner_.AllGather(record, out, deadline));
  }
  void Abort() override { inner_.Abort(); }

 private:
  absl::Status Track(absl::Status status) {
    failed_ |= !status.ok();
    return status;
  }

  Collective& inner_;
  bool failed_ = false;
};

std::string StoreUnreachable(const absl::Status& error) {
  return absl::StrCat("rendezvous store (rank 0) unreachable: ", error.message());
}

std::string RandomEpoch() {
  std::random_device device;
  const uint64_t high = (uint64_t{device()} << 32) | device();
  const uint64_t low = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return absl::StrFormat("%016x", high ^ low);
}

}  // namespace

// The store calls that explain and end a failed round or formation. They share one deadline (the
// round's own plus kCleanupMargin), do not wait for an unreachable store (FailFast), and stop at
// the first call that finds it unreachable (Unavailable, or DeadlineExceeded from a call that
// does not wait for a key): a dead or stopped rank 0 then costs one bounded call, not one per
// call, and the failure is reported as the store's instead of as ranks missing.
inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

class CleanupCalls {
 public:
  CleanupCalls(KeyValueStore& store, absl::Time deadline)
      : store_(store.FailFast()), deadline_(deadline) {}

  // The first unreachable error, or OK.
  const absl::Status& unreachable() const { return unreachable_; }

  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.TryGet(key, deadline_), /*waits_for_key=*/false);
  }
  // Waits for `key` until `until` at most: DeadlineExceeded then means it was not set.
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time until) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.Get(key, std::min(until, deadline_)), /*waits_for_key=*/true);
  }
  absl::Status Set(absl::string_view key, absl::string_view value) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.Set(key, value, deadline_), false);
  }
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired) {
    if (!unreachable_.ok()) return unreachable_;
    return Track(store_.CompareAndSet(key, expected, desired, deadline_), false);
  }

 private:
  template <typename T>
  T Track(T result, bool waits_for_key) {
    const absl::Status& status = StatusOf(result);
    if (absl::IsUnavailable(status) || (absl::IsDeadlineExceeded(status) && !waits_for_key)) {
      unreachable_ = status;
    }
    return result;
  }

  KeyValueStore& store_;
  const absl::Time deadline_;
  absl::Status unreachable_;
};

// ---- Group ------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Group>> Group::Create(KeyValueStore* store, GroupOptions options) {
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
  if (options.backend == Backend::kLocal && options.world_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the local backend is a group of one, not ", options.world_size));
  }
  if (store == nullptr && (options.world_size != 1 || (options.backend != Backend::kLocal &&
                                                       options.backend != Backend::kAuto))) {
    return absl::InvalidArgumentError(absl::StrCat("a group of ", options.world_size,
                                                   " with backend ", BackendName(options.backend),
                                                   " needs a rendezvous store"));
  }
  if (options.gloo.algorithm != GlooOptions::Algorithm::kRecursiveDoubling) {
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

Group::Group(KeyValueStore* store, GroupOptions options, std::string epoch)
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

absl::StatusOr<Backend> Group::ResolveBackend(absl::string_view epoch_root, absl::Time deadline) {
  if (options_.backend != Backend::kAuto) return options_.backend;
  if (options_.world_size == 1) return Backend::kLocal;
  {
    absl::MutexLock lock(&mu_);
    auto it = decided_.find(epoch_root);
    if (it != decided_.end()) return it->second;
  }
  const bool can = options_.can_use_nccl.value_or(CanUseNccl());
  ASSIGN_OR_RETURN(Backend decided, AgreeOnBackend(*store_, epoch_root, options_.rank,
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
  if (local() || options_.world_size == 1) {
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

// ---- StreamGroup ------------------------------------------------------------------------------

StreamGroup::StreamGroup(Group& group, std::string stream)
    : group_(group), stream_(std::move(stream)) {}

StreamGroup::~StreamGroup() {
  SetFailed(false);  // a stream that is gone is not between generations
  std::shared_ptr<Collective> last;
  absl::MutexLock lock(&mu_);
  last = std::move(collective_);
}

absl::Time StreamGroup::Deadline() const {
  return absl::Now() + group_.options_.collective_timeout;
}

GroupInfo StreamGroup::info() const {
  absl::MutexLock lock(&mu_);
  return info_;
}

void StreamGroup::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
  if (collective_ != nullptr) collective_->Abort();
  if (forming_ != nullptr) forming_->Cancel();
}

void StreamGroup::SetFailure(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    info_.last_error = std::move(status);
  }
  SetFailed(true);
}

void StreamGroup::SetFailed(bool failed) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_ == failed) return;
    failed_ = failed;
  }
  // Outside mu_: the listener may take locks of its own (the health service's).
  group_.CountFailedStream(failed ? 1 : -1);
}

absl::Status StreamGroup::AbortedAtShutdown() const {
  return absl::AbortedError(
      absl::StrCat("stream '", stream_, "': aborted (the sidecar is shutting down)"));
}

absl::Status StreamGroup::Form() {
  absl::Status status = FormIfNeeded(Deadline());
  if (!status.ok()) SetFailure(status);
  return status;
}

absl::Status StreamGroup::FormIfNeeded(absl::Time deadline) {
  const GroupOptions& options = group_.options_;
  if (group_.local()) {
    absl::MutexLock lock(&mu_);
    if (collective_ == nullptr && aborted_) return AbortedAtShutdown();
    if (collective_ == nullptr) {
      collective_ = std::make_shared<LocalCollective>();
      info_.formed = true;
      info_.backend = "local";
      info_.generation = 0;
    }
    return absl::OkStatus();
  }
  KeyValueStore& store = *group_.store_;

  // Formed: used as it is, with no store call. If its generation has ended meanwhile (a round
  // this rank sat out failed, or a peer restarted), its first call fails at once on connections
  // the peers have closed, and Agree moves to the next generation (StaleGeneration).
  std::shared_ptr<Cancellation> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (collective_ != nullptr) return absl::OkStatus();  // after Abort(), its calls fail
    if (aborted_) return AbortedAtShutdown();
    forming_ = cancel = std::make_shared<Cancellation>();  // for Abort()
  }
  absl::Cleanup formed_or_not = [this] {
    absl::MutexLock lock(&mu_);
    forming_.reset();
  };

  ASSIGN_OR_RETURN(const std::string epoch, group_.Epoch(deadline));
  const std::string epoch_root = keys::EpochRoot(options.key_root, epoch);
  stream_root_ = keys::StreamRoot(epoch_root, stream_);
  auto parse = [&](absl::string_view text) -> absl::StatusOr<int64_t> {
    int64_t value;
    if (!absl::SimpleAtoi(text, &value)) {
      return absl::InternalError(
          absl::StrCat("store: generation of stream '", stream_, "' is '", text, "'"));
    }
    return value;
  };
  ASSIGN_OR_RETURN(
      const std::string generation_text,
      store.CompareAndSet(keys::Generation(stream_root_), std::nullopt, "0", deadline));
  ASSIGN_OR_RETURN(int64_t generation, parse(generation_text));
  if (!tried_to_form_) {
    tried_to_form_ = true;
    // This process's first formation of the stream. If an earlier incarnation of this rank
    // (before a restart) joined the current generation, the peers may still hold it, with
    // connections to the dead process: end it (the loop below moves past it), so they re-form
    // with this one at their next call instead of failing a round first.
    ASSIGN_OR_RETURN(
        std::optional<std::string> joined_before,
        store.TryGet(keys::Joined(keys::Formation(stream_root_, generation), options.rank),
                     deadline));
    if (joined_before.has_value()) {
      RETURN_IF_ERROR(store
                          .CompareAndSet(keys::Ended(keys::Formation(stream_root_, generation)),
                                         std::nullopt, "restart", deadline)
                          .status());
    }
  }
  if (unrecorded_end_.has_value()) {
    if (unrecorded_end_->stream_root == stream_root_ && unrecorded_end_->generation == generation) {
      RETURN_IF_ERROR(store
                          .CompareAndSet(keys::Ended(keys::Formation(stream_root_, generation)),
                                         std::nullopt, unrecorded_end_->cause, deadline)
                          .status());
    }
    unrecorded_end_.reset();
  }
  // Never join a generation that has ended. Its end is recorded before the number moves on (so
  // that a rank still holding it can read why), and a rank can read the cause and then the old
  // number in between: it would join the ended generation and dial its dead connections (a
  // restarted peer's old address) while the others form the next one.
  for (;;) {
    ASSIGN_OR_RETURN(
        const std::optional<std::string> ended,
        store.TryGet(keys::Ended(keys::Formation(stream_root_, generation)), deadline));
    if (!ended.has_value()) break;
    ASSIGN_OR_RETURN(const std::string moved,
                     store.CompareAndSet(keys::Generation(stream_root_), absl::StrCat(generation),
                                         absl::StrCat(generation + 1), deadline));
    ASSIGN_OR_RETURN(const int64_t next, parse(moved));
    if (next <= generation) {
      return absl::InternalError(absl::StrCat("store: generation of stream '", stream_,
                                              "' went from ", generation, " to ", next));
    }
    generation = next;
  }
  const std::string formation = keys::Formation(stream_root_, generation);
  RETURN_IF_ERROR(store.Set(keys::Joined(formation, options.rank), "1", deadline));

  absl::StatusOr<std::unique_ptr<Collective>> formed = [&]() {
    absl::StatusOr<Backend> backend = group_.ResolveBackend(epoch_root, deadline);
    if (!backend.ok()) return absl::StatusOr<std::unique_ptr<Collective>>(backend.status());
    GlooOptions gloo = options.gloo;
    gloo.wait_timeout = options.collective_timeout;  // every round's deadline is within it
    return FormCollective(*backend, store, formation, options.rank, options.world_size, gloo,
                          options.nccl, deadline, cancel.get());
  }();
  if (!formed.ok() && cancel->cancelled()) {
    // Aborted (a shutdown): nobody to blame. This rank's half of the generation is gone, so end
    // it; the store calls that record the end wait briefly (at shutdown they fail at once).
    absl::Status status =
        absl::AbortedError(absl::StrCat("stream '", stream_, "': forming generation ", generation,
                                        " was aborted (", formed.status().message(), ")"));
    CleanupCalls cleanup(store, absl::Now() + kAbortedCleanup);
    EndGeneration(generation, status, "formation", cleanup);
    return status;
  }
  if (!formed.ok()) {
    absl::Status status = formed.status();
    CleanupCalls cleanup(store, std::max(deadline, absl::Now()) + kCleanupMargin);
    // A rank that never joined is the cause whether this rank waited for it (a deadline) or a
    // peer that waited for it gave up first and closed its connections (aborted, unavailable).
    std::optional<std::string> missing;
    if (absl::IsDeadlineExceeded(status) || absl::IsAborted(status) ||
        absl::IsUnavailable(status)) {
      missing = MissingRanks(cleanup, [&](int64_t rank) { return keys::Joined(formation, rank); });
    }
    const std::string what = absl::StrCat("stream '", stream_, "': generation ", generation);
    if (missing.has_value() && *missing != "[]") {
      status = absl::DeadlineExceededError(absl::StrCat(
          what, " did not form within ", absl::FormatDuration(options.collective_timeout),
          ": ranks ", *missing, " did not join (", status.message(), ")"));
    } else if (!cleanup.unreachable().ok()) {
      status =
          absl::Status(status.code(), absl::StrCat(what, " did not form: ", status.message(), "; ",
                                                   StoreUnreachable(cleanup.unreachable())));
    } else if (absl::IsDeadlineExceeded(status) || absl::IsAborted(status)) {
      // Every rank joined: the backend names the rank that did not connect, or went away.
      status = absl::Status(status.code(), absl::StrCat(what, " did not form: ", status.message()));
    }
    EndGeneration(generation, status, "formation", cleanup);
    return status;
  }
  if (options.rank == 0)
    CleanEndedGenerations(generation, kGenerationsCleanedPerFormation, deadline);
  {
    absl::MutexLock lock(&mu_);
    collective_ = std::shared_ptr<Collective>(std::move(formed).value());
    if (cancel->cancelled()) collective_->Abort();  // aborted just as formation completed
    info_.formed = true;
    info_.backend = std::string(collective_->backend());
    info_.generation = generation;
    info_.epoch = epoch;
  }
  // Forming needs every rank: the run is complete, whatever AwaitMembers has seen. (After rank 0
  // restarts, the survivors, long ready, never publish their membership under its new epoch.)
  group_.MarkReady();
  SetFailed(false);
  return absl::OkStatus();
}

absl::StatusOr<AgreedRound> StreamGroup::Agree(const RoundRecord& record) {
  const absl::Time deadline = Deadline();
  absl::StatusOr<AgreedRound> agreed = AgreeOnce(record, deadline, /*first=*/true);
  if (agreed.ok() || !absl::IsAborted(agreed.status()) || group_.local()) return agreed;
  if (!stale_) return agreed;
  // The collective belonged to a generation that had already ended before this round: run the
  // round on the next one (the peers form it at their next call), within the same deadline.
  return AgreeOnce(record, deadline, /*first=*/false);
}

bool StreamGroup::StaleGeneration(int64_t generation, int64_t round, CleanupCalls& cleanup) {
  // Waits a moment for the cause: a restarted peer that reaches this round at the same time as
  // this rank records "restart" just after its first call, and a peer that dies during the round
  // is recorded by whichever rank noticed first.
  absl::StatusOr<std::string> why =
      cleanup.Get(keys::Ended(keys::Formation(stream_root_, generation)), absl::Now() + kEndedWait);
  if (why.ok()) return *why != absl::StrCat("round ", round);
  if (!absl::IsDeadlineExceeded(why.status())) return false;
  // Rank 0 restarted with an empty store: its run epoch is new (or not yet published), and this
  // generation never was in it.
  absl::StatusOr<std::optional<std::string>> epoch =
      cleanup.TryGet(keys::Epoch(group_.options_.key_root));
  std::string mine;
  {
    absl::MutexLock lock(&mu_);
    mine = info_.epoch;
  }
  return epoch.ok() && (!epoch->has_value() || **epoch != mine);
}

absl::StatusOr<AgreedRound> StreamGroup::AgreeOnce(const RoundRecord& record, absl::Time deadline,
                                                   bool first) {
  const GroupOptions& options = group_.options_;
  stale_ = false;
  absl::Status formed = FormIfNeeded(deadline);
  if (!formed.ok()) {
    SetFailure(formed);
    return formed;
  }
  std::shared_ptr<Collective> collective;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    collective = collective_;
    generation = info_.generation;
  }
  if (group_.local()) return AgreeRound(*collective, record, deadline);

  KeyValueStore& store = *group_.store_;
  if (arrival_ == nullptr) {
    arrival_ = std::make_unique<ArrivalPublisher>(
        store, std::min(options.collective_timeout / 4, kArrivalDelay));
  }
  const std::string formation = keys::Formation(stream_root_, generation);
  const std::string arrival = keys::Arrival(formation, record.round, options.rank);
  arrival_->Begin(arrival, deadline);
  FailureTracking tracked(*collective);
  absl::StatusOr<AgreedRound> agreed = AgreeRound(tracked, record, deadline);
  const bool published = arrival_->End();
  if (agreed.ok()) {
    // Every rank has arrived; a key published by a slow round has served its purpose.
    if (published) store.DeletePrefix(arrival, deadline).IgnoreError();
    if (options.rank == 0) CleanEndedGenerations(generation, kGenerationsCleanedPerRound, deadline);
    return agreed;
  }
  if (!tracked.failed()) return agreed.status();  // failed on its records; the group is fine

  absl::Status status = agreed.status();
  CleanupCalls cleanup(store, std::max(deadline, absl::Now()) + kCleanupMargin);
  if (first && absl::IsAborted(status) && StaleGeneration(generation, record.round, cleanup)) {
    // Ended before this round: drop it without failing the round (Agree runs it again).
    absl::MutexLock lock(&mu_);
    collective_.reset();
    info_.formed = false;
    stale_ = true;
    return status;
  }
  // A rank that timed out waiting for a missing peer records why (per generation and round)
  // before its collective closes its connections; the closures reach the ranks still waiting as
  // resets (Aborted). Every rank then reports the recorded timeout, so all fail alike, naming the
  // missing ranks.
  const std::string timeout_key = keys::Timeout(formation, record.round);
  bool recorded = false;
  if (absl::IsDeadlineExceeded(status) || absl::IsAborted(status)) {
    absl::StatusOr<std::optional<std::string>> verdict = cleanup.TryGet(timeout_key);
    if (verdict.ok() && verdict->has_value()) {
      status = absl::DeadlineExceededError(**verdict);
      recorded = true;
    }
  }
  const std::string what = absl::StrCat("stream '", stream_, "' round ", record.round);
  if (absl::IsDeadlineExceeded(status) && !recorded) {
    const std::optional<std::string> missing = MissingRanks(
        cleanup, [&](int64_t rank) { return keys::Arrival(formation, record.round, rank); });
    if (!missing.has_value()) {
      status = absl::DeadlineExceededError(absl::StrCat(
          what, ": did not complete within ", absl::FormatDuration(options.collective_timeout),
          ", and the ranks that did not arrive cannot be named: ",
          StoreUnreachable(cleanup.unreachable()), " (", status.message(), ")"));
    } else if (*missing == "[]") {
      status = absl::DeadlineExceededError(absl::StrCat(
          what, ": every rank arrived but the collective did not complete within ",
          absl::FormatDuration(options.collective_timeout), " (", status.message(), ")"));
    } else {
      status = absl::DeadlineExceededError(
          absl::StrCat(what, ": ranks ", *missing, " did not arrive within ",
                       absl::FormatDuration(options.collective_timeout)));
      cleanup.Set(timeout_key, status.message()).IgnoreError();
    }
  } else if (!cleanup.unreachable().ok() && !recorded) {
    status = absl::Status(status.code(), absl::StrCat(what, ": ", status.message(), "; ",
                                                      StoreUnreachable(cleanup.unreachable())));
  }
  EndGeneration(generation, status, absl::StrCat("round ", record.round), cleanup);
  SetFailure(status);
  return status;
}

void StreamGroup::EndGeneration(int64_t generation, absl::Status why, absl::string_view cause,
                                CleanupCalls& cleanup) {
  // Why it ended, before it does: a rank still holding it reads this when its next call fails.
  // Several ranks end the same generation; compare-and-set makes it one bump.
  const bool recorded = cleanup
                            .CompareAndSet(keys::Ended(keys::Formation(stream_root_, generation)),
                                           std::nullopt, cause)
                            .ok() &&
                        cleanup
                            .CompareAndSet(keys::Generation(stream_root_), absl::StrCat(generation),
                                           absl::StrCat(generation + 1))
                            .ok();
  if (!recorded) {
    // The store could not be reached: the next formation records the end first, so that this
    // rank never forms the ended generation again (its keys are spent).
    unrecorded_end_ = UnrecordedEnd{stream_root_, generation, std::string(cause)};
  }
  std::shared_ptr<Collective> spent;
  {
    absl::MutexLock lock(&mu_);
    spent = std::move(collective_);
    info_.formed = false;
    info_.last_error = std::move(why);
  }
  // Destroyed outside the lock: a Gloo member closes its connections, so peers still waiting
  // fail at once.
}

void StreamGroup::CleanEndedGenerations(int64_t generation, int64_t at_most, absl::Time deadline) {
  if (cleaned_root_ != stream_root_) {  // a new epoch (rank 0 restarted): nothing cleaned yet
    cleaned_root_ = stream_root_;
    cleaned_below_ = 0;
  }
  // Every rank is in `generation` (it formed, or a round on it completed): no one reads the
  // keys of earlier ones any more. (Kept until now so that every rank of a failed formation or
  // round could name the ranks at fault.)
  for (int64_t n = 0; n < at_most && cleaned_below_ < generation; ++n) {
    if (!group_.store_->DeletePrefix(keys::Formation(stream_root_, cleaned_below_), deadline)
             .ok()) {
      return;  // the next call resumes here
    }
    ++cleaned_below_;
  }
}

std::optional<std::string> StreamGroup::MissingRanks(
    CleanupCalls& cleanup, const std::function<std::string(int64_t)>& key) {
  std::vector<int64_t> missing;
  int64_t unnamed = 0;
  for (int64_t rank = 0; rank < group_.options_.world_size; ++rank) {
    absl::StatusOr<std::optional<std::string>> value = cleanup.TryGet(key(rank));
    if (!value.ok()) return std::nullopt;  // a store error says nothing about the rank
    if (value->has_value()) continue;
    if (missing.size() < kNamedRanks) {
      missing.push_back(rank);
    } else {
      ++unnamed;
    }
  }
  std::string text = absl::StrCat("[", absl::StrJoin(missing, ", "));
  if (unnamed > 0) absl::StrAppend(&text, ", and ", unnamed, " more");
  return absl::StrCat(text, "]");
}

absl::Status StreamGroup::PutResult(int64_t round, absl::string_view result) {
  if (group_.local()) return absl::OkStatus();
  KeyValueStore& store = *group_.store_;
  const absl::Time deadline = Deadline();
  ASSIGN_OR_RETURN(const std::string epoch, group_.Epoch(deadline));
  const std::string root =
      keys::StreamRoot(keys::EpochRoot(group_.options_.key_root, epoch), stream_);
  RETURN_IF_ERROR(store.Set(keys::Result(root, round), result, deadline));
  written_results_.push_back(round);
  while (static_cast<int64_t>(written_results_.size()) > group_.options_.kept_results) {
    RETURN_IF_ERROR(
        store.DeletePrefix(keys::Result(root, written_results_.front()), deadline).status());
    written_results_.pop_front();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> StreamGroup::GetResult(int64_t round) {
  if (group_.local()) return std::nullopt;
  const absl::Time deadline = Deadline();
  ASSIGN_OR_RETURN(const std::string epoch, group_.Epoch(deadline));
  const std::string root =
      keys::StreamRoot(keys::EpochRoot(group_.options_.key_root, epoch), stream_);
  return group_.store_->TryGet(keys::Result(root, round), deadline);
}

}  // namespace packsched::collective
