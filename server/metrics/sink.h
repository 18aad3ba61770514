#ifndef PACKSCHED_SERVER_METRICS_SINK_H_
#define PACKSCHED_SERVER_METRICS_SINK_H_

// The narrow interface through which the service layer records what the sidecar did: calls by
// method and status, the rounds the coordinator ran, and streams going away. No Prometheus
// here: server/metrics/sidecar_metrics.h implements it; the recorders hold a `Sink*` that is
// null when metrics are off (--metrics_listen empty), so an unobserved sidecar pays one branch
// per call and per round.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace packsched::metrics {

// The Scheduler service's methods (the `method` label).
enum class Method { kPlan, kPartition, kBalanceBatch, kGetStatus, kPlanDynamicCp };
inline constexpr int kNumMethods = 5;

// Why a round failed in its agreement with the peers (the `cause` label of
// packsched_group_peer_failures_total), from the round's status code.
enum class PeerFailure { kNone, kDeadline, kAborted, kMismatch };

// One round the coordinator ran (not a caller served from the cache or joining a round in
// flight). Figures after `code` are meaningful only when the round succeeded (code == kOk).
struct RoundSample {
  absl::string_view stream;  // valid during the call only
  int64_t round = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  PeerFailure peer_failure = PeerFailure::kNone;
  absl::Duration whole;  // the round on the stream's worker, ok or not
  absl::Duration local;  // bound and counts
  absl::Duration wait;   // the agreement (the collective, forming it included)
  absl::Duration partition;
  int64_t micro_batches = 0;  // agreed k
  int64_t sequences = 0;      // this rank's, given
  int64_t dropped = 0;        // this rank's sequences dropped (overlong = drop)
  double imbalance = 0.0;     // largest part cost / mean part cost (1 = perfect)
  // 1 - packed rows / rows of a naive [n x longest] padded batch; 0 when there is no sequence.
  double padding_saved_ratio = 0.0;
  // Token accounting (planner::PlanStats): logical, executed (rows, padding included), real
  // tokens forwarded and loss-bearing tokens of this rank's plan.
  int64_t logical_tokens = 0;
  int64_t executed_tokens = 0;
  int64_t forwarded_tokens = 0;
  int64_t loss_tokens = 0;
  int64_t over_cap_unavoidable = 0;  // parts over the cap holding one overlong sequence
  int64_t over_cap_avoidable = 0;    // parts over the cap holding several sequences
  // The stream's collective: formations that succeeded so far (0 in a group of one) and how
  // long the latest took. A sink sees a new formation when `formations` grows.
  int64_t formations = 0;
  absl::Duration last_formation;
};

// REQUIRES of every implementation: thread-safe, never blocks on I/O, never fails.
class Sink {
 public:
  virtual ~Sink() = default;

  // A call answered with `code` (every call, served or refused).
  virtual void Request(Method method, absl::StatusCode code) = 0;

  // A round the coordinator ran, on the stream's worker thread, after it ended.
  virtual void Round(const RoundSample& sample) = 0;

  // `stream` was reclaimed (docs/design.md §3): its per-stream series go. Called before a stream
  // of the same name can exist again.
  virtual void StreamRemoved(absl::string_view stream) = 0;
};

// The cause of a failed agreement, from its status code: DeadlineExceeded (a rank did not
// arrive), Aborted (a peer died or closed its connections), FailedPrecondition (the ranks
// disagree on stream, round, options or version); kNone otherwise.
inline PeerFailure PeerFailureOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kDeadlineExceeded:
      return PeerFailure::kDeadline;
    case absl::StatusCode::kAborted:
      return PeerFailure::kAborted;
    case absl::StatusCode::kFailedPrecondition:
      return PeerFailure::kMismatch;
    default:
      return PeerFailure::kNone;
  }
}

}  // namespace packsched::metrics

#endif  // PACKSCHED_SERVER_METRICS_SINK_H_
