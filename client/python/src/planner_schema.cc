// packsched._planner's schema(): the X-macro tables of server/planner/schema.h as Python dicts
// (packsched._options, client.py, plan.py, planner.py, tree.py and the schema test read them).

#include "client/python/src/planner_schema.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"
#include "server/planner/schema.h"

namespace py = pybind11;

namespace packsched::planner::python {
namespace {

// The schema table for Python (packsched._options, client.py, plan.py and the schema test):
// one list of dicts per table, in table order. An enum option's `choices` are the planner's
// names in enum order (proto value = index + 1); `default` is the planner's default in Python
// terms (an enum's name). The tree's tables (forest, tree_layout, tree_plan) list name, number
// and kind; tree_entries, never on the wire, lists its names.
template <typename Enum>
py::tuple Choices(Enum /*type*/) {
  py::list names;
  for (int v = 0; Name(static_cast<Enum>(v)) != "unknown"; ++v) {
    names.append(std::string(Name(static_cast<Enum>(v))));
  }
  return py::tuple(names);
}
py::object PyDefault(int64_t v) { return py::int_(v); }
py::object PyDefault(bool v) { return py::bool_(v); }
py::object PyDefault(double v) { return py::float_(v); }
template <typename Enum, typename = std::enable_if_t<std::is_enum_v<Enum>>>
py::object PyDefault(Enum v) {
  return py::str(std::string(Name(v)));
}
py::object EnumChoices(int64_t /*value*/) { return py::none(); }
py::object EnumChoices(bool /*value*/) { return py::none(); }
py::object EnumChoices(double /*value*/) { return py::none(); }
template <typename Enum, typename = std::enable_if_t<std::is_enum_v<Enum>>>
py::object EnumChoices(Enum v) {
  return Choices(v);
}

// Schema() lists every row of every table as a dict, each macro taking the list it appends to.
// The rows
//   X(cap_mode, 2, Enum, CapMode, cap_mode, 3, "tokens ... | padded ...")
//   X(tokens, 2, Int)
// expand, through PACKSCHED_PY_SCHEMA_PLAN and PACKSCHED_PY_SCHEMA_PART, to
//   plan.append(py::dict(py::arg("name") = "cap_mode", py::arg("number") = 2,
//                        py::arg("rule") = "Enum", py::arg("type") = "CapMode",
//                        py::arg("default") = PyDefault(PlanOptions{}.cap_mode),
//                        py::arg("choices") = EnumChoices(PlanOptions{}.cap_mode),
//                        py::arg("json") = 3, py::arg("help") = "tokens ... | padded ..."));
//   parts.append(py::dict(py::arg("name") = "tokens", py::arg("number") = 2,
//                         py::arg("kind") = "Int",
//                         py::arg("default") = PyDefault(MicroBatch{}.tokens)));
#define PACKSCHED_PY_SCHEMA_PLAN_ROW(list, name, number, Rule, Type, member, json, help) \
  (list).append(py::dict(py::arg("name") = #name, py::arg("number") = (number),          \
                         py::arg("rule") = #Rule, py::arg("type") = #Type,               \
                         py::arg("default") = PyDefault(PlanOptions{}.member),           \
                         py::arg("choices") = EnumChoices(PlanOptions{}.member),         \
                         py::arg("json") = (json), py::arg("help") = (help)));
#define PACKSCHED_PY_SCHEMA_PLAN(name, number, Rule, Type, member, json, help) \
  PACKSCHED_PY_SCHEMA_PLAN_ROW(plan, name, number, Rule, Type, member, json, help)
#define PACKSCHED_PY_SCHEMA_ROUND_ROW(list, name, number, dflt)                 \
  (list).append(py::dict(py::arg("name") = #name, py::arg("number") = (number), \
                         py::arg("rule") = "Round", py::arg("default") = PyDefault(dflt)));
#define PACKSCHED_PY_SCHEMA_ROUND(name, number, dflt) \
  PACKSCHED_PY_SCHEMA_ROUND_ROW(round, name, number, dflt)
#define PACKSCHED_PY_SCHEMA_LOSS_ROW(list, name, number, Rule, Type, member, key)                 \
  (list).append(py::dict(py::arg("name") = #name, py::arg("number") = (number),                   \
                         py::arg("rule") = #Rule, py::arg("type") = #Type, py::arg("key") = #key, \
                         py::arg("default") = PyDefault(LossOptions{}.member),                    \
                         py::arg("choices") = EnumChoices(LossOptions{}.member)));
#define PACKSCHED_PY_SCHEMA_LOSS(name, number, Rule, Type, member, key) \
  PACKSCHED_PY_SCHEMA_LOSS_ROW(loss, name, number, Rule, Type, member, key)
#define PACKSCHED_PY_SCHEMA_FIELD(list, name, number, Kind) \
  (list).append(                                            \
      py::dict(py::arg("name") = #name, py::arg("number") = (number), py::arg("kind") = #Kind));
// A micro-batch field's default: the planner's (Int, Bool), none for the others.
#define PACKSCHED_PY_PART_DEFAULT_Int(name) PyDefault(MicroBatch{}.name)
#define PACKSCHED_PY_PART_DEFAULT_Bool(name) PyDefault(MicroBatch{}.name)
#define PACKSCHED_PY_PART_DEFAULT_Ints(name) py::none()
#define PACKSCHED_PY_PART_DEFAULT_LossScale(name) py::none()
#define PACKSCHED_PY_SCHEMA_PART_ROW(list, name, number, Kind)                  \
  (list).append(py::dict(py::arg("name") = #name, py::arg("number") = (number), \
                         py::arg("kind") = #Kind,                               \
                         py::arg("default") = PACKSCHED_PY_PART_DEFAULT_##Kind(name)));
#define PACKSCHED_PY_SCHEMA_PART(name, number, Kind) \
  PACKSCHED_PY_SCHEMA_PART_ROW(parts, name, number, Kind)
#define PACKSCHED_PY_SCHEMA_GLOBAL(name, number, Kind) \
  PACKSCHED_PY_SCHEMA_FIELD(global, name, number, Kind)
#define PACKSCHED_PY_SCHEMA_RESPONSE(name, number, Kind) \
  PACKSCHED_PY_SCHEMA_FIELD(response, name, number, Kind)
#define PACKSCHED_PY_SCHEMA_FOREST(name, number, Kind) \
  PACKSCHED_PY_SCHEMA_FIELD(forest, name, number, Kind)
#define PACKSCHED_PY_SCHEMA_LAYOUT(name, number, Kind) \
  PACKSCHED_PY_SCHEMA_FIELD(layout, name, number, Kind)
#define PACKSCHED_PY_SCHEMA_TREE(name, number, Kind) \
  PACKSCHED_PY_SCHEMA_FIELD(tree, name, number, Kind)
#define PACKSCHED_PY_SCHEMA_ENTRY(name) entries.append(#name);
// A stats field's default: the planner's, 0 for the wire-only ones.
#define PACKSCHED_PY_STATS_DEFAULT_Int(name) PyDefault(PlanStats{}.name)
#define PACKSCHED_PY_STATS_DEFAULT_Double(name) PyDefault(PlanStats{}.name)
#define PACKSCHED_PY_STATS_DEFAULT_LocalK(name) PyDefault(PlanStats{}.name)
#define PACKSCHED_PY_STATS_DEFAULT_Cap(name) py::int_(0)
#define PACKSCHED_PY_STATS_DEFAULT_Micros(name) py::int_(0)
#define PACKSCHED_PY_SCHEMA_STATS_ROW(list, name, number, Kind, alias)          \
  (list).append(py::dict(py::arg("name") = #name, py::arg("number") = (number), \
                         py::arg("kind") = #Kind, py::arg("alias") = #alias,    \
                         py::arg("default") = PACKSCHED_PY_STATS_DEFAULT_##Kind(name)));
#define PACKSCHED_PY_SCHEMA_STATS(name, number, Kind, alias) \
  PACKSCHED_PY_SCHEMA_STATS_ROW(stats, name, number, Kind, alias)

// The dynamic-CP options (PACKSCHED_DYNAMIC_CP_OPTIONS): name, number, rule, type, the CLI flag
// and whose flag it is. The row
//   X(min_cp, 3, Int, int64, min_cp, min_cp, Own, "...")
// expands, through PACKSCHED_PY_SCHEMA_DCP, to
//   dcp.append(py::dict(py::arg("name") = "min_cp", py::arg("number") = 3,
//                       py::arg("rule") = "Int", py::arg("type") = "int64",
//                       py::arg("flag") = "min_cp", py::arg("owner") = "Own"));
#define PACKSCHED_PY_SCHEMA_DCP_ROW(list, name, number, Rule, Type, flag, Owner) \
  (list).append(py::dict(py::arg("name") = #name, py::arg("number") = (number),  \
                         py::arg("rule") = #Rule, py::arg("type") = #Type,       \
                         py::arg("flag") = #flag, py::arg("owner") = #Owner));
#define PACKSCHED_PY_SCHEMA_DCP(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_PY_SCHEMA_DCP_ROW(dcp, name, number, Rule, Type, flag, Owner)

}  // namespace

py::dict Schema() {
  py::dict d;
  py::list plan;
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_PY_SCHEMA_PLAN)
  d["plan_options"] = plan;
  py::list round;
  PACKSCHED_ROUND_OPTIONS(PACKSCHED_PY_SCHEMA_ROUND)
  d["round_options"] = round;
  d["weight_pair"] = PACKSCHED_WEIGHT_PAIR_KEY;
  py::list loss;
  PACKSCHED_LOSS_OPTIONS(PACKSCHED_PY_SCHEMA_LOSS)
  d["loss_options"] = loss;
  py::list parts, stats, global, response;
  PACKSCHED_MICRO_BATCH(PACKSCHED_PY_SCHEMA_PART)
  PACKSCHED_PLAN_STATS(PACKSCHED_PY_SCHEMA_STATS)
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_PY_SCHEMA_GLOBAL)
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_PY_SCHEMA_RESPONSE)
  d["micro_batch"] = parts;
  d["plan_stats"] = stats;
  d["global_counts"] = global;
  d["plan_response"] = response;
  py::list forest, layout, tree, entries;
  PACKSCHED_FOREST(PACKSCHED_PY_SCHEMA_FOREST)
  PACKSCHED_TREE_LAYOUT(PACKSCHED_PY_SCHEMA_LAYOUT)
  PACKSCHED_TREE_PLAN(PACKSCHED_PY_SCHEMA_TREE)
  PACKSCHED_TREE_ENTRIES(PACKSCHED_PY_SCHEMA_ENTRY)
  d["forest"] = forest;
  d["tree_layout"] = layout;
  d["tree_plan"] = tree;
  d["tree_entries"] = entries;
  py::list dcp;
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_PY_SCHEMA_DCP)
  d["dynamic_cp_options"] = dcp;
  return d;
}

}  // namespace packsched::planner::python
