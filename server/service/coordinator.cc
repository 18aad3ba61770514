#include "server/service/coordinator.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/thread_name.h"
#include "server/group/round_record.h"
#include "server/planner/planner.h"
#include "server/service/round_metrics.h"
#include "server/service/round_problem.h"
#include "spdlog/spdlog.h"

namespace packsched::service {

using Result = absl::StatusOr<std::shared_ptr<const RoundResult>>;

// A round queued or running, with every caller waiting for it.
struct RoundCoordinator::Pending {
  RoundInput input;
  std::vector<Done> waiters;
  bool running = false;
};

struct RoundCoordinator::Stream {
  Stream(std::string n, std::optional<int64_t> released)
      : name(std::move(n)), released_before(released) {}

  const std::string name;
  // The highest round served or let go by an earlier incarnation of the stream (its tombstone).
  const std::optional<int64_t> released_before;
  // Set under the coordinator's mu_ when the stream is created; moved out under it by Reclaim.
  std::thread worker;
  // Made by the worker before the stream's first round (under `mu`, read by GetStats and
  // Shutdown there); used by the worker, except Abort() and info() (thread-safe by contract).
  std::unique_ptr<group::RoundAgreement> agreement;

  absl::Mutex mu;
  absl::CondVar work;  // a round was queued, or the stream is stopping
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Reclaimed (set under the coordinator's mu_ too): no longer in streams_; a caller that found
  // it before looks its name up again.
  bool reclaimed ABSL_GUARDED_BY(mu) = false;
  // The last call, or the end of the last round: the idle timeout counts from here.
  absl::Time last_activity ABSL_GUARDED_BY(mu) = absl::Now();
  // Made, and the call that made it has not reached it yet: not idle, whatever the time.
  bool made_for_a_call ABSL_GUARDED_BY(mu) = true;
  std::map<int64_t, Pending> in_flight ABSL_GUARDED_BY(mu);  // queued and running, by round
  bool has_last_round ABSL_GUARDED_BY(mu) = false;
  int64_t last_round ABSL_GUARDED_BY(mu) = 0;
  int64_t rounds_completed ABSL_GUARDED_BY(mu) = 0;
  int64_t rounds_failed ABSL_GUARDED_BY(mu) = 0;
  absl::Duration last_duration ABSL_GUARDED_BY(mu);
};

namespace {

// Appended to the refusals a trainer resumed from a checkpoint meets when it replays its rounds
// against sidecars that served them (docs/operating.md#restarts).
constexpr absl::string_view kRestartHint =
    ". If a trainer restarted from a checkpoint and replays this round with other data (or after "
    "the round left the cache), the round cannot be run again: start a new epoch of the stream, "
    "a new stream name that every rank uses (e.g. the stream with the trainer's restart count "
    "appended, as in 'actor_update@1'), or restart the sidecars";

// A round at or below the tombstone of a stream that was reclaimed while idle.
absl::Status ReclaimedRound(absl::string_view stream, int64_t round, int64_t released,
                            const ServiceLimits& limits) {
  return absl::FailedPreconditionError(absl::StrCat(
      "stream '", stream, "' round ", round, round == released ? " was" : " is at or below round ",
      round == released ? "" : absl::StrCat(released, ", which was"),
      " already served before the stream was reclaimed (idle for --stream_idle_timeout = ",
      absl::FormatDuration(limits.stream_idle_timeout),
      "): a served round is not run again (its peers would not join it); every caller of a "
      "round must arrive while it is cached",
      kRestartHint));
}

absl::Status ContentMismatch(absl::string_view stream, int64_t round, absl::string_view where) {
  return absl::FailedPreconditionError(
      absl::StrCat("stream '", stream, "' round ", round, " is ", where,
                   " with different content (lengths, loss tokens or options): every caller of "
                   "a round must send the same request",
                   kRestartHint));
}

// A round that is neither cached nor in flight, at or below the highest round the cache has let
// go: it may have been served already (running it again would enter the collective without the
// peers, who finished it), so it is refused instead.
absl::Status ReleasedRound(absl::string_view stream, int64_t round, int64_t released,
                           const ServiceLimits& limits) {
  const std::string bounds = absl::StrCat("--max_cached_rounds = ", limits.max_cached_rounds,
                                          ", --max_cached_bytes = ", limits.max_cached_bytes);
  if (round == released) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stream '", stream, "' round ", round,
        " was already served and has been evicted from the result cache (", bounds,
        "): a served round is not run again (its peers would not join it); every caller of a "
        "round must arrive while it is cached",
        kRestartHint));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "stream '", stream, "' round ", round, " is not cached and is below round ", released,
      ", which was already served and has been evicted from the result cache (", bounds,
      "): a round this old is not run (it may have been served already, and its peers would not "
      "join it again); every caller of a round must arrive while it is cached",
      kRestartHint));
}

