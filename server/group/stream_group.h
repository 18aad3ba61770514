#ifndef PACKSCHED_SERVER_GROUP_STREAM_GROUP_H_
#define PACKSCHED_SERVER_GROUP_STREAM_GROUP_H_

// One stream's context in the rank group (group.h): its collective, formed lazily under the
// prefix (run epoch, generation) read from the rendezvous store, and its generation ledger. Any
// collective failure or timeout ends the generation (the generation counter in the store is
// bumped, once, by compare-and-set); every call first checks the store's generation and
// re-forms when it has moved, so survivors heal on their next call without a restart. Every wait
// is bounded by GroupOptions::collective_timeout (formation and round each), never by a
// caller's deadline.
//
// stream_group.cc: formation, a round's agreement (and the blame when it fails);
// generations.cc: ending a generation, telling a stale one, deleting the keys of ended ones.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/cancellation.h"
#include "server/collective/collective.h"
#include "server/group/arrival.h"
#include "server/group/group.h"
#include "server/group/round.h"
#include "server/group/round_agreement.h"

namespace packsched::group {

class CleanupCalls;  // blame.h

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
  // The same, bounded by `deadline` instead of the collective timeout from now.
  absl::StatusOr<AgreedRound> Agree(const RoundRecord& record, absl::Time deadline);

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
  // Rank 0: deletes the keys of up to `at_most` generations below `generation`, from the lowest
  // not yet deleted.
  void CleanEndedGenerations(int64_t generation, int64_t at_most, absl::Time deadline);
  void SetFailure(absl::Status status);
  // Sets or clears failed_ (counted in Group::serving()).
  void SetFailed(bool failed);

  Group& group_;
  const std::string stream_;

  // Touched only by the calling thread (one at a time).
  std::string epoch_root_;            // the epoch the collective was formed in
  std::string stream_root_;           // under that epoch
  bool tried_to_form_ = false;        // a restarted rank ends the generation its old self joined
  bool published_not_ready_ = false;  // a formation failed on this rank's side (blame.h)
  bool stale_ = false;                // the last AgreeOnce dropped a generation that had ended
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
  std::shared_ptr<collective::Collective> collective_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<collective::Cancellation> forming_
      ABSL_GUARDED_BY(mu_);                    // while a formation runs
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;  // Abort() was called
  GroupInfo info_ ABSL_GUARDED_BY(mu_);
  // The last formation or collective call failed, and the collective has not formed since.
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_STREAM_GROUP_H_
