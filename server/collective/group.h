#ifndef PACKSCHED_SERVER_COLLECTIVE_GROUP_H_
#define PACKSCHED_SERVER_COLLECTIVE_GROUP_H_

// The rank group's lifecycle (DESIGN.md §3), as the service uses it: one Group per sidecar
// process, one StreamGroup per stream (each with its own collective and called from that
// stream's worker thread).
//
// A StreamGroup forms its collective lazily, under the prefix (run epoch, generation) read from
// the rendezvous store. Any collective failure or timeout ends the generation (the generation
// counter in the store is bumped, once, by compare-and-set); every call first checks the
// store's generation and re-forms when it has moved, so survivors heal on their next call
// without a restart. Every wait is bounded by GroupOptions::collective_timeout (formation and
// round each), never by a caller's deadline.
//
// How the service uses it (one worker thread per stream):
//
//   ASSIGN_OR_RETURN(auto group, Group::Create(&store, options));   // at start-up
//   auto actor = group->ForStream("actor_update");                  // first Plan of a stream
//   ... on the stream's worker thread, per round:
//   if (auto done = actor->GetResult(round); done.ok() && done->has_value()) { recover; }
//   absl::StatusOr<AgreedRound> agreed = actor->Agree(record);    // identical on every rank
//   if (agreed.ok() && rank == 0) actor->PutResult(round, Serialize(*agreed));
//   ... GetStatus / readiness: actor->info(); shutdown: actor->Abort().

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/arrival.h"
#include "server/collective/backend.h"
#include "server/collective/cancellation.h"
#include "server/collective/collective.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/nccl_collective.h"
#include "server/collective/round.h"
#include "server/collective/store.h"

namespace packsched::collective {

struct GroupOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  Backend backend = Backend::kAuto;
  // Bound of every wait: forming a generation, and the collective of one round.
  absl::Duration collective_timeout = absl::Seconds(30);
  GlooOptions gloo;
  NcclOptions nccl;
  // Every key this group uses starts with this (several groups may share one store).
  std::string key_root = "packsched/";
  // (Keys of ended generations stay until the group forms again: at most 4W + 2 per failed
  // round per stream, see group_keys.h.)
  // Agreed round results kept in the store per stream (older ones are deleted by the writer).
  int64_t kept_results = 64;
  // Whether this rank can use NCCL for --backend=auto; unset: CanUseNccl(). (Tests set it.)
  std::optional<bool> can_use_nccl;
};

// What GetStatus reports for one stream.
struct GroupInfo {
  bool formed = false;
  std::string backend;      // "gloo", "nccl", "local"; empty before the first formation
  int64_t generation = -1;  // -1 before the first formation
  std::string epoch;
  absl::Status last_error;  // the last formation or collective failure (OK if none)
};

class StreamGroup;
class CleanupCalls;  // group.cc

class Group {
 public:
  // `store` is not owned and must outlive the group and its streams; it may be null only for a
  // group of one (then the local backend is used and nothing is stored). Rank 0 draws a random
  // run epoch here. Returns InvalidArgument for a bad rank, world size, timeout, or backend
  // (local with world_size > 1), or a Gloo algorithm other than kRecursiveDoubling (the others
  // are for comparison only: see GlooOptions::Algorithm).
  static absl::StatusOr<std::unique_ptr<Group>> Create(KeyValueStore* store, GroupOptions options);

  // The context of one stream. REQUIRES: the Group outlives it.
  std::unique_ptr<StreamGroup> ForStream(std::string stream);

  const GroupOptions& options() const { return options_; }

