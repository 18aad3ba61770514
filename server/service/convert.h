#ifndef PACKSCHED_SERVER_SERVICE_CONVERT_H_
#define PACKSCHED_SERVER_SERVICE_CONVERT_H_

// Wire <-> planner conversion: validation of every request field, with every limit checked
// before anything sized by the request is allocated, and the responses. (What a request may
// cost: request_memory.h; the options fingerprint: options_hash.h; the Partition and
// BalanceBatch calls: partition.h, balance_batch.h.) Pure functions of their
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

// The same from the fields every planning request has (Plan, Partition, BalanceBatch): options
// first (they bound everything sized by them), then the lengths (or `forest`, when not null)
// and loss tokens.
absl::StatusOr<PlanInput> MakePlanInput(const google::protobuf::RepeatedField<int64_t>& lengths,
                                        const v1::PlanOptions& options,
                                        const google::protobuf::RepeatedField<int64_t>& loss_tokens,
                                        const v1::LossOptions& loss, const ServiceLimits& limits,
                                        bool planner_picks_k, const v1::Forest* forest);

// A Plan request as submitted to its round: fails only when the round cannot be identified (bad
// stream name); any other problem is carried in RoundInput::error to join the round.
absl::StatusOr<RoundInput> ToRoundInput(const v1::PlanRequest& request,
                                        const ServiceLimits& limits);

// Writes the response's micro-batch counts: the agreed `k` and this rank's own bound (the plan's
// local_k).
void PlanResponseHead(int64_t k, const planner::MicroBatchPlan& plan, v1::PlanResponse* response);

// Writes a finished round into `response`.
void RoundResultToProto(const RoundResult& result, v1::PlanResponse* response);

// Writes a plan (and optional loss weights) into the plan fields of `response`: micro-batches,
// reorder, revert, dropped, loss weights and the plan's stats.
void PlanToProto(const planner::MicroBatchPlan& plan, const planner::LossWeights* loss,
                 int64_t max_token_len, v1::PlanResponse* response);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_CONVERT_H_
