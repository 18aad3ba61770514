#include "client/python/src/plan_columns.h"

#include <pybind11/numpy.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "server/planner/schema.h"

namespace py = pybind11;

namespace packsched::planner::python {
namespace {

// `values` as a numpy array that owns them: the vector moves to the heap, a capsule frees it.
template <typename T>
py::array Adopt(std::vector<T>&& values) {
  auto* owned = new std::vector<T>(std::move(values));
  py::capsule free(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(static_cast<py::ssize_t>(owned->size()), owned->data(), free);
}

// bools as numpy bool_ (one byte each).
py::array AdoptBools(std::vector<uint8_t>&& values) {
  auto* owned = new std::vector<uint8_t>(std::move(values));
  py::capsule free(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
  return py::array(py::dtype::of<bool>(), {static_cast<py::ssize_t>(owned->size())},
                   {static_cast<py::ssize_t>(1)}, owned->data(), free);
}

// Lists end to end with their offsets. With a single list, it is moved, not copied.
template <typename T>
struct Concatenated {
  std::vector<T> values;
  std::vector<int64_t> offsets{0};

  void Add(std::vector<T>&& list) {
    if (offsets.size() == 1) {
      values = std::move(list);
    } else {
      values.insert(values.end(), list.begin(), list.end());
      std::vector<T>().swap(list);
    }
    offsets.push_back(static_cast<int64_t>(values.size()));
  }
  void Into(py::dict& d, const char* name) {
    d[name] = Adopt(std::move(values));
    d[py::str(std::string(name) + "_offsets")] = Adopt(std::move(offsets));
  }
};

}  // namespace

// The micro-batch columns (PACKSCHED_MICRO_BATCH): one member per field, filled part by part,
// then handed to the dict. The row
//   X(tokens, 2, Int)
// expands, through PACKSCHED_PY_COLUMN_*, to
//   std::vector<int64_t> tokens;                                 (the member)
//   tokens.push_back(part.tokens);                               (per part)
//   d["tokens"] = Adopt(std::move(tokens));                      (into the dict)
#define PACKSCHED_PY_COLUMN_MEMBER_Int(name) std::vector<int64_t> name;
#define PACKSCHED_PY_COLUMN_MEMBER_Bool(name) std::vector<uint8_t> name;
#define PACKSCHED_PY_COLUMN_MEMBER_Ints(name) \
  Concatenated<typename decltype(MicroBatch::name)::value_type> name; /* NOLINT: a declarator */
#define PACKSCHED_PY_COLUMN_MEMBER_LossScale(name)
#define PACKSCHED_PY_COLUMN_MEMBER(name, number, Kind) PACKSCHED_PY_COLUMN_MEMBER_##Kind(name)

#define PACKSCHED_PY_COLUMN_ADD_Int(c, part, name) (c).name.push_back((part).name);
#define PACKSCHED_PY_COLUMN_ADD_Bool PACKSCHED_PY_COLUMN_ADD_Int
#define PACKSCHED_PY_COLUMN_ADD_Ints(c, part, name) (c).name.Add(std::move((part).name));
#define PACKSCHED_PY_COLUMN_ADD_LossScale(c, part, name)
#define PACKSCHED_PY_COLUMN_ADD(name, number, Kind) PACKSCHED_PY_COLUMN_ADD_##Kind(c, part, name)

#define PACKSCHED_PY_COLUMN_INTO_Int(c, d, name) (d)[#name] = Adopt(std::move((c).name));
#define PACKSCHED_PY_COLUMN_INTO_Bool(c, d, name) (d)[#name] = AdoptBools(std::move((c).name));
#define PACKSCHED_PY_COLUMN_INTO_Ints(c, d, name) (c).name.Into(d, #name);
#define PACKSCHED_PY_COLUMN_INTO_LossScale(c, d, name)
#define PACKSCHED_PY_COLUMN_INTO(name, number, Kind) PACKSCHED_PY_COLUMN_INTO_##Kind(c, d, name)

struct PartColumns {
  PACKSCHED_MICRO_BATCH(PACKSCHED_PY_COLUMN_MEMBER)
};

// The plan-level index lists (PACKSCHED_PLAN_RESPONSE's Indices rows; the other kinds are not
// lists of a plan), the same way. The row
//   X(reorder, 4, Indices)
// expands to the member `Concatenated<int64_t> reorder;`, per plan
// `reorder.Add(std::move(plan.reorder));`, and into the dict `reorder.Into(d, "reorder");`.
#define PACKSCHED_PY_INDEX_MEMBER_Indices(name) Concatenated<int64_t> name;
#define PACKSCHED_PY_INDEX_ADD_Indices(c, plan, name) (c).name.Add(std::move((plan).name));
#define PACKSCHED_PY_INDEX_INTO_Indices(c, d, name) (c).name.Into(d, #name);
#define PACKSCHED_PY_INDEX_MEMBER(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_PY_INDEX_MEMBER, Kind, Indices)(name)
#define PACKSCHED_PY_INDEX_ADD_ONE(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_PY_INDEX_ADD, Kind, Indices)(c, p, name)
#define PACKSCHED_PY_INDEX_INTO(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_PY_INDEX_INTO, Kind, Indices)(c, d, name)

struct IndexColumns {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_PY_INDEX_MEMBER)
};

// The planner's stats (PACKSCHED_PLAN_STATS' Int, Double and LocalK rows), one value per plan.
#define PACKSCHED_PY_STATS_MEMBER_Int(name) std::vector<int64_t> name;
#define PACKSCHED_PY_STATS_MEMBER_LocalK PACKSCHED_PY_STATS_MEMBER_Int
#define PACKSCHED_PY_STATS_MEMBER_Double(name) std::vector<double> name;
#define PACKSCHED_PY_STATS_MEMBER_Cap(name)
#define PACKSCHED_PY_STATS_MEMBER_Micros(name)
#define PACKSCHED_PY_STATS_MEMBER(name, number, Kind, alias) PACKSCHED_PY_STATS_MEMBER_##Kind(name)
#define PACKSCHED_PY_STATS_ADD_Int(c, s, name) (c).name.push_back((s).name);
#define PACKSCHED_PY_STATS_ADD_LocalK PACKSCHED_PY_STATS_ADD_Int
#define PACKSCHED_PY_STATS_ADD_Double PACKSCHED_PY_STATS_ADD_Int
#define PACKSCHED_PY_STATS_ADD_Cap(c, s, name)
#define PACKSCHED_PY_STATS_ADD_Micros(c, s, name)
#define PACKSCHED_PY_STATS_ADD(name, number, Kind, alias) PACKSCHED_PY_STATS_ADD_##Kind(c, s, name)
#define PACKSCHED_PY_STATS_INTO_Int(c, d, name) (d)[#name] = Adopt(std::move((c).name));
#define PACKSCHED_PY_STATS_INTO_LocalK PACKSCHED_PY_STATS_INTO_Int
#define PACKSCHED_PY_STATS_INTO_Double PACKSCHED_PY_STATS_INTO_Int
#define PACKSCHED_PY_STATS_INTO_Cap(c, d, name)
#define PACKSCHED_PY_STATS_INTO_Micros(c, d, name)
#define PACKSCHED_PY_STATS_INTO(name, number, Kind, alias) \
  PACKSCHED_PY_STATS_INTO_##Kind(c, d, name)

struct StatsColumns {
  PACKSCHED_PLAN_STATS(PACKSCHED_PY_STATS_MEMBER)
};

py::dict PlanColumns(const std::vector<MicroBatchPlan*>& plans) {
  PartColumns parts;
  IndexColumns indices;
  StatsColumns stats;
  std::vector<int64_t> plan_parts{0};
  plan_parts.reserve(plans.size() + 1);
  {
    py::gil_scoped_release release;
    for (MicroBatchPlan* plan : plans) {
      for (MicroBatch& part : plan->parts) {
        PartColumns& c = parts;
        PACKSCHED_MICRO_BATCH(PACKSCHED_PY_COLUMN_ADD)
      }
      plan_parts.push_back(plan_parts.back() + static_cast<int64_t>(plan->parts.size()));
      std::vector<MicroBatch>().swap(plan->parts);
      {
        IndexColumns& c = indices;
        MicroBatchPlan& p = *plan;
        PACKSCHED_PLAN_RESPONSE(PACKSCHED_PY_INDEX_ADD_ONE)
      }
      StatsColumns& c = stats;
      const PlanStats& s = plan->stats;
      PACKSCHED_PLAN_STATS(PACKSCHED_PY_STATS_ADD)
    }
  }
  py::dict d;
  d["plan_parts"] = Adopt(std::move(plan_parts));
  {
    PartColumns& c = parts;
    PACKSCHED_MICRO_BATCH(PACKSCHED_PY_COLUMN_INTO)
  }
  {
    IndexColumns& c = indices;
    PACKSCHED_PLAN_RESPONSE(PACKSCHED_PY_INDEX_INTO)
  }
  py::dict stats_dict;
  {
    StatsColumns& c = stats;
    py::dict& d = stats_dict;
    PACKSCHED_PLAN_STATS(PACKSCHED_PY_STATS_INTO)
  }
  d["stats"] = stats_dict;
  return d;
}

}  // namespace packsched::planner::python
