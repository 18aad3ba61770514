// packsched._planner: the pybind11 layer under packsched/planner.py — the planner in-process,
// no sidecar. It converts the Python keyword options (already normalised by packsched/_options.py)
// into planner::PlanOptions with the same parsers the CLI and the sidecar use, runs the planner,
// and returns plain dicts and lists that packsched.plan.Plan wraps. Errors raise ValueError with
// the planner's message (the text the sidecar would send as INVALID_ARGUMENT).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/python/src/dynamic_cp_module.h"
#include "client/python/src/plan_columns.h"
#include "client/python/src/planner_schema.h"
#include "server/planner/loss_weights.h"
#include "server/planner/model_cost.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"
#include "server/planner/schema.h"
#include "server/planner/tree_plan.h"

namespace py = pybind11;

namespace packsched::planner {
namespace {

using Lengths = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

void Check(const absl::Status& s) {
  if (!s.ok()) throw py::value_error(std::string(s.message()));
}

template <typename T>
T Value(absl::StatusOr<T> r) {
  Check(r.status());
  return *std::move(r);
}

absl::Span<const int64_t> Span(const Lengths& a) {
  return absl::MakeConstSpan(a.data(), static_cast<size_t>(a.size()));
}

std::string Str(const py::dict& d, const char* key) { return d[key].cast<std::string>(); }
int64_t Int(const py::dict& d, const char* key) { return d[key].cast<int64_t>(); }

// The conversions below expand the schema table (server/planner/schema.h): dict keys are the
// table's names, so the Python side (packsched._options, packsched.plan) reads the same names
// from schema() below.

// The dict `d` into the options `o` (PACKSCHED_PLAN_OPTIONS): `d` holds every key of
// packsched._options.PLAN_DEFAULTS (the Python side fills defaults); the Weight options come
// from the pair (a, b) under PACKSCHED_WEIGHT_PAIR_KEY, `next` counting them. The row
//   X(cap_mode, 2, Enum, CapMode, cap_mode, 3, "tokens ... | padded ...")
// expands, through PACKSCHED_PY_OPTION, to
//   o.cap_mode = Value(ParseCapMode(Str(d, "cap_mode")));
#define PACKSCHED_PY_OPTION_Cap(o, d, pair, next, name, Type, member) \
  (o).member = (d)[#name].is_none() ? 0 : Int(d, #name);
#define PACKSCHED_PY_OPTION_Unlimited PACKSCHED_PY_OPTION_Cap
#define PACKSCHED_PY_OPTION_Count(o, d, pair, next, name, Type, member) (o).member = Int(d, #name);
#define PACKSCHED_PY_OPTION_Align PACKSCHED_PY_OPTION_Count
#define PACKSCHED_PY_OPTION_Ceiling PACKSCHED_PY_OPTION_Count
#define PACKSCHED_PY_OPTION_FixedK(o, d, pair, next, name, Type, member) \
  (o).member = (d)[#name].cast<bool>();
#define PACKSCHED_PY_OPTION_Enum(o, d, pair, next, name, Type, member) \
  (o).member = Value(Parse##Type(Str(d, #name)));
#define PACKSCHED_PY_OPTION_Weight(o, d, pair, next, name, Type, member) \
  if (!(pair).is_none()) (o).member = (pair).cast<py::sequence>()[(next)++].cast<int64_t>();
#define PACKSCHED_PY_OPTION(name, number, Rule, Type, member, json, help) \
  PACKSCHED_PY_OPTION_##Rule(o, d, pair, next, name, Type, member)

PlanOptions ToPlanOptions(const py::dict& d) {
  PlanOptions o;
  const py::object pair = d[PACKSCHED_WEIGHT_PAIR_KEY];  // (a, b) of the Weight options, or None
  size_t next = 0;
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_PY_OPTION)
  return o;
}

// Python ints for the values 0..n (n: the batch's sequences), made on first use and shared by
// every list of the answer: a plan of n sequences lists about 5n integers (indices, reorder,
// revert, two prefix sums per micro-batch) whose values are mostly below n, so sharing one object
// per value instead of one per entry roughly halves the answer's memory and its conversion time
// on 10^6 sequences. Values outside 0..n get their own object.
class IntCache {
 public:
  explicit IntCache(int64_t n) : ints_(static_cast<size_t>(n < 0 ? 0 : n) + 1) {}

  template <typename Int>
  py::list List(const std::vector<Int>& values) {
    py::list out(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), New(values[i]));
    }
    return out;
  }

 private:
  // A new reference to the int `v`.
  PyObject* New(int64_t v) {
    if (v < 0 || static_cast<uint64_t>(v) >= ints_.size()) {
      PyObject* fresh = PyLong_FromLongLong(v);
      if (fresh == nullptr) throw py::error_already_set();
      return fresh;
    }
    py::object& slot = ints_[static_cast<size_t>(v)];
    if (!slot) slot = py::int_(v);
    return slot.inc_ref().ptr();
  }

  std::vector<py::object> ints_;
};

// A micro-batch (PACKSCHED_MICRO_BATCH) as the dict `d` of every MicroBatchMeta field
// (packsched.plan adopts it as the instance's attributes), its lists through the IntCache `ints`;
// loss_scale is None here, set by the caller when the plan has weights. The row
//   X(indices, 1, Ints)
// expands, through PACKSCHED_PY_PART, to
//   d["indices"] = ints.List(part.indices);
#define PACKSCHED_PY_PART_Int(d, part, ints, name) (d)[#name] = (part).name;
#define PACKSCHED_PY_PART_Ints(d, part, ints, name) (d)[#name] = (ints).List((part).name);
#define PACKSCHED_PY_PART_Bool PACKSCHED_PY_PART_Int
#define PACKSCHED_PY_PART_LossScale(d, part, ints, name) (d)[#name] = py::none();
#define PACKSCHED_PY_PART(name, number, Kind) PACKSCHED_PY_PART_##Kind(d, part, ints, name)

py::dict ToDict(const MicroBatch& part, IntCache& ints) {
  py::dict d;
  PACKSCHED_MICRO_BATCH(PACKSCHED_PY_PART)
  return d;
}

// The planner's stats (PACKSCHED_PLAN_STATS; the wire-only Cap and Micros are not the planner's:
// nothing to write) into the dict `d`. The row
//   X(imbalance, 7, Double, _)
// expands, through PACKSCHED_PY_STATS, to
//   d["imbalance"] = s.imbalance;
#define PACKSCHED_PY_STATS_Int(d, s, name) (d)[#name] = (s).name;
#define PACKSCHED_PY_STATS_Double PACKSCHED_PY_STATS_Int
#define PACKSCHED_PY_STATS_LocalK PACKSCHED_PY_STATS_Int
#define PACKSCHED_PY_STATS(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_PY_STATS, Kind, Cap, Micros)(d, s, name)

py::dict ToDict(const PlanStats& s) {
  py::dict d;
  PACKSCHED_PLAN_STATS(PACKSCHED_PY_STATS)
  return d;
}

// A plan's index lists and stats (PACKSCHED_PLAN_RESPONSE) into the dict `d`, the lists through
// the IntCache `ints`; its micro-batches go under "parts", and the counts, loss weights and
// global counts are not the plan's (nothing to write), and forest_plan adds a tree's layout.
// The row
//   X(reorder, 4, Indices)
// expands, through PACKSCHED_PY_PLAN, to
//   d["reorder"] = ints.List(plan.reorder);
#define PACKSCHED_PY_PLAN_Indices(d, plan, ints, name) (d)[#name] = (ints).List((plan).name);
#define PACKSCHED_PY_PLAN_Stats(d, plan, ints, name) (d)[#name] = ToDict((plan).name);
#define PACKSCHED_PY_PLAN(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_PY_PLAN, Kind, Indices, Stats)(d, plan, ints, name)

py::dict ToDict(const MicroBatchPlan& plan, IntCache& ints) {
  py::dict d;
  py::list parts(plan.parts.size());
  for (size_t i = 0; i < plan.parts.size(); ++i) parts[i] = ToDict(plan.parts[i], ints);
  d["parts"] = parts;
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_PY_PLAN)
  return d;
}

// Runs `fn` with the GIL released: planning a large batch takes milliseconds to seconds. Then
// (with glibc) gives the planner's freed scratch memory back to the system: the Python objects of
// the answer come from Python's own allocator, which cannot reuse it (on 10^6 sequences the
// process's peak memory drops by about a third).
template <typename Fn>
auto WithoutGil(Fn&& fn) {
  py::gil_scoped_release release;
  auto result = fn();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  return result;
}

// The dict `d` into the loss options `o` (PACKSCHED_LOSS_OPTIONS), keyed by each option's Python
// keyword (the table's `key`). The row
//   X(mode, 1, Enum, LossMode, mode, loss_mode)
// expands, through PACKSCHED_PY_LOSS, to
//   o.mode = Value(ParseLossMode(Str(d, "loss_mode")));
#define PACKSCHED_PY_LOSS_Enum(o, d, Type, member, key) \
  (o).member = Value(Parse##Type(Str(d, #key)));
#define PACKSCHED_PY_LOSS_SumNorm(o, d, Type, member, key) (o).member = (d)[#key].cast<double>();
#define PACKSCHED_PY_LOSS(name, number, Rule, Type, member, key) \
  PACKSCHED_PY_LOSS_##Rule(o, d, Type, member, key)

LossOptions ToLossOptions(const py::dict& d) {
  LossOptions o;
  PACKSCHED_LOSS_OPTIONS(PACKSCHED_PY_LOSS)
  return o;
}

// LossCounts <-> Python's (loss tokens, sequences with loss): the Loss rows of GlobalCounts in
// table order (Kept and World are not loss counts: nothing to do). The row
//   X(loss_tokens, 2, Loss)
// expands, through PACKSCHED_PY_COUNTS and PACKSCHED_PY_FROM_COUNTS, to
//   out.append(c.loss_tokens);
//   c.loss_tokens = values[next++].cast<int64_t>();
#define PACKSCHED_PY_COUNTS_Loss(out, c, name) (out).append((c).name);
#define PACKSCHED_PY_COUNTS(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_PY_COUNTS, Kind, Loss)(out, c, name)

py::tuple ToTuple(const LossCounts& c) {
  py::list out;
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_PY_COUNTS)
  return py::tuple(out);
}

#define PACKSCHED_PY_FROM_COUNTS_Loss(c, values, next, name) \
  (c).name = (values)[(next)++].cast<int64_t>();
#define PACKSCHED_PY_FROM_COUNTS(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_PY_FROM_COUNTS, Kind, Loss)(c, values, next, name)

LossCounts ToLossCounts(const py::sequence& values) {
  LossCounts c;
  size_t next = 0;
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_PY_FROM_COUNTS)
  return c;
}

