#ifndef PACKSCHED_SERVER_SERVICE_PARTITION_H_
#define PACKSCHED_SERVER_SERVICE_PARTITION_H_

// The Partition call's work (SchedulerService::Partition): one rank's lengths into the
// micro-batch count the caller fixes, with loss weights over the caller's global counts. Pure
// planning: no round, no collective. Thread-safe.

#include "absl/status/status.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/service/limits.h"

namespace packsched::service {

// Validates `request` (as convert.h does, a cap of 0 and equal_size allowed; num_micro_batches
// in [1, max_micro_batches]; the global counts: Loss counts >= 0 and at least this request's
// own, world_size in [0, kMaxWorldSize], 0 = 1) and writes the plan into `response`.
// InvalidArgument names the field at fault, ResourceExhausted the server limit.
absl::Status RunPartition(const v1::PartitionRequest& request, const ServiceLimits& limits,
                          v1::PlanResponse* response);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_PARTITION_H_
