#ifndef PACKSCHED_SERVER_GROUP_ROUND_AGREEMENT_H_
#define PACKSCHED_SERVER_GROUP_ROUND_AGREEMENT_H_

// The agreement port: how the round coordinator (server/service/coordinator.h) agrees each
// round with its peers, whatever the group is (docs/design.md §3). One RoundAgreements per
// sidecar; one RoundAgreement per stream, used by that stream's worker thread.
//
// Implementations:
//  - GroupAgreements (group_agreement.h): the rank group (--world_size, --rendezvous), over a
//    Group and its StreamGroups: forms, heals and re-forms each stream's collective, and answers
//    a round the peers finished before this sidecar (re)started from the rendezvous store;
//  - CollectiveAgreements (collective_agreement.h): over collectives made by a factory, without a
//    store. By default a group of one (LocalCollective): the sidecar without group flags. Tests
//    give it collectives of their own.
//
// The port is this header and round_record.h (the records a round takes and gives): the service
// includes nothing else of server/group/ (tests/layering_test.py). The sidecar's composition
// root (server/sidecar/rank_group.h) chooses the implementation.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/group/round_record.h"

namespace packsched::group {

// What GetStatus reports for one stream.
struct GroupInfo {
  bool formed = false;
  std::string backend;      // "gloo", "nccl", "local"; empty before the first formation
  int64_t generation = -1;  // -1 before the first formation
  std::string epoch;        // the rank group's run epoch (empty without one)
  absl::Status last_error;  // the last formation or collective failure (OK if none)
  // Formations that succeeded, and how long the latest took (for the metrics).
  int64_t formations = 0;
  absl::Duration last_formation;
};

// One stream's agreement with its peers.
class RoundAgreement {
 public:
  virtual ~RoundAgreement() = default;

  // Agrees one round (round.h's AgreeRound): the same AgreedRound on every rank, or the same
  // failure — a mismatch (FailedPrecondition), a rank's own error, or the collective's
  // DeadlineExceeded / Aborted (the implementation then forms the group again at the next call).
  // Forms the stream's collective first if needed, within the group's collective timeout. The
  // rank group may also answer from its store a round the peers finished before this sidecar
  // (re)started (the same values they agreed), and fails with DeadlineExceeded naming the ranks
  // that did not arrive. Called by the stream's worker thread, one round at a time.
  virtual absl::StatusOr<AgreedRound> Agree(const RoundRecord& record) = 0;

  // Ends the stream's agreement for good (a shutdown): a round in flight fails at once with
  // Aborted, and so does every later Agree. Thread-safe.
  virtual void Abort() = 0;

  // Thread-safe snapshot for status reporting.
  virtual GroupInfo info() const = 0;
};

// The sidecar's side of the group: makes each stream's RoundAgreement and reports the group.
class RoundAgreements {
 public:
  virtual ~RoundAgreements() = default;

  // The agreement of `stream`. Called once per stream, on its worker thread; does not block.
  // REQUIRES: this outlives the returned agreement.
  virtual std::unique_ptr<RoundAgreement> ForStream(std::string stream) = 0;

  // Ranks in the group (GetStatus.world_size).
  virtual int64_t world_size() const = 0;

  // Readiness, as GetStatus.group_ready and the health service's packsched.v1.Scheduler report
  // it: every rank has joined, and no stream is between generations (Group::serving()). Always
  // true without a store.
  virtual bool serving() const = 0;

  // Calls `listener(serving())` now, then whenever serving() changes: one call at a time.
  // Replaces any earlier listener; an empty one removes it. When this returns, the earlier
  // listener is neither running nor will it run. Thread-safe.
  virtual void SetServingListener(std::function<void(bool)> listener) = 0;
};

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_ROUND_AGREEMENT_H_