  // Readiness: whether every rank's sidecar has joined the run. Publishes this rank's
  // membership under the run epoch, then waits until `deadline`: rank 0 for every rank's
  // membership (then it marks the epoch complete), the others for that mark — O(W) store reads
  // on rank 0, O(1) on the others, no collective. Returns true once complete (ready() then
  // stays true), false when `deadline` comes first (call again: rank 0 resumes where it
  // stopped), or the store's error (e.g. Unavailable while rank 0 is not up yet). A group of
  // one is complete at once. The run is also complete (ready() turns true, and AwaitMembers
  // returns true) once any stream has formed, since forming needs every rank: what makes a rank 0
  // restarted under a new epoch ready, whose peers do not publish their membership again.
  // One caller at a time.
  absl::StatusOr<bool> AwaitMembers(absl::Time deadline);
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // Rank 0: how many ranks have joined so far (as far as AwaitMembers has seen); other ranks:
  // world_size once ready, else 0.
  int64_t members_seen() const { return members_seen_.load(std::memory_order_acquire); }

  // The readiness a sidecar reports, both as GetStatus.group_ready and through the health
  // service (packsched.v1.Scheduler): ready(), and no stream of this group is between
  // generations — none has had a formation or a round's collective fail (a peer died or timed
  // out: the generation ended) without forming again since. A stream forming for the first time
  // does not count. It turns true again when the failed streams have formed again, which they do
  // at their next call (Plan).
  bool serving() const { return ready() && failed_streams_.load(std::memory_order_acquire) == 0; }
  // Calls `listener(serving())` now, then whenever serving() changes: one call at a time, the last
  // one with the current value. Replaces any earlier listener; an empty one removes it. When this
  // returns, the earlier listener is neither running nor will it run. Thread-safe.
  void SetServingListener(std::function<void(bool)> listener);

 private:
  friend class StreamGroup;
  Group(KeyValueStore* store, GroupOptions options, std::string epoch);

  // The run epoch: rank 0 publishes its own; other ranks wait for it in the store.
  absl::StatusOr<std::string> Epoch(absl::Time deadline);
  // The backend to form under `epoch_root` (auto is agreed once per epoch and cached).
  absl::StatusOr<Backend> ResolveBackend(absl::string_view epoch_root, absl::Time deadline);
  bool local() const { return store_ == nullptr; }
  // Every rank has joined: ready() turns true (and stays so).
  void MarkReady();
  // A stream's collective failed (+1) or formed again (-1).
  void CountFailedStream(int64_t delta);
  // Tells the listener if serving() has changed since it was last told.
  void NotifyServing();

  KeyValueStore* const store_;
  const GroupOptions options_;
  const std::string epoch_;                   // rank 0's; empty on other ranks
  std::atomic<bool> epoch_published_{false};  // rank 0: epoch_ is in the store
  absl::Mutex mu_;
  std::map<std::string, Backend, std::less<>> decided_
      ABSL_GUARDED_BY(mu_);  // epoch root -> backend
  // AwaitMembers' progress (its one caller at a time writes them).
  bool member_published_ = false;
  std::atomic<int64_t> members_seen_{0};
  std::atomic<bool> ready_{false};
  std::atomic<int64_t> failed_streams_{0};  // streams whose `failed_` is set
  absl::Mutex listener_mu_;
  std::function<void(bool)> listener_ ABSL_GUARDED_BY(listener_mu_);
  std::optional<bool> told_ ABSL_GUARDED_BY(listener_mu_);  // what the listener last heard
};

class StreamGroup {
 public:
  ~StreamGroup();

  const std::string& stream() const { return stream_; }

  // Forms the stream's collective if it is not formed for the store's current generation.
  // Returns DeadlineExceeded naming the ranks that did not come to form it within the timeout
  // (the generation is then ended), or the store's or backend's error.
  absl::Status Form();

  // Runs one round's agreement (round.h) on the formed collective, forming it first if needed,
  // and publishes this rank's arrival for (stream, record.round) if the round is slow
  // (arrival.h). Same outcome on every rank as AgreeRound; additionally a round whose collective
  // times out fails with DeadlineExceeded naming the ranks that never arrived, and a collective
  // failure of any kind ends the generation (the next call re-forms).
  absl::StatusOr<AgreedRound> Agree(const RoundRecord& record);

