#ifndef PACKSCHED_SERVER_CLI_JSON_OUTPUT_H_
#define PACKSCHED_SERVER_CLI_JSON_OUTPUT_H_

// `packsched plan --format=json`: the whole plan as one JSON object, for programs.

#include <string>

#include "absl/strings/string_view.h"
#include "server/cli/json_writer.h"
#include "server/cli/plan_command.h"

namespace packsched::cli {

// One JSON object and a newline:
//   {"num_micro_batches": k,
//    "micro_batches": [{"indices": [...], "tokens", "aligned_tokens", "total", "padded_tokens",
//                       "cost", "max_seqlen", "max_seqlen_aligned", "cu_seqlens": [...],
//                       "cu_seqlens_aligned": [...], "empty", "overlong"}, ...],
//    "reorder": [...], "revert": [...], "dropped": [...],
//    "stats": {every PlanStats field by its name},
//    "options": {the options planned with, by flag name, plus "mode"},
//    "timing": {"plan_ms": wall time of the planner call}}
// Micro-batches appear in the plan's order; every number except imbalance and plan_ms is an
// integer. Only "timing" differs between two runs on the same input.
std::string PlanJson(const PlanRun& run);

// Pieces of PlanJson, shared with the tree plan's JSON (tree_command.h): a micro-batch's fields
// inside an open object, the stats, the step and the options block as objects.
void WriteMicroBatchFields(const planner::MicroBatch& part, JsonWriter& w);
void WriteStats(const planner::PlanStats& s, JsonWriter& w);
void WriteStep(const planner::StepStats& s, JsonWriter& w);
void WriteOptions(const PlanRun& run, JsonWriter& w);
// The plan's micro-batch list's key ("micro_batches", from the schema table).
absl::string_view MicroBatchesKey();

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_JSON_OUTPUT_H_
