// The binding of PlanDynamicCp: plain dicts and lists in and out; errors raise ValueError with the
// planner's message.

#include "client/python/src/dynamic_cp_module.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/dynamic_cp_model.h"
#include "server/planner/loss_weights.h"

namespace py = pybind11;

namespace packsched::planner::python {
namespace {

template <typename T>
T Value(absl::StatusOr<T> r) {
  if (!r.ok()) throw py::value_error(std::string(r.status().message()));
  return *std::move(r);
}

// The cost weights from a model's config fields (CpCostOfModelFields).
CpCostModel ModelWeights(const std::vector<int64_t>& lengths, const DynamicCpOptions& o,
                         const std::map<std::string, int64_t>& ints,
                         const std::map<std::string, std::string>& strings, double flops_per_byte,
                         double flops_per_byte_across_nodes, int64_t node_ranks,
                         int64_t bytes_per_element) {
  const absl::flat_hash_map<std::string, int64_t> i(ints.begin(), ints.end());
  const absl::flat_hash_map<std::string, std::string> s(strings.begin(), strings.end());
  DynamicCpOptions with_nodes = o;
  with_nodes.cost.node_ranks = node_ranks;
  return Value(CpCostOfModelFields(
      i, s, lengths, with_nodes,
      CpModelLinks{flops_per_byte, flops_per_byte_across_nodes, bytes_per_element}));
}

py::dict ToDict(const DynamicCpPlan& plan) {
  py::list slots;
  for (const CpSlotPlan& slot : plan.slots) {
    py::list groups;
    for (const CpGroupPlan& g : slot.groups) {
      py::dict d;
      d["first_rank"] = g.first_rank;
      d["size"] = g.size;
      d["name"] = g.name;
      d["sequences"] = g.sequences;
      d["cu_seqlens"] = g.cu_seqlens;
      d["tokens_per_rank"] = g.tokens_per_rank;
      d["cost"] = g.cost;
      groups.append(std::move(d));
    }
    py::dict s;
    s["groups"] = std::move(groups);
    s["cost"] = slot.cost;
    slots.append(std::move(s));
  }
  py::dict d;
  d["slots"] = std::move(slots);
  d["group_names"] = plan.group_names;
  d["cp_of_sequence"] = plan.cp_of_sequence;
  d["slot_of_sequence"] = plan.slot_of_sequence;
  d["step_cost"] = plan.step_cost;
  d["lower_bound"] = plan.lower_bound;
  d["comm_tokens"] = plan.comm_tokens;
  return d;
}

}  // namespace

void AddDynamicCp(py::module_& m) {
  m.def(
      "dynamic_cp",
      [](const std::vector<int64_t>& lengths, const py::dict& options, const py::object& cost,
         const py::object& model, const py::object& loss) {
        DynamicCpOptions o;
        o.ranks = options["ranks"].cast<int64_t>();
        o.max_tokens_per_rank = options["max_tokens_per_rank"].cast<int64_t>();
        o.sizes = Value(ParseCpSizeRule(options["sizes"].cast<std::string>()));
        o.min_cp = options["min_cp"].cast<int64_t>();
        o.max_cp = options["max_cp"].cast<int64_t>();
        o.tensor_parallel = options["tensor_parallel"].cast<int64_t>();
        o.divisible_by = options["divisible_by"].cast<int64_t>();
        if (!model.is_none()) {
          const py::dict md = model.cast<py::dict>();
          Value(PlanDynamicCp({}, o));  // a bad option's own error before the model's
          o.cost = ModelWeights(
              lengths, o, md["ints"].cast<std::map<std::string, int64_t>>(),
              md["strings"].cast<std::map<std::string, std::string>>(),
              md["flops_per_byte"].cast<double>(), md["flops_per_byte_across_nodes"].cast<double>(),
              md["node_ranks"].cast<int64_t>(), md["bytes_per_element"].cast<int64_t>());
        } else {
          const auto w = cost.cast<std::vector<int64_t>>();
          if (w.size() != 6) {
            throw py::value_error(
                "cost must be (linear, quadratic, comm, micro_batch, node_ranks, "
                "comm_across_nodes)");
          }
          o.cost = {w[0], w[1], w[2], w[3], w[4], w[5]};
        }
        absl::StatusOr<DynamicCpPlan> plan;
        {
          py::gil_scoped_release release;
          plan = PlanDynamicCp(lengths, o);
        }
        py::dict d = ToDict(Value(std::move(plan)));
        d["cost_model"] =
            std::vector<int64_t>{o.cost.linear,      o.cost.quadratic,  o.cost.comm,
                                 o.cost.micro_batch, o.cost.node_ranks, o.cost.comm_across_nodes};
        if (!loss.is_none()) {
          const py::dict ld = loss.cast<py::dict>();
          LossOptions lo;
          lo.mode = Value(ParseLossMode(ld["loss_mode"].cast<std::string>()));
          lo.dp_reduction = Value(ParseDpReduction(ld["dp_reduction"].cast<std::string>()));
          lo.sum_norm_constant = ld["sum_norm_constant"].cast<double>();
          const auto tokens = ld["loss_tokens"].cast<std::vector<int64_t>>();
          if (tokens.size() != lengths.size()) {
            throw py::value_error("loss_tokens must hold one count per sequence");
          }
          d["loss_weights"] = Value(DynamicCpLossWeights(tokens, lo, o.ranks));
        }
        return d;
      },
      py::arg("lengths"), py::arg("options"), py::arg("cost") = py::none(),
      py::arg("model") = py::none(), py::arg("loss") = py::none(),
      "The dynamic context-parallel plan of one step (server/planner/dynamic_cp.h).");
}

}  // namespace packsched::planner::python
