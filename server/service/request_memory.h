#ifndef PACKSCHED_SERVER_SERVICE_REQUEST_MEMORY_H_
#define PACKSCHED_SERVER_SERVICE_REQUEST_MEMORY_H_

// What a request may cost in memory, estimated from the request alone before anything sized by
// it is allocated: the service reserves it from the in-flight budget (memory_budget.h) first.
// Pure functions of their arguments. Thread-safe.

#include <cstdint>

#include "packsched/v1/scheduler.pb.h"
#include "server/service/limits.h"

namespace packsched::service {

// Memory per request (docs/design.md §3): a request's peak bytes, estimated from the request
// alone before anything sized by it is allocated, as
//   kPeakBase + kPeakPerSequence·n + kPeakPerMicroBatch·k + kPeakPerRank·W
//             + kPeakPerWireByte·wire
// with n its sequences, wire its serialized size, k the most micro-batches the request can make
// this sidecar build and W its ranks (BalanceBatch's world_size; 0 for Plan and Partition)
// (RequestMemory). The constants are measured (tests/bench/memory_bench.py,
// tests/python/test_request_memory_peak.py; docs/benchmarks.md) with a margin: an empty
// micro-batch costs about 370 bytes at its peak (the planner's part, the response message, the
// wire copy), a sequence about 150, and a BalanceBatch rank about 1,160 more (its planner
// problem and plan, its index list, its RankPlan and PlanResponse messages and their wire copy:
// world_size = n = 400,000 under sync "step" peaks at 1,717 bytes per rank over the fresh
// sidecar's, all four terms together).
inline constexpr int64_t kPeakBase = int64_t{1} << 20;
inline constexpr int64_t kPeakPerSequence = 160;
inline constexpr int64_t kPeakPerMicroBatch = 400;
inline constexpr int64_t kPeakPerWireByte = 2;
inline constexpr int64_t kPeakPerRank = 1536;

struct RequestMemory {
  int64_t sequences = 0;      // n
  int64_t micro_batches = 0;  // k: the most micro-batches the request can make this sidecar build
  int64_t wire_bytes = 0;     // the request's serialized size
  int64_t ranks = 0;          // W: BalanceBatch's world_size (when valid); 0 otherwise
  int64_t bytes = 0;          // the estimated peak (saturates at INT64_MAX)
};

// The formula above.
int64_t PeakBytes(int64_t sequences, int64_t micro_batches, int64_t wire_bytes, int64_t ranks);

// k for each request (values validation refuses count nothing: such a request allocates nothing
// sized by them). d = divisible_by, m = min_micro_batches, K = the request's max_micro_batches
// (at most the server's):
//  - Plan: min(K, roundup(max(m, b, 1), d)), b the planner's largest possible local bound: n, or,
//    in tokens mode without a count limit, 1 + (aligned tokens) / (cap/2 - align_total_to + 1)
//    plus the sequences over the cap (best fit leaves at most one part at most half full). A
//    round whose peers raise k above this is not reserved again (docs/design.md §3).
//  - Partition: num_micro_batches.
//  - BalanceBatch: world_size x the per-rank count of Plan over the largest rank's share.
// With a forest, n is its nodes + rollouts, and b its rollouts (at most one piece each).
RequestMemory EstimatePlanMemory(const v1::PlanRequest& request, const ServiceLimits& limits);
RequestMemory EstimatePartitionMemory(const v1::PartitionRequest& request,
                                      const ServiceLimits& limits);
RequestMemory EstimateBalanceBatchMemory(const v1::BalanceBatchRequest& request,
                                         const ServiceLimits& limits);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_REQUEST_MEMORY_H_