// Loss counts over the kept sequences (all but `dropped`), before any plan exists.
LossCounts LocalCounts(int64_t n, const std::vector<int64_t>& dropped,
                       const std::vector<int64_t>& loss_tokens) {
  MicroBatchPlan kept;  // CountLoss reads only reorder (the kept indices) and revert's size
  kept.revert.assign(static_cast<size_t>(n), 0);
  size_t next_dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (next_dropped < dropped.size() && dropped[next_dropped] == i) {
      ++next_dropped;
    } else {
      kept.reorder.push_back(i);
    }
  }
  return Value(CountLoss(kept, loss_tokens));
}

// Adds loss_weights, loss_scales and loss_counts (this rank's) to the plan dict `out` (and the
// loss-bearing tokens to its stats, when it has them). Without `global_counts` the round is this
// rank alone (its own counts are the global ones). Returns the loss-bearing tokens.
int64_t AddLossWeights(const MicroBatchPlan& plan, const py::dict& loss, py::dict& out) {
  const auto loss_tokens = loss["loss_tokens"].cast<std::vector<int64_t>>();
  const LossCounts local = Value(CountLoss(plan, loss_tokens));
  LossCounts global = local;
  if (!loss["global_counts"].is_none()) {
    global = ToLossCounts(loss["global_counts"].cast<py::sequence>());
  }
  const LossWeights w = Value(ComputeLossWeights(plan, loss_tokens, ToLossOptions(loss), global,
                                                 loss["world_size"].cast<int64_t>()));
  out[py::str(std::string(schema::ResponseNamed("Weights")))] = w.weights;
  out["loss_scales"] = w.loss_scales;
  out["loss_counts"] = ToTuple(local);
  if (out.contains("stats")) out["stats"].cast<py::dict>()["loss_tokens"] = w.loss_tokens;
  return w.loss_tokens;
}