  // Stores the agreed result of `round` (opaque bytes chosen by the service) so that a restarted
  // sidecar recovers it; keeps the last GroupOptions::kept_results rounds written by this
  // instance. A group of one stores nothing.
  absl::Status PutResult(int64_t round, absl::string_view result);

  // The stored result of `round`, or std::nullopt. Does not wait for it.
  absl::StatusOr<std::optional<std::string>> GetResult(int64_t round);

  // Thread-safe snapshot for status reporting.
  GroupInfo info() const;

  // Ends this stream group for good (a shutdown): a round in flight fails at once with Aborted;
  // so does a formation in progress (its half-formed connections are closed; with Gloo, within
  // milliseconds), which also ends that generation when the store can still record it — except
  // a wait on the store itself (for a peer's address, the run epoch, the backend), which ends
  // when the store's calls are cancelled, as the service does at shutdown right after this
  // (RendezvousStore::Cancel). An NCCL formation is not aborted. Every later Form or Agree fails
  // at once with Aborted, so an Abort that comes before a formation starts is not lost.
  // Thread-safe.
  void Abort();

 private:
  friend class Group;
  StreamGroup(Group& group, std::string stream);

  absl::Time Deadline() const;
  absl::Status FormIfNeeded(absl::Time deadline);
  // What Form and Agree return after Abort().
  absl::Status AbortedAtShutdown() const;
  // Records `cause` ("round <r>", "formation"; first writer wins), bumps the generation from
  // `generation` (no-op if someone already did) and drops the collective. If the store cannot
  // be reached, the next formation records the end before it reads the generation.
  void EndGeneration(int64_t generation, absl::Status why, absl::string_view cause,
                     CleanupCalls& cleanup);
  // One attempt of Agree. `first`: an Aborted failure on a generation that had ended before
  // this round drops it and sets stale_ instead of failing the round.
  absl::StatusOr<AgreedRound> AgreeOnce(const RoundRecord& record, absl::Time deadline, bool first);
  // Whether `generation` ended before `round` (by an earlier round, a formation or a restart).
  bool StaleGeneration(int64_t generation, int64_t round, CleanupCalls& cleanup);
  // "[1, 3]" for the ranks whose `key(rank)` is absent from the store; std::nullopt if the store
  // could not tell (cleanup.unreachable() says why).
  std::optional<std::string> MissingRanks(CleanupCalls& cleanup,
                                          const std::function<std::string(int64_t)>& key);
  // Rank 0: deletes the keys of up to `at_most` generations below `generation`, from the lowest
  // not yet deleted.
  void CleanEndedGenerations(int64_t generation, int64_t at_most, absl::Time deadline);
  void SetFailure(absl::Status status);
  // Sets or clears failed_ (counted in Group::serving()).
  void SetFailed(bool failed);

  Group& group_;
  const std::string stream_;

  // Touched only by the calling thread (one at a time).
  std::string stream_root_;  // under the epoch the collective was formed in
  std::deque<int64_t> written_results_;
  bool tried_to_form_ = false;  // a restarted rank ends the generation its old self joined
  bool stale_ = false;          // the last AgreeOnce dropped a generation that had ended
  // A generation this rank ended while the store was unreachable (recorded at the next formation).
  struct UnrecordedEnd {
    std::string stream_root;
    int64_t generation;
    std::string cause;
  };
  std::optional<UnrecordedEnd> unrecorded_end_;
  // Rank 0: generations below cleaned_below_ under cleaned_root_ have had their keys deleted.
  std::string cleaned_root_;
  int64_t cleaned_below_ = 0;

  std::unique_ptr<ArrivalPublisher> arrival_;  // made by the first round with a store

  mutable absl::Mutex mu_;
  std::shared_ptr<Collective> collective_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Cancellation> forming_ ABSL_GUARDED_BY(mu_);  // while a formation runs
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;                    // Abort() was called
  GroupInfo info_ ABSL_GUARDED_BY(mu_);
  // The last formation or collective call failed, and the collective has not formed since.
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_GROUP_H_
