#ifndef PACKSCHED_SERVER_SERVICE_COORDINATOR_H_
#define PACKSCHED_SERVER_SERVICE_COORDINATOR_H_

// The round coordinator: runs each stream's planning rounds, in order, on the stream's own
// worker thread, agreeing every round with the peer sidecars over the stream's collective
// (DESIGN.md §1). No gRPC or protobuf here: the service adapts it.
//
// Where a round runs: on the stream's worker thread, except that for a group of one whose
// collective never blocks (no `group`, the default LocalCollective or `collectives_never_block`)
// a round of at most `max_inline_sequences` sequences submitted while its stream has nothing
// queued or running may run at once on the submitting thread (up to `max_inline_rounds` at a
// time; off by default), saving the hand-off to the worker and back. Either way a stream runs
// one round at a time, and the rules below hold unchanged.
//
// Per (stream, round):
//  - the first call queues the round; calls with the same content while it is queued or running
//    join it (one computation); later calls are served from a bounded per-stream cache of
//    finished rounds (the TP/PP/CP callers of one DP rank);
//  - a call with different content for a (stream, round) that is in flight or cached gets
//    FailedPrecondition at once;
//  - rounds run lowest number first among those queued: any start value, gaps allowed, several
//    outstanding, and a round never waits for a lower number that has not arrived;
//  - failures are not cached: calling a failed round again runs it again.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/collective/collective.h"
#include "server/collective/group.h"
#include "server/service/limits.h"
#include "server/service/round_types.h"

namespace packsched::service {

class RoundCoordinator {
 public:
  // Makes a stream's collective (each stream has its own group context). Called on the stream's
  // worker thread (it may block, e.g. to form the group) before the stream's first round and
  // again after a round whose collective failed (the group must then be formed again); an
  // error fails the round that needed it.
  using CollectiveFactory =
      std::function<absl::StatusOr<std::unique_ptr<collective::Collective>>(absl::string_view)>;
  // Receives a round's outcome. Called exactly once per Submit, on the thread that ran the round
  // (the stream's worker, or the submitting thread of the round's first caller when it ran
  // inline), or on the submitting thread for immediate answers (cache hits, limits,
  // mismatches); may be called before Submit returns; must not block.
  using Done = absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<const RoundResult>>) &&>;

  struct Options {
    ServiceLimits limits;
    // The sidecar's rank group (--rank/--world_size/--rendezvous); not owned, must outlive the
    // coordinator. When set, each stream agrees through group->ForStream(name), which forms,
    // heals and re-forms the stream's collective itself; `make_collective` is then unused.
    collective::Group* group = nullptr;
    // Without `group`: makes each stream's collective. Default: a LocalCollective per stream
    // (a group of one).
    CollectiveFactory make_collective;
    // Without `group`: the collectives `make_collective` makes are groups of one that never
    // block, so rounds may run inline (see the top of this file). Implied when
    // `make_collective` is unset (LocalCollective).
    bool collectives_never_block = false;
    // Larger rounds always run on the stream's worker, so that a submitting thread (a gRPC
    // callback thread, of which there are few) is never held long: 4,096 sequences plan in a
    // few milliseconds.
    int64_t max_inline_sequences = 4096;
    // At most this many rounds run inline at once (over all streams); the others go to their
    // streams' workers. 0 (the default) never runs a round inline. Inline rounds save a thread
    // hand-off each (less CPU per plan, about one context switch per plan instead of four to
    // eight), but they run on gRPC's few callback threads (2 on a 2-core machine): under other
    // processes' load, load_bench's open-loop p99 was several times worse with every round
    // inline (and still worse with 1) than with a worker per stream (README).
    int64_t max_inline_rounds = 0;
    // Protocol/build version every rank of a round must share.
    int64_t version = kProtocolVersion;
  };

  struct StreamStats {
    std::string name;
    bool has_last_round = false;
    int64_t last_round = 0;  // latest round finished successfully
    int64_t rounds_completed = 0;
    int64_t rounds_failed = 0;
    int64_t outstanding = 0;  // queued or running
    int64_t cached = 0;
  };
  struct Stats {
    std::vector<StreamStats> streams;  // by name
    int64_t rounds = 0;                // rounds run, successful or not
    int64_t cache_hits = 0;
    int64_t joined_in_flight = 0;
    int64_t over_cap_parts = 0;
    int64_t world_size = 1;
    std::string backend;      // of the most recently formed stream collective ("local" before)
    bool group_ready = true;  // with a rank group: every stream's collective is formed
    int64_t generation = 0;   // with a rank group: the highest generation of its streams
  };

  explicit RoundCoordinator(Options options);
  // Shutdown(), then joins the workers.
  ~RoundCoordinator();

  RoundCoordinator(const RoundCoordinator&) = delete;
  RoundCoordinator& operator=(const RoundCoordinator&) = delete;

  // Submits one caller's round; `done` gets the shared result or the round's status:
  // ResourceExhausted when a new stream would exceed max_streams or a new round
  // max_outstanding_rounds; FailedPrecondition for different content in the same round;
  // Unavailable after Shutdown(); otherwise the round's own outcome (its validation error or a
  // peer's, a mismatch between ranks, DeadlineExceeded / Aborted from the collective).
  // Never blocks on another round; a round that runs inline (see the top of this file) is
  // computed before Submit returns. Thread-safe.
  void Submit(RoundInput input, Done done);

  // Stops accepting rounds, aborts every stream's collective, fails queued rounds with
  // Unavailable, lets running rounds end (inline ones included) and joins the workers. Logs a
  // summary per stream.
  // Idempotent, thread-safe.
  void Shutdown();

  Stats GetStats() const;

 private:
  struct Stream;
  struct Pending;

  void WorkerLoop(Stream* stream);
  // Runs `round` of `stream`, which the caller marked running, then caches it, answers its
  // waiters and lets the worker pick the next queued round.
  void RunAndAnswer(Stream* stream, int64_t round, const RoundInput* input);
  absl::StatusOr<std::shared_ptr<const RoundResult>> RunRound(Stream& stream,
                                                              const RoundInput& input);

  const Options options_;
  // A group of one whose collective never blocks: rounds may run on the submitting thread.
  const bool inline_rounds_;
  std::atomic<int64_t> inline_running_{0};  // rounds running inline now
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Stream>, std::less<>> streams_ ABSL_GUARDED_BY(mu_);
  int64_t world_size_ ABSL_GUARDED_BY(mu_) = 1;
  std::string backend_ ABSL_GUARDED_BY(mu_) = "local";

  mutable absl::Mutex counters_mu_;
  int64_t rounds_ ABSL_GUARDED_BY(counters_mu_) = 0;
  int64_t cache_hits_ ABSL_GUARDED_BY(counters_mu_) = 0;
  int64_t joined_ ABSL_GUARDED_BY(counters_mu_) = 0;
  int64_t over_cap_parts_ ABSL_GUARDED_BY(counters_mu_) = 0;
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_COORDINATOR_H_