// This rank's bound before agreement (packsched.planner.Bound's fields) of a Problem or a
// TreeProblem, with its loss counts when `loss_tokens` (one per sequence or rollout) are given.
template <typename P>
py::dict BoundDict(const P& problem, const py::object& loss_tokens) {
  py::dict d;
  d["k"] = problem.local_k();
  d["lower_bound_k"] = problem.lower_bound_k();
  d["num_sequences"] = problem.num_sequences();
  d["num_kept"] = problem.num_kept();
  d["total_tokens"] = problem.total_tokens();
  d["dropped"] = problem.dropped();
  if (!loss_tokens.is_none()) {
    const LossCounts c = LocalCounts(problem.num_sequences(), problem.dropped(),
                                     loss_tokens.cast<std::vector<int64_t>>());
    d["loss_counts"] = ToTuple(c);
  }
  return d;
}

// The plan for one rank: kk/lpt balance into the smallest feasible k (or exactly `k` when given);
// ffd/bfd/sequential pack a dataset into as many bins as needed (as `packsched plan` does).
MicroBatchPlan PlanOne(const Lengths& lengths, const PlanOptions& options, int64_t k) {
  const auto span = Span(lengths);
  return WithoutGil([&] {
    if (k > 0) return Value(PartitionFixedK(span, k, options));
    switch (options.algorithm) {
      case Algorithm::kKarmarkarKarp:
      case Algorithm::kLpt:
        return Value(PlanMicroBatches(span, options));
      default:
        return Value(PackDataset(span, options));
    }
  });
}

py::dict ToDict(const StepStats& s) {
  py::dict step;
  step["step_sync_cost"] = s.step_sync_cost;
  step["micro_batch_sync_cost"] = s.micro_batch_sync_cost;
  step["ideal"] = s.ideal;
  step["efficiency"] = s.efficiency;
  step["lower_bound"] = s.lower_bound;
  step["lower_bound_efficiency"] = s.lower_bound_efficiency;
  return step;
}

