#ifndef PACKSCHED_SERVER_CLI_DYNAMIC_CP_COMMAND_H_
#define PACKSCHED_SERVER_CLI_DYNAMIC_CP_COMMAND_H_

// `packsched plan --dynamic_cp`: the step's sequences over --world_size ranks with CP groups of
// the sizes they need (server/planner/dynamic_cp.h), as a table or as JSON.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/cli/read_model_config.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/dynamic_cp_model.h"

namespace packsched::cli {

struct DynamicCpRequest {
  planner::DynamicCpOptions options;  // ranks = --world_size
  planner::CpModelLinks links;        // with a model only
  std::optional<ModelFields> model;   // --model_config: the cost weights from the model
};

struct DynamicCpRun {
  planner::DynamicCpPlan plan;
  DynamicCpRequest request;   // options.cost: the weights the plan used (the model's, if given)
  double plan_seconds = 0.0;  // wall time of CpCostOfModel and PlanDynamicCp
};

// Whether `request`'s options hold together, before any length is read: PlanDynamicCp's own
// checks of the options, its message with the option named as its flag ("--max_cp = 3: must
// divide ranks = 4"), and the links' ranges (--cp_flops_per_byte...: finite and >= 0,
// --cp_bytes_per_element >= 1). InvalidArgument.
absl::Status CheckDynamicCpRequest(const DynamicCpRequest& request);

// The plan of `lengths`: the model's weights first (when request.model is set), then
// PlanDynamicCp. Returns the planner's error, naming the sequence for an input it cannot plan.
absl::StatusOr<DynamicCpRun> RunDynamicCp(absl::Span<const int64_t> lengths,
                                          const DynamicCpRequest& request);

// One JSON object and a newline: "mode" ("dynamic_cp"), "options" (by the table's names),
// "cost_model" (the six weights used), "num_micro_batches", "slots" (per slot its "cost" and
// "groups": first_rank, size, name, ranks, sequences, cu_seqlens, tokens_per_rank, cost),
// "group_names" ([first_rank, size] per name), "cp_of_sequence", "slot_of_sequence",
// "step_cost", "lower_bound", "comm_tokens" and "plan_ms".
std::string DynamicCpJson(const DynamicCpRun& run);

// A summary (sequences, ranks, slots, step cost against its lower bound, the distinct groups)
// and one line per slot: its groups as "ranks a-b: n seqs, t tokens/rank, cost c".
std::string DynamicCpTable(const DynamicCpRun& run);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_DYNAMIC_CP_COMMAND_H_
