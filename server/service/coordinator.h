#ifndef PACKSCHED_SERVER_SERVICE_COORDINATOR_H_
#define PACKSCHED_SERVER_SERVICE_COORDINATOR_H_

// The round coordinator: runs each stream's planning rounds, in order, on the stream's own
// worker thread, agreeing every round with the peer sidecars through the agreement port
// (server/group/round_agreement.h; docs/design.md §1). No gRPC or protobuf here: the service
// adapts it.
//
// Per (stream, round):
//  - the first call queues the round; calls with the same content while it is queued or running
//    join it (one computation); later calls are served from a bounded cache of finished rounds
//    (the TP/PP/CP callers of one DP rank; result_cache.h: a count per stream, bytes over all);
//  - a call with different content for a (stream, round) that is in flight or cached gets
//    FailedPrecondition at once;
//  - a finished round is never run again: a call for a round that is neither in flight nor
//    cached, at or below the highest round of its stream the cache has evicted, gets
//    FailedPrecondition (the round was served, and its peers would not join it again);
//  - rounds run lowest number first among those queued: any start value, gaps allowed, several
//    outstanding, and a round never waits for a lower number that has not arrived. Hence the
//    callers' rule: outstanding rounds of one stream must reach every sidecar in increasing
//    order. If rank 0 gets rounds 5 then 6 and rank 1 gets 6 then 5, rank 0 runs 5 while rank 1
//    runs 6 (5 has not arrived), then 6 against 5: both rounds fail on both ranks with
//    FailedPrecondition (each rank's error names its own round, the peers' and this rule);
//  - failures are not cached: calling a failed round again runs it again.
//
// Streams' lifecycle:
//  - a stream is created by the first VALID request for its name: a request whose validation
//    failed (RoundInput::error) for a stream that does not exist gets its own error at once and
//    creates nothing (no slot, no thread). For a stream that exists, it joins its round with the
//    error as before, so the peers fail with the same status;
//  - a stream with no round queued or running and no call for limits.stream_idle_timeout is
//    reclaimed by its own worker (which then exits, joined by the next reclaimed worker or by
//    Shutdown()): its slot, its cached results and its agreement (the stream's collective) go;
//  - a reclaimed stream leaves a tombstone, the highest round it served or let go, so that a
//    late caller of such a round (or a lower one) still gets FailedPrecondition rather than a
//    round its peers would not join. At most kMaxTombstones are kept, the oldest dropped first;
//    a stream created again takes its tombstone back;
//  - max_streams counts live streams only.

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/group/round_agreement.h"
#include "server/metrics/sink.h"
#include "server/service/limits.h"
#include "server/service/result_cache.h"
#include "server/service/round_types.h"

namespace packsched::service {

class RoundCoordinator {
 public:
  // Receives a round's outcome. Called exactly once per Submit, on the stream's worker thread,
  // or on the submitting thread for immediate answers (cache hits, limits, mismatches); must not
  // block.
  using Done = absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<const RoundResult>>) &&>;

  struct Options {
    ServiceLimits limits;
    // How each stream agrees its rounds with the peers (the agreement port). Required (not
    // null). The sidecar's composition root chooses it (server/sidecar/rank_group.h): the rank
    // group (GroupAgreements over the sidecar's Group: --rank/--world_size/--rendezvous) or a
    // group of one (CollectiveAgreements over a LocalCollective per stream); tests give
    // collectives of their own. What it refers to (a Group) must outlive the coordinator.
    std::shared_ptr<group::RoundAgreements> agreements;
    // Protocol/build version every rank of a round must share.
    int64_t version = kProtocolVersion;
    // Called once by Shutdown(), after the streams' agreements are aborted: must end every
    // blocking wait a stream worker may be in outside its collective — forming the group waits
    // on the rendezvous store (stream_group.h), up to --collective_timeout — so that the workers
    // exit promptly. The sidecar cancels the rendezvous store's calls
    // (server/sidecar/rank_group.h: AttachRankGroup). Optional; must not block.
    std::function<void()> cancel_waits;
    // Where each round run and each stream reclaimed are recorded (server/metrics/sink.h); not
    // owned, outlives the coordinator. Null: metrics off, nothing recorded.
    metrics::Sink* metrics = nullptr;
    // The backend as configured (ServerOptions::backend): Stats::backend until a stream has
    // formed its collective.
    std::string backend = "local";
  };

  struct StreamStats {
    std::string name;
    bool has_last_round = false;
    int64_t last_round = 0;  // latest round finished successfully
    int64_t rounds_completed = 0;
    int64_t rounds_failed = 0;
    int64_t outstanding = 0;  // queued or running
    int64_t running = 0;      // of those, running (0 or 1)
    int64_t cached = 0;
    absl::Duration last_duration;  // of the last round run, ok or not (0 before any)
  };
  // Tombstones of reclaimed streams kept (about 200 bytes each with a 128-byte name).
  static constexpr int64_t kMaxTombstones = 4096;