// A round whose ranks brought different round numbers fails on every rank with the same
// message (group/round.h), which names the first rank's round — on the other ranks, a
// number that is not theirs. Say which round failed here, and the usual cause.
absl::Status WithRoundContext(absl::Status status, absl::string_view stream, int64_t round) {
  if (!group::IsRoundNumberMismatch(status)) return status;
  return absl::FailedPreconditionError(absl::StrCat(
      "stream '", stream, "' round ", round, " (this sidecar's) failed: ", status.message(),
      ". Outstanding rounds of a stream must reach every sidecar in increasing order: a "
      "sidecar runs the lowest round it holds without waiting for a lower one, so rounds that "
      "reach two sidecars in different orders meet different rounds and fail on both"));
}

}  // namespace

RoundCoordinator::RoundCoordinator(Options options)
    : options_(std::move(options)),
      cache_(options_.limits.max_cached_rounds, options_.limits.max_cached_bytes) {}

RoundCoordinator::~RoundCoordinator() { Shutdown(); }

void RoundCoordinator::Submit(RoundInput input, Done done) {
  Result immediate;
  while (true) {
    std::shared_ptr<Stream> stream;
    absl::Status refused;  // answered outside the lock: `done` may do anything
    {
      absl::MutexLock lock(&mu_);
      auto it = streams_.find(input.stream);
      if (shut_down_) {
        refused = absl::UnavailableError("the scheduler is shutting down");
      } else if (it == streams_.end() && !input.error.ok()) {
        // Only a valid request creates a stream: an invalid one gets its own error, and leaves
        // no slot and no thread behind (its peers, if any, time out naming this rank).
        refused = input.error;
      } else if (it == streams_.end() &&
                 static_cast<int64_t>(streams_.size()) >= options_.limits.max_streams) {
        refused = absl::ResourceExhaustedError(
            absl::StrCat("stream '", input.stream, "' would be stream ", streams_.size() + 1,
                         ": the server limit --max_streams is ", options_.limits.max_streams));
      } else if (it == streams_.end()) {
        std::optional<int64_t> released;
        if (auto t = tombstones_.find(input.stream); t != tombstones_.end()) {
          released = t->second.round;
          if (input.round <= *released) {
            // Refused by the stream's tombstone without making the stream again.
            refused = ReclaimedRound(input.stream, input.round, *released, options_.limits);
          } else {
            tombstone_order_.erase(t->second.age);
            tombstones_.erase(t);
          }
        }
        if (refused.ok()) {
          auto created = std::make_shared<Stream>(input.stream, released);
          it = streams_.emplace(input.stream, created).first;
          created->worker = std::thread([this, created] { WorkerLoop(created.get()); });
        }
      }
      if (refused.ok()) stream = it->second;
    }
    if (!refused.ok()) {
      std::move(done)(refused);
      return;
    }

    absl::MutexLock lock(&stream->mu);
    if (stream->reclaimed) continue;  // reclaimed since it was looked up: look again
    stream->last_activity = absl::Now();
    if (stream->made_for_a_call) {
      stream->made_for_a_call = false;
      stream->work.Signal();  // its idle timeout starts now
    }
    const int64_t round = input.round;
    if (std::optional<ResultCache::Entry> cached = cache_.Find(stream->name, round)) {
      if (cached->content_hash == input.content_hash) {
        immediate = std::move(cached->result);
        absl::MutexLock counters(&counters_mu_);
        ++cache_hits_;
      } else {
        immediate = ContentMismatch(stream->name, round, "already finished");
      }
    } else if (stream->stopping) {
      // Before the in-flight check: Shutdown() has already answered the callers of the rounds
      // in flight, and a caller joining one now would wait for a round no longer reported.
      immediate = absl::UnavailableError("the scheduler is shutting down");
    } else if (auto pending = stream->in_flight.find(round); pending != stream->in_flight.end()) {
      if (pending->second.input.content_hash == input.content_hash) {
        pending->second.waiters.push_back(std::move(done));
        absl::MutexLock counters(&counters_mu_);
        ++joined_;
        return;
      }
      immediate = ContentMismatch(stream->name, round, "in flight");
    } else if (const std::optional<int64_t> released = cache_.HighestReleased(stream->name);
               released && round <= *released &&
               !(stream->released_before && *stream->released_before >= *released)) {
      immediate = ReleasedRound(stream->name, round, *released, options_.limits);
    } else if (stream->released_before && round <= *stream->released_before) {
      immediate = ReclaimedRound(stream->name, round, *stream->released_before, options_.limits);
    } else if (static_cast<int64_t>(stream->in_flight.size()) >=
               options_.limits.max_outstanding_rounds) {
      immediate = absl::ResourceExhaustedError(
          absl::StrCat("stream '", stream->name, "' has ", stream->in_flight.size(),
                       " rounds outstanding: the server limit --max_outstanding_rounds is ",
                       options_.limits.max_outstanding_rounds));
    } else {
      Pending& pending = stream->in_flight[round];
      pending.input = std::move(input);
      pending.waiters.push_back(std::move(done));
      stream->work.Signal();
      return;
    }
    break;
  }
  std::move(done)(std::move(immediate));
}

