#ifndef PACKSCHED_SERVER_GROUP_GROUP_H_
#define PACKSCHED_SERVER_GROUP_GROUP_H_

// The rank group's lifecycle (docs/design.md §3): one Group per sidecar process, one StreamGroup
// (stream_group.h) per stream, each with its own collective and called from that stream's
// worker thread. The service reaches it through the agreement port (round_agreement.h,
// group_agreement.h); the sidecar makes the Group, its agreements and its readiness watch
// (server/sidecar/rank_group.h).
//
// Group (here): the run epoch, the backend (auto agreed once per epoch), and readiness — every
// rank has joined the run, and no stream is between generations (serving()).
//
//   ASSIGN_OR_RETURN(auto group, Group::Create(&store, options));   // at start-up
//   auto actor = group->ForStream("actor_update");                  // first Plan of a stream
//   absl::StatusOr<AgreedRound> agreed = actor->Agree(record);      // per round, identical on
//                                                                   // every rank
//   ... GetStatus / readiness: actor->info(), group->serving(); shutdown: actor->Abort().

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/backend.h"
#include "server/collective/collective.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/nccl_collective.h"
#include "server/collective/store.h"

namespace packsched::group {

struct GroupOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  collective::Backend backend = collective::Backend::kAuto;
  // Bound of every wait: forming a generation, and the collective of one round.
  absl::Duration collective_timeout = absl::Seconds(30);
  collective::GlooOptions gloo;
  collective::NcclOptions nccl;
  // Every key this group uses starts with this (several groups may share one store).
  std::string key_root = "packsched/";
  // (Keys of ended generations stay until the group forms again: at most 4W + 2 per failed
  // round per stream, see group_keys.h.)
  // Agreed round results kept in the store per stream (older ones are deleted by the writer).
  int64_t kept_results = 64;
  // Whether this rank can use NCCL for --backend=auto; unset: CanUseNccl(). (Tests set it.)
  std::optional<bool> can_use_nccl;
  // Forms the collective of a generation in place of the backend (collective::FormCollective):
  // for simulations of thousands of ranks in one process (tests/bench), which drive the group's
  // own formation and store protocol without thousands of Gloo contexts. Empty: the backend's.
  std::function<absl::StatusOr<std::unique_ptr<collective::Collective>>(
      collective::KeyValueStore& store, absl::string_view prefix, int64_t rank, int64_t world_size,
      absl::Time deadline)>
      form_collective;
};

class StreamGroup;  // stream_group.h

class Group {
 public:
  // `store` is not owned and must outlive the group and its streams. Rank 0 draws a random run
  // epoch here. Returns InvalidArgument for a null store (a sidecar without a rendezvous store is
  // a group of one: CollectiveAgreements, collective_agreement.h), a bad rank, world size,
  // timeout, or backend (local with world_size > 1), or a Gloo algorithm other than
  // kRecursiveDoubling (the others are for comparison only: see GlooOptions::Algorithm).
  static absl::StatusOr<std::unique_ptr<Group>> Create(collective::KeyValueStore* store,
                                                       GroupOptions options);

  // The context of one stream (stream_group.h). REQUIRES: the Group outlives it.
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
  friend class ResultReplica;  // result_replica.h: the store and the epoch
  Group(collective::KeyValueStore* store, GroupOptions options, std::string epoch);

  // The run epoch: rank 0 publishes its own; other ranks wait for it in the store.
  absl::StatusOr<std::string> Epoch(absl::Time deadline);
  // The backend to form under `epoch_root` (auto is agreed once per epoch and cached).
  absl::StatusOr<collective::Backend> ResolveBackend(absl::string_view epoch_root,
                                                     absl::Time deadline);
  // Every rank has joined: ready() turns true (and stays so).
  void MarkReady();
  // A stream's collective failed (+1) or formed again (-1).
  void CountFailedStream(int64_t delta);
  // Tells the listener if serving() has changed since it was last told.
  void NotifyServing();

  collective::KeyValueStore* const store_;
  const GroupOptions options_;
  const std::string epoch_;                   // rank 0's; empty on other ranks
  std::atomic<bool> epoch_published_{false};  // rank 0: epoch_ is in the store
  absl::Mutex mu_;
  std::map<std::string, collective::Backend, std::less<>> decided_
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

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_GROUP_H_
