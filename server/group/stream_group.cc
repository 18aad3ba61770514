#include "server/group/stream_group.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/status_macros.h"
#include "server/collective/backend.h"
#include "server/group/blame.h"
#include "server/group/group_keys.h"

namespace packsched::group {
namespace {

// A rank publishes its arrival in a round only when the round is still running this long after
// it began (or a quarter of the collective timeout, if shorter): see arrival.h.
constexpr absl::Duration kArrivalDelay = absl::Milliseconds(100);
// The store calls that record the end of a formation that was aborted (Abort()) end by then.
constexpr absl::Duration kAbortedCleanup = absl::Milliseconds(250);
// The store calls that explain and end a failed round or formation end by its deadline plus this.
constexpr absl::Duration kCleanupMargin = absl::Milliseconds(750);
// Rank 0 deletes the keys of ended generations (all of them, from the lowest not yet deleted,
// generations.cc): at most this many when it forms a generation, and this many after each round
// it completes, so that the backlog of a long outage (a generation per failed round) drains in a
// few calls each.
constexpr int64_t kGenerationsCleanedPerFormation = 64;
constexpr int64_t kGenerationsCleanedPerRound = 8;

// Forwards to a collective and remembers whether any call failed, so a round that fails on its
// records (the generation is fine) is told apart from one whose collective failed.
class FailureTracking final : public collective::Collective {
 public:
  explicit FailureTracking(collective::Collective& inner) : inner_(inner) {}
  bool failed() const { return failed_; }

  int64_t rank() const override { return inner_.rank(); }
  int64_t world_size() const override { return inner_.world_size(); }
  absl::string_view backend() const override { return inner_.backend(); }
  absl::Status AllReduce(absl::Span<int64_t> values, absl::Span<const collective::ReduceOp> ops,
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

  collective::Collective& inner_;
  bool failed_ = false;
};

}  // namespace

StreamGroup::StreamGroup(Group& group, std::string stream)
    : group_(group), stream_(std::move(stream)) {}

StreamGroup::~StreamGroup() {
  SetFailed(false);  // a stream that is gone is not between generations
  std::shared_ptr<collective::Collective> last;
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
  collective::KeyValueStore& store = *group_.store_;

  // Formed: used as it is, with no store call. If its generation has ended meanwhile (a round
  // this rank sat out failed, or a peer restarted), its first call fails at once on connections
  // the peers have closed, and Agree moves to the next generation (StaleGeneration).
  std::shared_ptr<collective::Cancellation> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (collective_ != nullptr) return absl::OkStatus();  // after Abort(), its calls fail
    if (aborted_) return AbortedAtShutdown();
    forming_ = cancel = std::make_shared<collective::Cancellation>();  // for Abort()
  }
  const absl::Time form_start = absl::Now();
  absl::Cleanup formed_or_not = [this] {
    absl::MutexLock lock(&mu_);
    forming_.reset();
  };

  ASSIGN_OR_RETURN(const std::string epoch, group_.Epoch(deadline));
  const std::string epoch_root = keys::EpochRoot(options.key_root, epoch);
  epoch_root_ = epoch_root;
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

