#ifndef PACKSCHED_SERVER_SERVICE_DYNAMIC_CP_H_
#define PACKSCHED_SERVER_SERVICE_DYNAMIC_CP_H_

// The PlanDynamicCp call's work (SchedulerService::PlanDynamicCp): one step over world_size
// ranks with CP groups of the sizes the sequences need (server/planner/dynamic_cp.h), and each
// rank's view of it. Pure planning; with `stream` set, the service first runs the round
// ToDynamicCpRound makes (the coordinator's), which checks that every rank sent the same step.
// Thread-safe.

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/dynamic_cp_model.h"
#include "server/service/limits.h"
#include "server/service/round_types.h"

namespace packsched::service {

// The planner's options of a request (schema table PACKSCHED_DYNAMIC_CP_OPTIONS), defaults
// applied, with ranks = world_size; `links` gets the model's link ratios. InvalidArgument for an
// unknown `sizes`; the ranges are PlanDynamicCp's to check.
absl::StatusOr<planner::DynamicCpOptions> ToDynamicCpOptions(const v1::DynamicCpOptions& p,
                                                             int64_t world_size,
                                                             planner::CpModelLinks& links);

// The step's fingerprint: every field of `request` but rank, stream and round — world_size,
// lengths, owner_ranks, loss_tokens, then options, loss and model_config in deterministic
// serialization (map entries by key), after kProtocolVersion. Stable across processes and
// machines (Fingerprint64), so ranks can compare it; two requests that differ in any of those
// fields differ in it (up to 64-bit collisions).
uint64_t StepFingerprint(const v1::PlanDynamicCpRequest& request);

// The agreement round of a request with `stream` set (RoundInput::agree_only): stream and round
// as Plan's, options_hash and content_hash the step's fingerprint, and `error` the request's
// own error (RunPlanDynamicCp's checks before planning), which joins the round so the peers
// fail with it. InvalidArgument at once for an invalid stream name, or a round set without a
// stream.
absl::StatusOr<RoundInput> ToDynamicCpRound(const v1::PlanDynamicCpRequest& request,
                                            const ServiceLimits& limits);

// A failed agreement round's status for the caller: a mismatch of the record's options (the
// step's fingerprint) says that the ranks sent different steps, before the round's own message
// (which names a rank on each side and both fingerprints); any other status as it is.
absl::Status ExplainStepRound(const absl::Status& status);

// Validates `request` — world_size in [1, 2^20]; the lengths at most
// --max_sequences_per_request and divisible_by at most --max_micro_batches (ResourceExhausted);
// owner_ranks and loss_tokens empty or one per sequence (owners in [0, world_size), loss tokens in
// [0, the length]); rank, when set, in [0, world_size); the loss options; model_config as
// CpCostOfModelFields reads it; the options and the lengths as PlanDynamicCp checks them (its
// messages) — then plans the step and writes the group names, the requested views, the per-sequence
// figures, the options applied and the plan's fingerprint into `response`. Before the views are
// written, `reserve` (may be empty) is called once with their bytes (DynamicCpResponseBytes,
// request_memory.h): its error is returned and nothing is written. `stop` (may be empty) is asked
// every few thousand views written: its first non-OK answer is returned at once.
absl::Status RunPlanDynamicCp(const v1::PlanDynamicCpRequest& request, const ServiceLimits& limits,
                              const std::function<absl::Status()>& stop,
                              const std::function<absl::Status(int64_t bytes)>& reserve,
                              v1::PlanDynamicCpResponse* response);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_DYNAMIC_CP_H_