void RoundCoordinator::WorkerLoop(Stream* stream) {
  NameThisThread("psched-stream");
  const absl::Duration idle_timeout = options_.limits.stream_idle_timeout;
  bool reclaimed = false;
  std::thread predecessor;  // the reclaimed worker before this one, joined before this one ends
  while (true) {
    RoundInput* input = nullptr;
    int64_t round = 0;
    bool idle = false;
    {
      absl::MutexLock lock(&stream->mu);
      // Lowest queued round first; one round at a time per stream.
      while (!stream->stopping && stream->in_flight.empty()) {
        if (idle_timeout <= absl::ZeroDuration() || stream->made_for_a_call) {
          stream->work.Wait(&stream->mu);
          continue;
        }
        const absl::Time idle_at = stream->last_activity + idle_timeout;
        if (absl::Now() >= idle_at) {
          idle = true;
          break;
        }
        stream->work.WaitWithDeadline(&stream->mu, idle_at);
      }
      if (stream->stopping) break;
    }
    if (idle) {
      // Under the coordinator's lock, which this thread must take before the stream's.
      if (Reclaim(*stream, predecessor)) {
        reclaimed = true;
        break;
      }
      continue;  // a call came meanwhile
    }
    {
      absl::MutexLock lock(&stream->mu);
      auto it = stream->in_flight.begin();
      it->second.running = true;
      round = it->first;
      input = &it->second.input;  // stable: std::map nodes do not move, and only we erase
    }

    const absl::Time start = absl::Now();
    Result result = RunRound(*stream, *input);
    const absl::Duration took = absl::Now() - start;
    if (options_.metrics != nullptr) {
      options_.metrics->Round(
          RoundSampleOf(stream->name, round, result, took, stream->agreement.get()));
    }

    std::vector<Done> waiters;
    {
      absl::MutexLock lock(&stream->mu);
      auto it = stream->in_flight.find(round);
      waiters = std::move(it->second.waiters);
      const uint64_t content_hash = it->second.input.content_hash;
      stream->in_flight.erase(it);
      stream->last_activity = absl::Now();
      stream->last_duration = took;
      if (result.ok()) {
        ++stream->rounds_completed;
        if (!stream->has_last_round || round > stream->last_round) stream->last_round = round;
        stream->has_last_round = true;
        // Under the stream's lock, so a caller never sees the round neither in flight nor kept.
        const int64_t bytes = EstimatedBytes(**result);
        if (!cache_.Insert(stream->name, round, content_hash, *result, bytes) &&
            options_.limits.max_cached_rounds > 0) {
          spdlog::debug(
              "stream {} round {}: served but not cached: its result (about {} bytes) is larger "
              "than --max_cached_bytes = {}; a later caller of it gets FAILED_PRECONDITION",
              stream->name, round, bytes, options_.limits.max_cached_bytes);
        }
      } else {
        ++stream->rounds_failed;
      }
    }
    if (result.ok()) {
      spdlog::debug("stream {} round {}: k={} local_k={} sequences={} world_size={} in {} us",
                    stream->name, round, (*result)->num_micro_batches, (*result)->local_k,
                    (*result)->plan.stats.num_sequences, (*result)->global.world_size,
                    absl::ToInt64Microseconds(took));
    } else {
      spdlog::debug("stream {} round {} failed in {} us: {}", stream->name, round,
                    absl::ToInt64Microseconds(took), result.status().ToString());
    }
    for (Done& done : waiters) std::move(done)(result);
  }

  if (reclaimed) {
    // Off every lock: the agreement closes the stream's collective (its connections to the
    // peers; a rank group's StreamGroup also leaves the group's count of failed streams).
    std::unique_ptr<group::RoundAgreement> agreement;
    {
      absl::MutexLock lock(&stream->mu);
      agreement = std::move(stream->agreement);
    }
    agreement.reset();
    if (predecessor.joinable()) predecessor.join();
    return;
  }

  // Stopping: fail what is still queued.
  std::map<int64_t, Pending> left;
  {
    absl::MutexLock lock(&stream->mu);
    left.swap(stream->in_flight);
  }
  for (auto& [round, pending] : left) {
    for (Done& done : pending.waiters) {
      std::move(done)(
          absl::UnavailableError(absl::StrCat("the scheduler is shutting down: stream '",
                                              stream->name, "' round ", round, " did not run")));
    }
  }
}