// An array of the forest or of a layout into the planner's member; an optional one (the
// Checked rollout lengths) may be None.
void Assign(std::vector<int64_t>* out, const Lengths& values) {
  out->assign(values.data(), values.data() + values.size());
}
void Assign(std::vector<int64_t>* out, const py::object& values) {
  if (!values.is_none()) *out = values.cast<std::vector<int64_t>>();
}

// A forest from the arrays packsched.tree.Forest holds (PACKSCHED_FOREST; the Checked one may
// be None). The row
//   X(node_len, 1, Nodes)
// expands, through PACKSCHED_PY_FOREST, to
//   Assign(&f.node_len, node_len);
// and to the keywords py::arg("node_len"), ...: through PACKSCHED_PY_ARG every row, through
// PACKSCHED_PY_REQUIRED_ARG the required ones (the layout's functions take no rollout_len).
#define PACKSCHED_PY_FOREST(name, number, Kind) Assign(&f.name, name);
#define PACKSCHED_PY_ARG(name, number, Kind) py::arg(#name),
#define PACKSCHED_PY_REQUIRED_ARG_Nodes(name) py::arg(#name),
#define PACKSCHED_PY_REQUIRED_ARG_Rollouts(name) py::arg(#name),
#define PACKSCHED_PY_REQUIRED_ARG(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_PY_REQUIRED_ARG, Kind, Checked)(name)
#define PACKSCHED_PY_LAYOUT_ARG(name, number, Kind) py::arg(#name),

Forest ToForest(const Lengths& node_len, const Lengths& node_parent, const Lengths& rollout_leaf,
                const py::object& rollout_len) {
  Forest f;
  PACKSCHED_FOREST(PACKSCHED_PY_FOREST)
  return f;
}

py::array_t<int64_t> Array(const std::vector<int64_t>& v) {
  return py::array_t<int64_t>(static_cast<py::ssize_t>(v.size()), v.data());
}

// A tree plan as the dict packsched.tree.TreePlan.from_raw reads: "parts" (each micro-batch's
// "batch" and its layout, PACKSCHED_TREE_LAYOUT), the plan's figures (PACKSCHED_TREE_PLAN; the
// layouts are the parts'), its stats and loss weights. The rows
//   X(rollouts, 7, Ints)   X(forwarded_tokens, 3, Int)
// expand, through PACKSCHED_PY_LAYOUT and PACKSCHED_PY_TREE, to
//   p["rollouts"] = Array(l.rollouts);
//   d["forwarded_tokens"] = plan.forwarded_tokens;
#define PACKSCHED_PY_LAYOUT(name, number, Kind) p[#name] = Array(l.name);
#define PACKSCHED_PY_TREE_Ints(d, plan, name) (d)[#name] = Array((plan).name);
#define PACKSCHED_PY_TREE_Int(d, plan, name) (d)[#name] = (plan).name;
#define PACKSCHED_PY_TREE(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_PY_TREE, Kind, Layouts)(d, plan, name)

py::dict ToDict(const TreePlan& plan, const ForestIndex& index, const py::object& loss) {
  py::dict d;
  py::list parts;
  IntCache ints(static_cast<int64_t>(index.rollout_len.size()));
  for (const TreeMicroBatch& part : plan.parts) {
    py::dict p;
    p["batch"] = ToDict(part.batch, ints);
    const TreeLayout& l = part.layout;
    PACKSCHED_TREE_LAYOUT(PACKSCHED_PY_LAYOUT)
    parts.append(p);
  }
  d["parts"] = parts;
  d["dropped"] = plan.dropped;
  PACKSCHED_TREE_PLAN(PACKSCHED_PY_TREE)
  d["stats"] = ToDict(plan.stats);
  d["num_rollouts"] = plan.num_rollouts;
  if (!loss.is_none()) AddLossWeights(RolloutView(plan, index), loss.cast<py::dict>(), d);
  return d;
}

// A micro-batch's layout as packsched.tree.TreeMicroBatch holds it, checked against the forest
// (ValueError naming the field) so that Entries' preconditions hold for any arrays given.
struct LayoutInput {
  MicroBatch batch;
  TreeLayout layout;
};

