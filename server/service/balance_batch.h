#ifndef PACKSCHED_SERVER_SERVICE_BALANCE_BATCH_H_
#define PACKSCHED_SERVER_SERVICE_BALANCE_BATCH_H_

// The BalanceBatch call's work (SchedulerService::BalanceBatch): a whole global batch split over
// world_size ranks and planned per rank, with every rank's loss weights over the global counts.
// Pure planning: no round, no collective. Thread-safe.

#include <functional>

#include "absl/status/status.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/service/limits.h"

namespace packsched::service {

// Validates `request` (as convert.h does for Plan; world_size in [1, kMaxWorldSize] and at most
// --max_sequences_per_request; group_ids empty or one per sequence (per rollout with a forest);
// sync; model_config, costed over the lengths or the forest: planner::UseModelCost) and
// writes every rank's plan into `response`. InvalidArgument names the field at fault,
// ResourceExhausted the server limit. `stop` (may be empty) is asked every few thousand steps of
// the planning and of writing the response: its first non-OK answer is returned at once.
absl::Status RunBalanceBatch(const v1::BalanceBatchRequest& request, const ServiceLimits& limits,
                             const std::function<absl::Status()>& stop,
                             v1::BalanceBatchResponse* response);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_BALANCE_BATCH_H_