bool RoundCoordinator::Reclaim(Stream& stream, std::thread& predecessor) {
  absl::MutexLock lock(&mu_);
  absl::MutexLock stream_lock(&stream.mu);
  if (shut_down_) {
    // Shutdown() is about to stop every stream it listed, this one included: stop waiting.
    stream.stopping = true;
    return false;
  }
  if (stream.stopping || !stream.in_flight.empty() || stream.made_for_a_call ||
      absl::Now() < stream.last_activity + options_.limits.stream_idle_timeout) {
    return false;
  }
  stream.reclaimed = true;
  std::optional<int64_t> released = cache_.Forget(stream.name);
  if (stream.released_before && (!released || *stream.released_before > *released)) {
    released = stream.released_before;
  }
  if (released) {
    // No tombstone of this name exists: a new stream takes its tombstone back.
    tombstone_order_.push_back(stream.name);
    tombstones_.emplace(stream.name, Tombstone{*released, std::prev(tombstone_order_.end())});
    while (static_cast<int64_t>(tombstones_.size()) > kMaxTombstones) {
      tombstones_.erase(tombstone_order_.front());
      tombstone_order_.pop_front();
    }
  }
  streams_.erase(stream.name);  // the worker's own reference keeps `stream` alive
  if (options_.metrics != nullptr) options_.metrics->StreamRemoved(stream.name);
  ++streams_reclaimed_;
  predecessor = std::move(last_reclaimed_worker_);
  last_reclaimed_worker_ = std::move(stream.worker);
  spdlog::info("stream {}: reclaimed after {} idle: {} rounds completed, {} failed, last round {}",
               stream.name, absl::FormatDuration(options_.limits.stream_idle_timeout),
               stream.rounds_completed, stream.rounds_failed,
               stream.has_last_round ? absl::StrCat(stream.last_round) : "none");
  return true;
}