#define PACKSCHED_PY_TO_LAYOUT(name, number, Kind) Assign(&l.name, name);
LayoutInput ToLayout(const Lengths& rollout_leaf, const std::vector<int64_t>& cu_seqlens_aligned,
                     const Lengths& rollouts, const Lengths& piece_rollouts,
                     const Lengths& piece_rollout_begin) {
  LayoutInput in;
  in.batch.cu_seqlens_aligned.assign(cu_seqlens_aligned.begin(), cu_seqlens_aligned.end());
  TreeLayout& l = in.layout;
  PACKSCHED_TREE_LAYOUT(PACKSCHED_PY_TO_LAYOUT)
  const int64_t r = rollout_leaf.size();
  const auto& begin = l.piece_rollout_begin;
  if (begin.size() != in.batch.cu_seqlens_aligned.size() || begin.empty() || begin[0] != 0 ||
      begin.back() != static_cast<int64_t>(l.piece_rollouts.size()) ||
      !std::is_sorted(begin.begin(), begin.end())) {
    throw py::value_error(
        "tree layout: piece_rollout_begin must rise from 0 to len(piece_rollouts), one more "
        "entry than the pieces");
  }
  if (!std::is_sorted(l.rollouts.begin(), l.rollouts.end()) ||
      l.rollouts.size() != l.piece_rollouts.size()) {
    throw py::value_error("tree layout: rollouts must be piece_rollouts in ascending order");
  }
  for (const int64_t x : l.piece_rollouts) {
    if (x < 0 || x >= r || !std::binary_search(l.rollouts.begin(), l.rollouts.end(), x)) {
      throw py::value_error("tree layout: rollout " + std::to_string(x) +
                            " is not a rollout of the forest held in rollouts");
    }
  }
  return in;
}

// The entries (PACKSCHED_TREE_ENTRIES) as a dict of int64 arrays: X(row) expands, through
// PACKSCHED_PY_ENTRY, to d["row"] = Array(e.row);
#define PACKSCHED_PY_ENTRY(name) d[#name] = Array(e.name);
py::dict EntriesDict(const TreeEntries& e) {
  py::dict d;
  PACKSCHED_TREE_ENTRIES(PACKSCHED_PY_ENTRY)
  return d;
}

// The cost from the model (server/planner/model_cost.h) for `input`, lengths or a forest:
// sets `o` to the model's weights and returns the per-micro-batch cost. Raises as Value().
template <typename Input>
int64_t CostFromModel(const std::map<std::string, int64_t>& ints,
                      const std::map<std::string, std::string>& strings, const Input& input,
                      PlanOptions& o) {
  const absl::flat_hash_map<std::string, int64_t> i(ints.begin(), ints.end());
  const absl::flat_hash_map<std::string, std::string> s(strings.begin(), strings.end());
  return Value(UseModelCost(i, s, input, o));
}

// The tree plan for one rank, as PlanOne plans sequences.
TreePlan PlanOneForest(const Forest& forest, const PlanOptions& options, int64_t k) {
  return WithoutGil([&] {
    if (k > 0) return Value(PartitionForestFixedK(forest, k, options));
    switch (options.algorithm) {
      case Algorithm::kKarmarkarKarp:
      case Algorithm::kLpt:
        return Value(PlanForest(forest, options));
      default:
        return Value(PackForest(forest, options));
    }
  });
}

// A balanced batch (RankBatch ranks or a forest's TreePlan ranks, already converted) as the dict
// packsched.planner.balance reads.
template <typename Balanced>
py::dict BalanceDict(const py::list& ranks, const Balanced& b) {
  py::dict d;
  d["ranks"] = ranks;
  d["num_micro_batches"] = b.num_micro_batches;
  d["dropped"] = b.dropped;
  d["step"] = ToDict(b.step);
  return d;
}

