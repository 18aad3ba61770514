#ifndef PACKSCHED_SERVER_SERVICE_CONVERT_H_
#define PACKSCHED_SERVER_SERVICE_CONVERT_H_

// Wire <-> planner conversion: validation of every request field, with every limit checked
// before anything sized by the request is allocated, and the responses. Pure functions of their
// arguments (no I/O, no gRPC runtime), so they can be fuzzed directly. Thread-safe.
//
// Errors name the field and its value: InvalidArgument for bad input, ResourceExhausted for a
// server limit (naming the flag).

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"
#include "server/service/limits.h"
#include "server/service/round_types.h"

namespace packsched::service {

// A stream name: 1 to limits.max_stream_name printable ASCII characters.
absl::Status ValidateStream(absl::string_view stream, const ServiceLimits& limits);

// The planner options of a request, defaults applied (0 / UNSPECIFIED = documented default).
// `planner_picks_k` (Plan, BalanceBatch: the planner chooses the micro-batch count): max_token_len
// must be >= 1 and equal_size is refused. Partition (a count the caller fixes) allows a cap of 0
// and equal_size.
absl::StatusOr<planner::PlanOptions> ToPlanOptions(const v1::PlanOptions& p,
                                                   const ServiceLimits& limits,
                                                   bool planner_picks_k);
absl::StatusOr<planner::LossOptions> ToLossOptions(const v1::LossOptions& p);

// Validates lengths (count within the limit, each >= 1) and loss_tokens (empty, or one per
// sequence, each in [0, its length]) and assembles the planner input with its hashes. With a
// forest (tree packing; lengths must then be empty): the forest as ToForest (forest_convert.h)
// checks it, loss_tokens one per rollout.
absl::StatusOr<PlanInput> ToPlanInput(const v1::PlanRequest& request, const ServiceLimits& limits);

// A Plan request as submitted to its round: fails only when the round cannot be identified (bad
// stream name); any other problem is carried in RoundInput::error to join the round.
absl::StatusOr<RoundInput> ToRoundInput(const v1::PlanRequest& request,
                                        const ServiceLimits& limits);

// Runs a Partition request (pure planning, no collective) into `response`.
absl::Status RunPartition(const v1::PartitionRequest& request, const ServiceLimits& limits,
                          v1::PlanResponse* response);

// Runs a BalanceBatch request (pure planning, no collective) into `response`.
absl::Status RunBalanceBatch(const v1::BalanceBatchRequest& request, const ServiceLimits& limits,
                             v1::BalanceBatchResponse* response);

// Memory per request (docs/design.md §3): a request's peak bytes, estimated from the request
// alone before anything sized by it is allocated, as
//   kPeakBase + kPeakPerSequence·n + kPeakPerMicroBatch·k + kPeakPerWireByte·wire
// with n its sequences, wire its serialized size and k the most micro-batches the request can
// make this sidecar build (RequestMemory). The constants are measured (tests/bench/
// memory_bench.py; docs/benchmarks.md) with a margin: an empty micro-batch costs about 370 bytes
// at its peak (the planner's part, the response message, the wire copy), a sequence about 150.
inline constexpr int64_t kPeakBase = int64_t{1} << 20;
inline constexpr int64_t kPeakPerSequence = 160;
inline constexpr int64_t kPeakPerMicroBatch = 400;
inline constexpr int64_t kPeakPerWireByte = 2;

struct RequestMemory {
  int64_t sequences = 0;      // n
  int64_t micro_batches = 0;  // k: the most micro-batches the request can make this sidecar build
  int64_t wire_bytes = 0;     // the request's serialized size
  int64_t bytes = 0;          // the estimated peak (saturates at INT64_MAX)
};

// The formula above.
int64_t PeakBytes(int64_t sequences, int64_t micro_batches, int64_t wire_bytes);

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

// Writes a finished round into `response`.
void RoundResultToProto(const RoundResult& result, v1::PlanResponse* response);

// Writes a plan (and optional loss weights) into the plan fields of `response`: micro-batches,
// reorder, revert, dropped, loss weights and the plan's stats.
void PlanToProto(const planner::MicroBatchPlan& plan, const planner::LossWeights* loss,
                 int64_t max_token_len, v1::PlanResponse* response);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_CONVERT_H_