Result RoundCoordinator::RunRound(Stream& stream, const RoundInput& in) {
  auto result = std::make_shared<RoundResult>();
  const absl::Time start = absl::Now();
  {
    absl::MutexLock counters(&counters_mu_);
    ++rounds_;
  }

  group::RoundRecord record;
  record.stream = stream.name;
  record.round = in.round;
  record.options_hash = in.options_hash;
  record.version = options_.version;
  record.error = in.error;

  // The local half — the bound and the counts, no plan yet (the plan waits for the agreed k):
  // its errors do not return early, they join the round.
  // Over the sequences, or over a forest's pieces (tree packing).
  std::optional<RoundProblem> problem;
  const PlanInput& input = in.input;
  if (record.error.ok() && in.agree_only) {
    record.local_k = 1;
  } else if (record.error.ok()) {
    absl::StatusOr<RoundProblem> created = RoundProblem::Create(input);
    if (created.ok()) {
      problem = *std::move(created);
    } else {
      record.error = created.status();
    }
  }
  planner::LossCounts local_counts;
  if (record.error.ok() && input.loss_tokens) {
    absl::StatusOr<planner::LossCounts> counts = problem->CountLoss(*input.loss_tokens);
    if (counts.ok()) {
      local_counts = *counts;
    } else {
      record.error = counts.status();
    }
  }
  if (record.error.ok() && problem) {
    record.local_k = problem->local_k();
    record.num_sequences = problem->num_kept();
    record.loss_tokens = local_counts.loss_tokens;
    record.sequences_with_loss = local_counts.sequences_with_loss;
  }
  const absl::Time local_done = absl::Now();

  // Agree with the peers (or a group of one); the rank group forms the stream's collective
  // first if needed, and may answer a round its peers finished before this sidecar restarted.
  if (stream.agreement == nullptr) {
    std::unique_ptr<group::RoundAgreement> created = options_.agreements->ForStream(stream.name);
    absl::MutexLock lock(&stream.mu);
    if (stream.stopping) created->Abort();
    stream.agreement = std::move(created);
  }
  const absl::StatusOr<group::AgreedRound> agreed = stream.agreement->Agree(record);
  const absl::Time agreed_at = absl::Now();
  if (!agreed.ok()) return WithRoundContext(agreed.status(), stream.name, in.round);
  const int64_t world_size = agreed->world_size;
  if (in.agree_only) {
    result->num_micro_batches = agreed->k;
    result->local_k = record.local_k;
    result->global.world_size = world_size;
    result->local_time = local_done - start;
    result->wait_time = agreed_at - local_done;
    return std::shared_ptr<const RoundResult>(std::move(result));
  }

  // Every rank now holds the same agreed values and the same options, so what follows either
  // fails identically everywhere or cannot fail.
  const planner::PlanOptions& o = input.options;
  int64_t k = input.same_micro_num_in_dp ? agreed->k : problem->local_k();
  const std::optional<int64_t> rounded = CheckedRoundUp(k, o.divisible_by);
  if (!rounded || *rounded > o.max_micro_batches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the agreed micro-batch count ", k, " rounded up to divisible_by = ", o.divisible_by,
        " exceeds max_micro_batches = ", o.max_micro_batches, " (stream '", stream.name, "' round ",
        in.round, ")"));
  }
  k = *rounded;
  // The loss weights read the plan over sequences, or over rollouts for a forest.
  planner::MicroBatchPlan rollouts;
  absl::StatusOr<const planner::MicroBatchPlan*> weighed =
      problem->Partition(k, result.get(), &rollouts);
  if (!weighed.ok()) return weighed.status();
  if (input.loss_tokens) {
    absl::StatusOr<planner::LossWeights> weights = planner::ComputeLossWeights(
        **weighed, *input.loss_tokens, input.loss,
        planner::LossCounts{agreed->loss_tokens, agreed->sequences_with_loss}, world_size);
    if (!weights.ok()) {
      return absl::InternalError(
          absl::StrCat("loss weights failed after agreement: ", weights.status().ToString()));
    }
    result->loss = *std::move(weights);
  }
  result->num_micro_batches = k;
  result->local_k = problem->local_k();
  result->global = {agreed->num_sequences, agreed->loss_tokens, agreed->sequences_with_loss,
                    world_size};
  result->max_token_len = o.max_token_len;
  result->local_time = local_done - start;
  result->wait_time = agreed_at - local_done;
  result->partition_time = absl::Now() - agreed_at;
  // Over the cap, a part isolating one overlong sequence cannot be helped; any other can.
  int64_t isolated = 0;
  if (result->plan.stats.over_cap_parts > 0) {
    for (const planner::MicroBatch& part : result->plan.parts) isolated += part.overlong ? 1 : 0;
  }
  {
    absl::MutexLock counters(&counters_mu_);
    over_cap_parts_ += result->plan.stats.over_cap_parts;
    over_cap_unavoidable_ += isolated;
  }
  return std::shared_ptr<const RoundResult>(std::move(result));
}

