#ifndef PACKSCHED_SERVER_PLANNER_DYNAMIC_CP_MODEL_H_
#define PACKSCHED_SERVER_PLANNER_DYNAMIC_CP_MODEL_H_

// Dynamic context parallelism's cost weights from a model (docs/design.md §2, "Dynamic context
// parallelism"): what `packsched plan --dynamic_cp --model_config`, packsched.dynamic_cp and the
// sidecar share.

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/model_cost.h"

namespace packsched::planner {

// The links a group's keys and values cross, as FLOP-equivalents per byte.
struct CpModelLinks {
  double flops_per_byte = 1000.0;               // within a node (the device's FLOP/s per link B/s)
  double flops_per_byte_across_nodes = 8000.0;  // across nodes
  int64_t bytes_per_element = 2;                // one key or value element (bf16)
};

// The CpCostModel of `config` for the step `lengths` under `options` (its ranks, max_cp,
// tensor_parallel and cost.node_ranks are read): linear, quadratic and micro_batch are
// CostOfModelForBatch's over the lengths aligned to the largest group (2 * max_cp *
// tensor_parallel), comm and comm_across_nodes CpCommWeight's at the two ratios; node_ranks is
// options.cost.node_ranks. InvalidArgument as those say (a length < 1, a ratio negative or not
// finite, bytes_per_element < 1, an overflow).
absl::StatusOr<CpCostModel> CpCostOfModel(const ModelConfig& config,
                                          absl::Span<const int64_t> lengths,
                                          const DynamicCpOptions& options,
                                          const CpModelLinks& links);

// CpCostOfModel of a config.json's top-level integer and string fields (ModelConfigFromFields).
absl::StatusOr<CpCostModel> CpCostOfModelFields(
    const absl::flat_hash_map<std::string, int64_t>& ints,
    const absl::flat_hash_map<std::string, std::string>& strings, absl::Span<const int64_t> lengths,
    const DynamicCpOptions& options, const CpModelLinks& links);

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_DYNAMIC_CP_MODEL_H_
