#ifndef PACKSCHED_SERVER_CLI_DYNAMIC_CP_FLAGS_H_
#define PACKSCHED_SERVER_CLI_DYNAMIC_CP_FLAGS_H_

// The flags of `packsched plan --dynamic_cp` (absl flags, one per row of
// PACKSCHED_DYNAMIC_CP_OPTIONS, server/planner/schema.h) and their translation into a
// DynamicCpRequest.

#include "absl/status/statusor.h"
#include "server/cli/dynamic_cp_command.h"
#include "server/cli/plan_command.h"

namespace packsched::cli {

// --dynamic_cp: whether the run plans dynamic context parallelism.
bool DynamicCpFromFlags();

// The request the flags describe, after RequestFromFlags made `plan` (its --world_size is R,
// its --max_token_len the cap on one rank's rows, its --tensor_parallel, --divisible_by and
// --model_config are read). Returns InvalidArgument naming the flag for: a dynamic-CP flag set
// without --dynamic_cp; with it, --world_size missing, --num_parts, --sync or --micro_batch_cost
// set, an unknown --cp_sizes, a value out of its range (DynamicCpRequest's checks), a cost
// weight set with --model_config (the model gives them) or a link ratio without it.
// REQUIRES: absl::ParseCommandLine has run.
absl::StatusOr<DynamicCpRequest> DynamicCpRequestFromFlags(const PlanRequest& plan);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_DYNAMIC_CP_FLAGS_H_