  absl::StatusOr<std::unique_ptr<collective::Collective>> formed = [&]() {
    absl::StatusOr<collective::Backend> backend = group_.ResolveBackend(epoch_root, deadline);
    if (!backend.ok())
      return absl::StatusOr<std::unique_ptr<collective::Collective>>(backend.status());
    if (options.form_collective) {
      return options.form_collective(store, formation, options.rank, options.world_size, deadline);
    }
    collective::GlooOptions gloo = options.gloo;
    gloo.wait_timeout = options.collective_timeout;  // every round's deadline is within it
    return collective::FormCollective(*backend, store, formation, options.rank, options.world_size,
                                      gloo, options.nccl, deadline, cancel.get());
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
    std::vector<int64_t> missing_ranks;
    if (absl::IsDeadlineExceeded(status) || absl::IsAborted(status) ||
        absl::IsUnavailable(status)) {
      missing = MissingRanks(
          cleanup, options.world_size, [&](int64_t rank) { return keys::Joined(formation, rank); },
          &missing_ranks);
    }
    const std::string what = absl::StrCat("stream '", stream_, "': generation ", generation);
    // A peer whose own transport could not come up said why; this rank's own failure is told
    // to the peers the same way.
    std::optional<std::string> not_ready;
    if (IsOwnFormationFailure(status)) {
      PublishNotReady(cleanup, epoch_root, formation, options.rank, status);
      published_not_ready_ = true;
    } else if (cleanup.unreachable().ok()) {
      // Ranks that did not come may have failed an earlier generation on their own side (and
      // ended it, so the others came to this one without them).
      not_ready = NotReadyReason(cleanup, epoch_root, formation, options.rank);
      if (!not_ready.has_value() && !missing_ranks.empty()) {
        not_ready = NotReadyReasons(cleanup, epoch_root, missing_ranks);
      }
    }
    if (missing.has_value() && *missing != "[]") {
      status = absl::DeadlineExceededError(absl::StrCat(
          what, " did not form within ", absl::FormatDuration(options.collective_timeout),
          ": ranks ", *missing, " did not join", not_ready.has_value() ? "; " : "",
          not_ready.value_or(""), " (", status.message(), ")"));
    } else if (not_ready.has_value()) {
      status = absl::Status(status.code(), absl::StrCat(what, " did not form: ", *not_ready, " (",
                                                        status.message(), ")"));
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
  if (published_not_ready_) {
    ClearNotReady(store, epoch_root, options.rank, deadline);
    published_not_ready_ = false;
  }
  if (options.rank == 0)
    CleanEndedGenerations(generation, kGenerationsCleanedPerFormation, deadline);
  {
    absl::MutexLock lock(&mu_);
    collective_ = std::shared_ptr<collective::Collective>(std::move(formed).value());
    if (cancel->cancelled()) collective_->Abort();  // aborted just as formation completed
    info_.formed = true;
    info_.backend = std::string(collective_->backend());
    info_.generation = generation;
    info_.epoch = epoch;
    ++info_.formations;
    info_.last_formation = absl::Now() - form_start;
  }
  // Forming needs every rank: the run is complete, whatever AwaitMembers has seen. (After rank 0
  // restarts, the survivors, long ready, never publish their membership under its new epoch.)
  group_.MarkReady();
  SetFailed(false);
  return absl::OkStatus();
}

absl::StatusOr<AgreedRound> StreamGroup::Agree(const RoundRecord& record) {
  return Agree(record, Deadline());
}

absl::StatusOr<AgreedRound> StreamGroup::Agree(const RoundRecord& record, absl::Time deadline) {
  absl::StatusOr<AgreedRound> agreed = AgreeOnce(record, deadline, /*first=*/true);
  if (agreed.ok() || !absl::IsAborted(agreed.status())) return agreed;
  if (!stale_) return agreed;
  // The collective belonged to a generation that had already ended before this round: run the
  // round on the next one (the peers form it at their next call), within the same deadline.
  return AgreeOnce(record, deadline, /*first=*/false);
}

absl::StatusOr<AgreedRound> StreamGroup::AgreeOnce(const RoundRecord& record, absl::Time deadline,
                                                   bool first) {
  const GroupOptions& options = group_.options_;
  stale_ = false;
  absl::Status formed = FormIfNeeded(deadline);
  if (!formed.ok()) {
    if (absl::IsDeadlineExceeded(formed) && !stream_root_.empty()) {
      // Peers that finished this round (a link to this rank failed mid-round, or this rank
      // restarted) do not come to form a generation for it: they are not missing.
      CleanupCalls cleanup(*group_.store_, absl::Now() + kCleanupMargin);
      absl::StatusOr<std::optional<std::string>> finished =
          cleanup.TryGet(keys::Result(stream_root_, record.round));
      if (finished.ok() && finished->has_value()) {
        formed = absl::DeadlineExceededError(
            absl::StrCat("stream '", stream_, "' round ", record.round,
                         ": its peers finished it, so they did not come to form a generation "
                         "for it within ",
                         absl::FormatDuration(group_.options_.collective_timeout),
                         " (no rank is missing): send it again, and this rank takes the plan "
                         "they agreed"));
      }
    }
    SetFailure(formed);
    return formed;
  }
  std::shared_ptr<collective::Collective> collective;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    collective = collective_;
    generation = info_.generation;
  }
  collective::KeyValueStore& store = *group_.store_;
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
  // Ranks that finished the round (a link to this rank failed mid-round) neither arrive again nor
  // keep an arrival key: the agreed result they wrote tells them from ranks that never came.
  absl::StatusOr<std::optional<std::string>> finished(std::nullopt);
  if (absl::IsDeadlineExceeded(status) && !recorded) {
    finished = cleanup.TryGet(keys::Result(stream_root_, record.round));
  }
  if (absl::IsDeadlineExceeded(status) && !recorded && finished.ok() && finished->has_value()) {
    status = absl::DeadlineExceededError(absl::StrCat(
        what, ": its peers finished it, but this rank's collective did not complete within ",
        absl::FormatDuration(options.collective_timeout),
        " (a link to this rank failed mid-round; no rank is missing): send it again, and this "
        "rank takes the plan they agreed (",
        status.message(), ")"));
  } else if (absl::IsDeadlineExceeded(status) && !recorded) {
    std::vector<int64_t> missing_ranks;
    const std::optional<std::string> missing = MissingRanks(
        cleanup, options.world_size,
        [&](int64_t rank) { return keys::Arrival(formation, record.round, rank); }, &missing_ranks);
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
      // A rank that did not come may be failing to form on its own side (after a restart).
      const std::optional<std::string> not_ready =
          NotReadyReasons(cleanup, epoch_root_, missing_ranks);
      status = absl::DeadlineExceededError(
          absl::StrCat(what, ": ranks ", *missing, " did not arrive within ",
                       absl::FormatDuration(options.collective_timeout),
                       not_ready.has_value() ? "; " : "", not_ready.value_or("")));
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

}  // namespace packsched::group
