#ifndef PACKSCHED_SERVER_GROUP_RESULT_REPLICA_H_
#define PACKSCHED_SERVER_GROUP_RESULT_REPLICA_H_

// Agreed round results that outlive any one sidecar, rank 0 included (docs/design.md §3, "Rounds
// that never split"; docs/decisions.md, "Every rank keeps the agreed results").
//
// Every rank that agrees a round keeps its result (the agreed values, a few dozen bytes) for the
// stream's last GroupOptions::kept_results rounds, and writes it into the rendezvous store under
// the current run epoch, in the background, off the round's path. When rank 0 restarts, its store
// starts empty under a new epoch: every other rank notices the new epoch (it reads the epoch
// once a `poll` when idle), writes everything it keeps into it, publishes its membership there
// (so the restarted rank 0 becomes ready without a round) and then its "replicated" mark; rank 0
// folds the marks into one key once all are there. A lookup costs O(1) store requests. So a
// rank that missed a round its peers finished — it was restarted, or its collective failed while
// theirs completed — finds the agreed values in the store (Lookup), as long as one rank that
// finished the round is alive.
//
//   ResultReplica replica(group);                             // one per sidecar, world_size > 1
//   replica.Record("actor", 7, SerializeAgreedResult(...));   // after each agreed round
//   replica.Lookup("actor", 7, settle, deadline);             // before running a round again

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/store.h"
#include "server/group/group.h"

namespace packsched::group {

struct ReplicaOptions {
  // How often an idle rank (not rank 0) reads the run epoch, to notice that rank 0 restarted,
  // and how long one of its store calls waits. Over a store with a connection to watch
  // (KeyValueStore::AwaitDisconnect: rank 0's rendezvous store over gRPC) the epoch is also read
  // as soon as that connection drops, so this is only a backstop there (the sidecar: 10 s).
  absl::Duration poll = absl::Seconds(1);
  // Wait after a failed store write before the next try.
  absl::Duration retry = absl::Milliseconds(100);
};

class ResultReplica {
 public:
  // Starts the background writer. REQUIRES: `group` (and its store) outlive this.
  explicit ResultReplica(Group& group, ReplicaOptions options = {});
  // Stops the writer and joins it: within one store call (bounded by the group's collective
  // timeout; at once when the store's waits are cancelled, as at shutdown); and the connection
  // watcher, within 200 ms.
  ~ResultReplica();

  ResultReplica(const ResultReplica&) = delete;
  ResultReplica& operator=(const ResultReplica&) = delete;

  // Keeps `result` as the agreed result of `stream`'s `round` (the last kept_results rounds of
  // each stream are kept) and has the writer put it in the store. Returns at once. Thread-safe.
  void Record(const std::string& stream, int64_t round, std::string result);

  // Drops what is kept of `stream` (a reclaimed stream). What the store holds stays. Thread-safe.
  void Forget(const std::string& stream);

  // The agreed result of `stream`'s `round` as some rank recorded it, or std::nullopt if none has.
  // Any rank: while some rank (rank 0 aside) has not yet written what it keeps into the current
  // epoch (its "replicated" mark, which rank 0 folds into one key once every rank's is there; all
  // there at once unless rank 0 has just restarted, or a rank is down), the result is read again
  // after each wait for the folded mark (50 ms, doubling up to 800 ms) and returned once any rank
  // has written it — so a restarted rank 0, or a rank restarted with it, finds a round the live
  // ranks finished while other ranks are still down. Once every
  // mark is there and the result is not, it is waited for up to `settle` more (a write still on its
  // way from a rank that finished the round just before a link was cut). Never waits past
  // `deadline`: std::nullopt then. Returns the store's error if it cannot be read. Thread-safe.
  absl::StatusOr<std::optional<std::string>> Lookup(const std::string& stream, int64_t round,
                                                    absl::Duration settle, absl::Time deadline);

  // How many epochs this rank has written everything it keeps into (tests; 1 after start-up, +1
  // after every restart of rank 0 noticed).
  int64_t epochs_replicated() const;

 private:
  struct Pending {
    std::string stream;
    int64_t round;
    std::string result;  // empty: delete the round's key (rank 0 trims the store)
  };

  void Run();
  // Writes every kept result, the membership and the mark into `epoch`.
  absl::Status Replicate(const std::string& epoch);
  // Writes (or, for an empty result, deletes) one pending entry into `epoch`.
  absl::Status Write(const std::string& epoch, const Pending& entry);
  // Waits up to `d`, or until stopped (returns true) or, if `wake_on_work`, work is pending.
  bool WaitUnlessStopped(absl::Duration d, bool wake_on_work);

  Group& group_;
  const ReplicaOptions options_;

  mutable absl::Mutex mu_;
  // Per stream: round -> result, the last kept_results rounds.
  std::map<std::string, std::map<int64_t, std::string>> kept_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The store may have missed writes (it was unreachable, or the queue overflowed): write
  // everything kept again.
  bool resync_ ABSL_GUARDED_BY(mu_) = false;
  int64_t epochs_replicated_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether every rank but rank 0 has marked `epoch` as holding what it keeps: the key rank 0
  // folds the marks into (FoldMarks), waited for until `until`, remembered for the rest of that
  // epoch. Never holds marks_mu_ while it waits.
  bool AllMarked(collective::KeyValueStore& store, const std::string& epoch, absl::Time until);
  // Rank 0: waits a moment for the next missing mark of its own epoch and, once every rank's is
  // there, writes the folded key. `next` is the lowest rank whose mark is not yet seen; W + 1
  // once the folded key is written. False if the store failed (not a mark still missing): the
  // caller waits a retry period before the next pass.
  bool FoldMarks(const std::string& epoch, int64_t& next);

  absl::Mutex marks_mu_;
  std::string marked_epoch_ ABSL_GUARDED_BY(marks_mu_);  // the epoch seen fully marked

  // Set by the watcher when the store's connection to rank 0 dropped: the writer reads the epoch
  // at once instead of at its next poll.
  bool disconnected_ ABSL_GUARDED_BY(mu_) = false;
  // Ranks other than 0: waits on the store's connection (no requests) and sets disconnected_.
  // Returns when stopped, or at once for a store without a connection.
  void Watch();

  std::thread thread_;   // started once everything above is constructed
  std::thread watcher_;  // last: ranks other than 0 only
};

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_RESULT_REPLICA_H_
