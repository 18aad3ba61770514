#include "server/planner/dynamic_cp_model.h"

#include "server/base/status_macros.h"

namespace packsched::planner {

absl::StatusOr<CpCostModel> CpCostOfModel(const ModelConfig& config,
                                          absl::Span<const int64_t> lengths,
                                          const DynamicCpOptions& options,
                                          const CpModelLinks& links) {
  const int64_t max_cp = options.max_cp == 0 ? options.ranks : options.max_cp;
  ASSIGN_OR_RETURN(const ModelCost mc,
                   CostOfModelForBatch(config, lengths, 2 * max_cp * options.tensor_parallel));
  CpCostModel cost;
  cost.linear = mc.linear;
  cost.quadratic = mc.quadratic;
  cost.micro_batch = mc.micro_batch;
  ASSIGN_OR_RETURN(cost.comm,
                   CpCommWeight(config, mc, links.flops_per_byte, links.bytes_per_element));
  cost.node_ranks = options.cost.node_ranks;
  ASSIGN_OR_RETURN(
      cost.comm_across_nodes,
      CpCommWeight(config, mc, links.flops_per_byte_across_nodes, links.bytes_per_element));
  return cost;
}

absl::StatusOr<CpCostModel> CpCostOfModelFields(
    const absl::flat_hash_map<std::string, int64_t>& ints,
    const absl::flat_hash_map<std::string, std::string>& strings, absl::Span<const int64_t> lengths,
    const DynamicCpOptions& options, const CpModelLinks& links) {
  ASSIGN_OR_RETURN(const ModelConfig config, ModelConfigFromFields(ints, strings));
  return CpCostOfModel(config, lengths, options, links);
}

}  // namespace packsched::planner