void RoundCoordinator::Shutdown() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [name, stream] : streams_) streams.push_back(stream);
  }
  // Every outstanding caller, answered below without any lock held (`done` may do anything).
  struct Abandoned {
    std::string stream;
    int64_t round;
    bool running;
    std::vector<Done> waiters;
  };
  std::vector<Abandoned> abandoned;
  for (const std::shared_ptr<Stream>& stream : streams) {
    absl::MutexLock lock(&stream->mu);
    stream->stopping = true;
    if (stream->agreement != nullptr) stream->agreement->Abort();
    for (auto& [round, pending] : stream->in_flight) {
      // The entry stays for its worker (which erases it); only the callers move out.
      abandoned.push_back({stream->name, round, pending.running, std::move(pending.waiters)});
      pending.waiters.clear();
    }
    stream->work.Signal();
  }
  if (options_.cancel_waits) options_.cancel_waits();
  for (Abandoned& a : abandoned) {
    const absl::Status status =
        a.running
            ? absl::AbortedError(absl::StrCat("the scheduler is shutting down: stream '", a.stream,
                                              "' round ", a.round, " was abandoned while it ran"))
            : absl::UnavailableError(absl::StrCat("the scheduler is shutting down: stream '",
                                                  a.stream, "' round ", a.round, " did not run"));
    for (Done& done : a.waiters) std::move(done)(status);
  }
  for (const std::shared_ptr<Stream>& stream : streams) {
    if (stream->worker.joinable()) stream->worker.join();
  }
  {
    // The last reclaimed worker, which joins the one before it (no more are reclaimed now).
    std::thread reclaimed;
    {
      absl::MutexLock lock(&mu_);
      reclaimed = std::move(last_reclaimed_worker_);
    }
    if (reclaimed.joinable()) reclaimed.join();
  }
  for (const std::shared_ptr<Stream>& stream : streams) {
    absl::MutexLock lock(&stream->mu);
    spdlog::info("stream {}: {} rounds completed, {} failed, last round {}", stream->name,
                 stream->rounds_completed, stream->rounds_failed,
                 stream->has_last_round ? absl::StrCat(stream->last_round) : "none");
  }
}

RoundCoordinator::Stats RoundCoordinator::GetStats() const {
  Stats stats;
  stats.world_size = options_.agreements->world_size();
  // Every rank has joined, and no stream is between generations: the readiness the health
  // service reports too.
  stats.group_ready = options_.agreements->serving();
  stats.backend = options_.backend;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, stream] : streams_) {
      absl::MutexLock stream_lock(&stream->mu);
      StreamStats s;
      s.name = name;
      s.has_last_round = stream->has_last_round;
      s.last_round = stream->last_round;
      s.rounds_completed = stream->rounds_completed;
      s.rounds_failed = stream->rounds_failed;
      s.outstanding = static_cast<int64_t>(stream->in_flight.size());
      for (const auto& [round, pending] : stream->in_flight) s.running += pending.running ? 1 : 0;
      s.cached = cache_.Count(name);
      s.last_duration = stream->last_duration;
      stats.streams.push_back(std::move(s));
      const group::GroupInfo info =
          stream->agreement != nullptr ? stream->agreement->info() : group::GroupInfo{};
      stats.generation = std::max(stats.generation, info.generation);
      if (!info.backend.empty()) stats.backend = info.backend;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stats.streams_reclaimed = streams_reclaimed_;
    stats.tombstones = static_cast<int64_t>(tombstones_.size());
  }
  absl::MutexLock counters(&counters_mu_);
  stats.rounds = rounds_;
  stats.cache_hits = cache_hits_;
  stats.joined_in_flight = joined_;
  stats.over_cap_parts = over_cap_parts_;
  stats.over_cap_unavoidable_parts = over_cap_unavoidable_;
  stats.cached_bytes = cache_.bytes();
  return stats;
}

}  // namespace packsched::service