PYBIND11_MODULE(_planner, m) {
  m.doc() = "Low-level bindings of the packsched planner; use packsched.planner instead.";
  python::AddDynamicCp(m);

  m.def("schema", &python::Schema,
        "The plan / options schema table (server/planner/schema.h), one list of field dicts "
        "per table.");

  m.def(
      "plan",
      [](const Lengths& lengths, const py::dict& options, int64_t k, const py::object& loss) {
        const MicroBatchPlan plan = PlanOne(lengths, ToPlanOptions(options), k);
        IntCache ints(lengths.size());
        py::dict d = ToDict(plan, ints);
        if (!loss.is_none()) AddLossWeights(plan, loss.cast<py::dict>(), d);
        return d;
      },
      py::arg("lengths"), py::arg("options"), py::arg("k") = 0, py::arg("loss") = py::none(),
      "Plans one rank's sequences; k > 0 partitions into exactly k parts. `loss` (a dict of "
      "packsched._options.LOSS_DEFAULTS' keys, global_counts and world_size) adds the loss "
      "weights, loss_scales and loss_counts.");

  m.def(
      "plan_columns",
      [](const Lengths& lengths, const py::dict& options, int64_t k, const py::object& loss) {
        MicroBatchPlan plan = PlanOne(lengths, ToPlanOptions(options), k);
        py::dict loss_dict;
        if (!loss.is_none()) {
          plan.stats.loss_tokens = AddLossWeights(plan, loss.cast<py::dict>(), loss_dict);
        }
        py::dict d = python::PlanColumns({&plan});
        for (const auto& [key, value] : loss_dict) d[key] = value;
        return d;
      },
      py::arg("lengths"), py::arg("options"), py::arg("k") = 0, py::arg("loss") = py::none(),
      "plan() with the plan as numpy columns (client/python/src/plan_columns.h) and the loss "
      "weights' keys as plan() gives them.");

  m.def(
      "planner_seconds",
      [](const Lengths& lengths, const py::dict& options, int64_t k, int64_t world_size,
         const std::string& sync) {
        const PlanOptions o = ToPlanOptions(options);
        const BalanceOptions balance{Value(ParseSync(sync)), 0, /*stop=*/{}};
        const auto span = Span(lengths);
        py::gil_scoped_release release;
        const auto start = std::chrono::steady_clock::now();
        if (world_size > 0) {
          Check(BalanceBatch(span, world_size, o, {}, balance).status());
        } else if (k > 0) {
          Check(PartitionFixedK(span, k, o).status());
        } else {
          Check(PlanMicroBatches(span, o).status());
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      py::arg("lengths"), py::arg("options"), py::arg("k") = 0, py::arg("world_size") = 0,
      py::arg("sync") = "step",
      "Seconds the planner itself takes (no conversion): BalanceBatch with world_size > 0, else "
      "PartitionFixedK with k > 0, else PlanMicroBatches. For benchmarks.");

  m.def(
      "local_bound",
      [](const Lengths& lengths, const py::dict& options, const py::object& loss_tokens) {
        const PlanOptions o = ToPlanOptions(options);
        Problem problem = WithoutGil([&] { return Value(Problem::Create(Span(lengths), o)); });
        return BoundDict(problem, loss_tokens);
      },
      py::arg("lengths"), py::arg("options"), py::arg("loss_tokens") = py::none());

  m.def(
      "model_cost",
      [](const std::map<std::string, int64_t>& ints,
         const std::map<std::string, std::string>& strings, int64_t max_batch_tokens,
         int64_t longest, int64_t overhead_tokens) {
        const absl::flat_hash_map<std::string, int64_t> i(ints.begin(), ints.end());
        const absl::flat_hash_map<std::string, std::string> s(strings.begin(), strings.end());
        const ModelConfig config = Value(ModelConfigFromFields(i, s));
        const ModelCost c = Value(CostOfModel(config, max_batch_tokens, longest, overhead_tokens));
        return py::make_tuple(c.linear, c.quadratic, c.micro_batch, c.shift, c.windowed, c.window,
                              c.chunked, c.chunk);
      },
      "(linear, quadratic, micro_batch, shift, windowed, window, chunked, chunk) of a model's "
      "config.json fields (server/planner/model_cost.h)",
      py::arg("ints"), py::arg("strings"), py::arg("max_batch_tokens"), py::arg("longest"),
      py::arg("overhead_tokens") = 2048);

  m.def(
      "balance",
      [](const Lengths& lengths, int64_t world_size, const py::dict& options,
         const std::vector<int64_t>& group_ids, const std::string& sync, int64_t micro_batch_cost,
         const std::optional<std::map<std::string, int64_t>>& model_ints,
         const std::map<std::string, std::string>& model_strings) {
        PlanOptions o = ToPlanOptions(options);
        BalanceOptions balance{Value(ParseSync(sync)), micro_batch_cost, /*stop=*/{}};
        if (model_ints) {
          balance.micro_batch_cost = CostFromModel(*model_ints, model_strings, Span(lengths), o);
        }
        BalancedBatch b = WithoutGil(
            [&] { return Value(BalanceBatch(Span(lengths), world_size, o, group_ids, balance)); });
        IntCache ints(lengths.size());
        py::list ranks;
        for (const RankBatch& rank : b.ranks) {
          py::dict r;
          r["indices"] = ints.List(rank.indices);
          r["cost"] = rank.cost;
          r["plan"] = ToDict(rank.plan, ints);
          ranks.append(r);
        }
        return BalanceDict(ranks, b);
      },
      py::arg("lengths"), py::arg("world_size"), py::arg("options"), py::arg("group_ids"),
      py::arg("sync") = "step", py::arg("micro_batch_cost") = 0, py::arg("model_ints") = py::none(),
      py::arg("model_strings") = std::map<std::string, std::string>());
  m.def(
      "balance_columns",
      [](const Lengths& lengths, int64_t world_size, const py::dict& options,
         const std::vector<int64_t>& group_ids, const std::string& sync, int64_t micro_batch_cost,
         const std::optional<std::map<std::string, int64_t>>& model_ints,
         const std::map<std::string, std::string>& model_strings) {
        PlanOptions o = ToPlanOptions(options);
        BalanceOptions balance{Value(ParseSync(sync)), micro_batch_cost, /*stop=*/{}};
        if (model_ints) {
          balance.micro_batch_cost = CostFromModel(*model_ints, model_strings, Span(lengths), o);
        }
        BalancedBatch b = WithoutGil(
            [&] { return Value(BalanceBatch(Span(lengths), world_size, o, group_ids, balance)); });
        std::vector<MicroBatchPlan*> plans;
        plans.reserve(b.ranks.size());
        std::vector<int64_t> rank_indices, rank_offsets{0}, rank_cost;
        rank_offsets.reserve(b.ranks.size() + 1);
        rank_cost.reserve(b.ranks.size());
        for (RankBatch& rank : b.ranks) {
          plans.push_back(&rank.plan);
          rank_indices.insert(rank_indices.end(), rank.indices.begin(), rank.indices.end());
          rank_offsets.push_back(static_cast<int64_t>(rank_indices.size()));
          rank_cost.push_back(rank.cost);
        }
        py::dict d = python::PlanColumns(plans);
        d["rank_indices"] = Array(rank_indices);
        d["rank_indices_offsets"] = Array(rank_offsets);
        d["rank_cost"] = Array(rank_cost);
        d["num_micro_batches"] = b.num_micro_batches;
        d["batch_dropped"] = b.dropped;
        d["step"] = ToDict(b.step);
        return d;
      },
      py::arg("lengths"), py::arg("world_size"), py::arg("options"), py::arg("group_ids"),
      py::arg("sync") = "step", py::arg("micro_batch_cost") = 0, py::arg("model_ints") = py::none(),
      py::arg("model_strings") = std::map<std::string, std::string>(),
      "balance() with the ranks' plans as numpy columns (client/python/src/plan_columns.h) and "
      "rank_indices (+ _offsets), rank_cost and batch_dropped beside them.");

  m.def(
      "forest_plan",
      [](const Lengths& node_len, const Lengths& node_parent, const Lengths& rollout_leaf,
         const py::object& rollout_len, const py::dict& options, int64_t k,
         const py::object& loss) {
        const Forest forest = ToForest(node_len, node_parent, rollout_leaf, rollout_len);
        const TreePlan plan = PlanOneForest(forest, ToPlanOptions(options), k);
        return ToDict(plan, Value(IndexForest(forest)), loss);
      },
      PACKSCHED_FOREST(PACKSCHED_PY_ARG) py::arg("options"), py::arg("k") = 0,
      py::arg("loss") = py::none(),
      "Plans a forest of rollouts (server/planner/tree_plan.h); k > 0 partitions into exactly k "
      "parts. `loss` as for plan(), per rollout.");

  m.def(
      "tree_entries",
      [](const Lengths& node_len, const Lengths& node_parent, const Lengths& rollout_leaf,
         const std::vector<int64_t>& cu_seqlens_aligned, const Lengths& rollouts,
         const Lengths& piece_rollouts, const Lengths& piece_rollout_begin) {
        const LayoutInput in = ToLayout(rollout_leaf, cu_seqlens_aligned, rollouts, piece_rollouts,
                                        piece_rollout_begin);
        return EntriesDict(
            Entries(in.batch, in.layout, Span(node_len), Span(node_parent), Span(rollout_leaf)));
      },
      PACKSCHED_FOREST(PACKSCHED_PY_REQUIRED_ARG) py::arg("cu_seqlens_aligned"),
      PACKSCHED_TREE_LAYOUT(PACKSCHED_PY_LAYOUT_ARG)
      "A micro-batch's entries (planner::Entries) from its layout and a validated forest.");

  m.def(
      "tree_rollout_rows",
      [](const Lengths& node_len, const Lengths& node_parent, const Lengths& rollout_leaf,
         const std::vector<int64_t>& cu_seqlens_aligned, const Lengths& rollouts,
         const Lengths& piece_rollouts, const Lengths& piece_rollout_begin) {
        const LayoutInput in = ToLayout(rollout_leaf, cu_seqlens_aligned, rollouts, piece_rollouts,
                                        piece_rollout_begin);
        const TreeEntries e =
            Entries(in.batch, in.layout, Span(node_len), Span(node_parent), Span(rollout_leaf));
        std::vector<int64_t> rows;
        std::vector<int64_t> offsets = {0};
        for (size_t i = 0; i < e.rollout_entry.size(); ++i) {
          const std::vector<int64_t> held = RolloutRows(e, Span(node_len), i);
          rows.insert(rows.end(), held.begin(), held.end());
          offsets.push_back(static_cast<int64_t>(rows.size()));
        }
        return py::make_tuple(Array(rows), Array(offsets));
      },
      PACKSCHED_FOREST(PACKSCHED_PY_REQUIRED_ARG) py::arg("cu_seqlens_aligned"),
      PACKSCHED_TREE_LAYOUT(PACKSCHED_PY_LAYOUT_ARG)
      "Every held rollout's packed rows in its token order (planner::RolloutRows), concatenated, "
      "and their offsets [len(rollouts) + 1].");

  m.def(
      "tree_rows",
      [](const Lengths& node_len, const Lengths& node_parent, const Lengths& rollout_leaf,
         const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& cu_seqlens_aligned,
         int64_t aligned_tokens, int64_t total, const Lengths& rollouts,
         const Lengths& piece_rollouts, const Lengths& piece_rollout_begin) {
        LayoutInput in = ToLayout(rollout_leaf, cu_seqlens_aligned, rollouts, piece_rollouts,
                                  piece_rollout_begin);
        const TreeEntries e =
            Entries(in.batch, in.layout, Span(node_len), Span(node_parent), Span(rollout_leaf));
        const size_t pieces = cu_seqlens_aligned.size() - 1;
        bool fits = cu_seqlens.size() == pieces + 1 && aligned_tokens <= total &&
                    cu_seqlens_aligned.back() <= aligned_tokens && total <= INT32_MAX;
        for (size_t b = 0; fits && b < pieces; ++b) {
          const int64_t end = e.piece_begin[b + 1] > e.piece_begin[b]
                                  ? e.subtree_end[e.piece_begin[b]]
                                  : cu_seqlens_aligned[b];
          fits = end - cu_seqlens_aligned[b] == cu_seqlens[b + 1] - cu_seqlens[b] &&
                 end <= cu_seqlens_aligned[b + 1];
        }
        if (!fits) {
          throw py::value_error(
              "tree layout: the pieces' tokens do not match the micro-batch's cu_seqlens, "
              "cu_seqlens_aligned, aligned_tokens and total");
        }
        in.batch.cu_seqlens.assign(cu_seqlens.begin(), cu_seqlens.end());
        in.batch.aligned_tokens = aligned_tokens;
        in.batch.total = total;
        TreeRows rows = RowsOf(in.batch, e, Span(node_len));
        return py::make_tuple(
            py::array_t<int32_t>(static_cast<py::ssize_t>(rows.position.size()),
                                 rows.position.data()),
            py::array_t<int32_t>(static_cast<py::ssize_t>(rows.subtree_end.size()),
                                 rows.subtree_end.data()));
      },
      PACKSCHED_FOREST(PACKSCHED_PY_REQUIRED_ARG) py::arg("cu_seqlens"),
      py::arg("cu_seqlens_aligned"), py::arg("aligned_tokens"), py::arg("total"),
      PACKSCHED_TREE_LAYOUT(PACKSCHED_PY_LAYOUT_ARG)
      "Per packed row its position and its subtree's end as int32 arrays (planner::RowsOf).");

  m.def(
      "forest_local_bound",
      [](const Lengths& node_len, const Lengths& node_parent, const Lengths& rollout_leaf,
         const py::object& rollout_len, const py::dict& options, const py::object& loss_tokens) {
        const Forest forest = ToForest(node_len, node_parent, rollout_leaf, rollout_len);
        const PlanOptions o = ToPlanOptions(options);
        TreeProblem problem = WithoutGil([&] { return Value(TreeProblem::Create(forest, o)); });
        return BoundDict(problem, loss_tokens);
      },
      PACKSCHED_FOREST(PACKSCHED_PY_ARG) py::arg("options"), py::arg("loss_tokens") = py::none());

  m.def(
      "forest_balance",
      [](const Lengths& node_len, const Lengths& node_parent, const Lengths& rollout_leaf,
         const py::object& rollout_len, int64_t world_size, const py::dict& options,
         const std::string& sync, int64_t micro_batch_cost,
         const std::optional<std::map<std::string, int64_t>>& model_ints,
         const std::map<std::string, std::string>& model_strings,
         const std::vector<int64_t>& group_ids) {
        const Forest forest = ToForest(node_len, node_parent, rollout_leaf, rollout_len);
        PlanOptions o = ToPlanOptions(options);
        BalanceOptions balance{Value(ParseSync(sync)), micro_batch_cost, /*stop=*/{}};
        if (model_ints) {
          balance.micro_batch_cost = CostFromModel(*model_ints, model_strings, forest, o);
        }
        const BalancedForest b = WithoutGil(
            [&] { return Value(BalanceForest(forest, world_size, o, balance, group_ids)); });
        const ForestIndex index = Value(IndexForest(forest));
        py::list ranks;
        for (const TreePlan& rank : b.ranks) {
          py::dict r = ToDict(rank, index, py::none());
          int64_t cost = 0;
          for (const TreeMicroBatch& part : rank.parts) cost += part.batch.cost;
          r["cost"] = cost;  // of its pieces, as RankBatch::cost of its sequences
          ranks.append(r);
        }
        return BalanceDict(ranks, b);
      },
      PACKSCHED_FOREST(PACKSCHED_PY_ARG) py::arg("world_size"), py::arg("options"),
      py::arg("sync") = "step", py::arg("micro_batch_cost") = 0, py::arg("model_ints") = py::none(),
      py::arg("model_strings") = std::map<std::string, std::string>(),
      py::arg("group_ids") = std::vector<int64_t>());
}

}  // namespace
}  // namespace packsched::planner
