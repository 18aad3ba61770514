#ifndef PACKSCHED_SERVER_SERVICE_ROUND_TYPES_H_
#define PACKSCHED_SERVER_SERVICE_ROUND_TYPES_H_

// The value types of one planning round, shared by the request conversion (convert.h) and the
// round coordinator (coordinator.h). No gRPC or protobuf here.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/planner/forest.h"
#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/planner/plan.h"
#include "server/planner/tree_plan.h"

namespace packsched::service {

// Wire protocol version carried in every round record (packsched.v1).
inline constexpr int64_t kProtocolVersion = 1;

// One rank's validated planning input (what a Plan request becomes).
struct PlanInput {
  std::vector<int64_t> lengths;  // empty with a forest
  // Tree packing: the forest planned instead of `lengths` (validated); loss_tokens per rollout.
  std::optional<planner::Forest> forest;
  planner::PlanOptions options;
  // Agree k over the DP ranks (true) or keep the local bound (false; counts are still agreed).
  bool same_micro_num_in_dp = true;
  // Per-sequence loss tokens; nullopt = no loss weights in the plan.
  std::optional<std::vector<int64_t>> loss_tokens;
  planner::LossOptions loss;
  // Fingerprint of every option that changes k or the weights: stable across processes and
  // builds, so ranks can compare it (the round fails when they differ).
  uint64_t options_hash = 0;
  // Options hash + lengths + loss tokens, valid inside this process only: every caller of one
  // (stream, round) on this sidecar must send the same content.
  uint64_t content_hash = 0;
};

// What a Plan call submits to the coordinator. A request whose content is invalid still joins
// its round with `error` set, so the peers fail with the same message instead of timing out.
struct RoundInput {
  std::string stream;
  int64_t round = 0;
  absl::Status error;  // not OK: this rank's validation failure
  PlanInput input;     // meaningful only when `error` is OK
  // The options fingerprint the round compares across ranks; set even when `error` is not OK
  // (from the parsed options when they are valid, so a rank with bad lengths still fails the
  // round with its own InvalidArgument rather than an options mismatch).
  uint64_t options_hash = 0;
  // Identifies the content for the same-round check; set even when `error` is not OK.
  uint64_t content_hash = 0;
  // PlanDynamicCp's step check (dynamic_cp.h): the round only agrees that every rank sent the
  // same step, whose fingerprint is `options_hash`. `input` is unused: the record brings a bound
  // of 1 and no counts, and the result carries only the agreed figures (num_micro_batches 1, no
  // plan); the caller plans the step after.
  bool agree_only = false;
};

struct GlobalCounts {
  int64_t num_sequences = 0;
  int64_t loss_tokens = 0;
  int64_t sequences_with_loss = 0;
  int64_t world_size = 1;
};

// The result of a successful round, shared (read-only) by every caller of it.
struct RoundResult {
  int64_t num_micro_batches = 0;  // agreed k
  int64_t local_k = 0;            // this rank's bound
  // The plan; for a forest, planner::ResponseView of `tree` (micro-batches over pieces, the
  // index lists over rollouts).
  planner::MicroBatchPlan plan;
  std::optional<planner::TreePlan> tree;     // a forest's plan, with its layout
  std::optional<planner::LossWeights> loss;  // set when the input had loss tokens
  GlobalCounts global;
  int64_t max_token_len = 0;
  absl::Duration local_time;      // validation + local bound + local counts
  absl::Duration wait_time;       // the collective
  absl::Duration partition_time;  // partition into k + loss weights
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_ROUND_TYPES_H_
