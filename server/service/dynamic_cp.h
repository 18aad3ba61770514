#ifndef PACKSCHED_SERVER_SERVICE_DYNAMIC_CP_H_
#define PACKSCHED_SERVER_SERVICE_DYNAMIC_CP_H_

// The PlanDynamicCp call's work (SchedulerService::PlanDynamicCp): one step over world_size
// ranks with CP groups of the sizes the sequences need (server/planner/dynamic_cp.h), and each
// rank's view of it. Pure planning: no round, no collective. Thread-safe.

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/dynamic_cp_model.h"
#include "server/service/limits.h"

namespace packsched::service {

// The planner's options of a request (schema table PACKSCHED_DYNAMIC_CP_OPTIONS), defaults
// applied, with ranks = world_size; `links` gets the model's link ratios. InvalidArgument for an
// unknown `sizes`; the ranges are PlanDynamicCp's to check.
absl::StatusOr<planner::DynamicCpOptions> ToDynamicCpOptions(const v1::DynamicCpOptions& p,
                                                             int64_t world_size,
                                                             planner::CpModelLinks& links);

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