  struct Stats {
    std::vector<StreamStats> streams;  // live streams, by name
    int64_t streams_reclaimed = 0;     // idle streams reclaimed so far
    int64_t tombstones = 0;            // of reclaimed streams, kept (<= kMaxTombstones)
    int64_t rounds = 0;                // rounds run, successful or not
    int64_t cache_hits = 0;
    int64_t joined_in_flight = 0;
    int64_t over_cap_parts = 0;
    // Of over_cap_parts: parts isolating one overlong sequence; the rest held several.
    int64_t over_cap_unavoidable_parts = 0;
    int64_t cached_bytes = 0;  // estimated, every stream's cached results
    // From the agreement port (round_agreement.h).
    int64_t world_size = 1;   // RoundAgreements::world_size()
    std::string backend;      // of the last stream (by name) that has formed (Options::backend
                              // before)
    bool group_ready = true;  // RoundAgreements::serving()
    int64_t generation = 0;   // the highest generation of the streams (0 before any)
  };

  // REQUIRES: options.agreements is not null.
  explicit RoundCoordinator(Options options);
  // Shutdown(), then joins the workers.
  ~RoundCoordinator();

  RoundCoordinator(const RoundCoordinator&) = delete;
  RoundCoordinator& operator=(const RoundCoordinator&) = delete;

  // Submits one caller's round; `done` gets the shared result or the round's status:
  // the request's own validation error when its stream does not exist (nothing is created);
  // ResourceExhausted when a new stream would exceed max_streams or a new round
  // max_outstanding_rounds; FailedPrecondition for different content in the same round;
  // Unavailable after Shutdown(); otherwise the round's own outcome (its validation error or a
  // peer's, a mismatch between ranks, DeadlineExceeded / Aborted from the collective).
  // Never blocks on a round. Thread-safe.
  void Submit(RoundInput input, Done done);

  // Stops accepting rounds, aborts every stream's agreement, calls Options::cancel_waits, and
  // answers every outstanding caller at once: Aborted for a round that was running (its
  // collective or formation is being torn down), Unavailable for a queued round (it did not
  // run). Then joins the workers (a running round ends on its aborted collective; the answer
  // is not repeated). Logs a summary per stream. Idempotent, thread-safe; a second caller may
  // return before the first has joined the workers.
  //
  // The service answers these with its served marker, so clients take them as final, never as
  // "did not reach the sidecar": SchedulerServer calls Shutdown() shortly before its grace
  // period ends, before gRPC cancels the open calls itself (server.h).
  void Shutdown();

  Stats GetStats() const;

 private:
  struct Stream;
  struct Pending;

  void WorkerLoop(Stream* stream);
  // Called by an idle stream's worker: removes the stream (its slot, its cached results), leaves
  // its tombstone and hands its thread to last_reclaimed_worker_. Returns false, changing
  // nothing, when a call came meanwhile (or marks the stream stopping after Shutdown() began).
  // `predecessor` gets the previous reclaimed worker, for the caller to join.
  bool Reclaim(Stream& stream, std::thread& predecessor);
  absl::StatusOr<std::shared_ptr<const RoundResult>> RunRound(Stream& stream,
                                                              const RoundInput& input);

  const Options options_;
  // Thread-safe on its own; the worker inserts under the stream's lock (lock order: a stream's
  // mu, then the cache's).
  ResultCache cache_;
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Live streams. Shared with their worker, which keeps its stream alive after reclaiming it.
  std::map<std::string, std::shared_ptr<Stream>, std::less<>> streams_ ABSL_GUARDED_BY(mu_);
  // Reclaimed streams' highest released round, by name, and their names oldest first.
  struct Tombstone {
    int64_t round;
    std::list<std::string>::iterator age;
  };
  absl::flat_hash_map<std::string, Tombstone> tombstones_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> tombstone_order_ ABSL_GUARDED_BY(mu_);
  // The last reclaimed worker; each reclaimed worker joins the one before it before it ends, so
  // at most one is unjoined, and Shutdown() joins it.
  std::thread last_reclaimed_worker_ ABSL_GUARDED_BY(mu_);
  int64_t streams_reclaimed_ ABSL_GUARDED_BY(mu_) = 0;

  mutable absl::Mutex counters_mu_;
  int64_t rounds_ ABSL_GUARDED_BY(counters_mu_) = 0;
  int64_t cache_hits_ ABSL_GUARDED_BY(counters_mu_) = 0;
  int64_t joined_ ABSL_GUARDED_BY(counters_mu_) = 0;
  int64_t over_cap_parts_ ABSL_GUARDED_BY(counters_mu_) = 0;
  int64_t over_cap_unavoidable_ ABSL_GUARDED_BY(counters_mu_) = 0;  // of over_cap_parts_
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_COORDINATOR_H_
