// packsched._planner: the pybind11 layer under packsched/planner.py — the planner in-process,
// no sidecar. It converts the Python keyword options (already normalised by packsched/_options.py)
// into planner::PlanOptions with the same parsers the CLI and the sidecar use, runs the planner,
// and returns plain dicts and lists that packsched.plan.Plan wraps. Errors raise ValueError with
// the planner's message (the text the sidecar would send as INVALID_ARGUMENT).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"

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

// `d` holds every key of packsched._options.PLAN_DEFAULTS (the Python side fills defaults).
PlanOptions ToPlanOptions(const py::dict& d) {
  PlanOptions o;
  o.max_token_len = d["max_token_len"].is_none() ? 0 : Int(d, "max_token_len");
  o.cap_mode = Value(ParseCapMode(Str(d, "cap_mode")));
  o.max_seqs_per_micro_batch =
      d["max_seqs_per_micro_batch"].is_none() ? 0 : Int(d, "max_seqs_per_micro_batch");
  o.min_micro_batches = Int(d, "min_micro_batches");
  o.divisible_by = Int(d, "divisible_by");
  o.align_to = Int(d, "align_to");
  o.align_total_to = Int(d, "align_total_to");
  o.algorithm = Value(ParseAlgorithm(Str(d, "algorithm")));
  o.cost = Value(ParseCostModel(Str(d, "cost")));
  if (!d["attention_cost"].is_none()) {
    auto [a, b] = d["attention_cost"].cast<std::pair<int64_t, int64_t>>();
    o.attention.linear = a;
    o.attention.quadratic = b;
  }
  o.overlong = Value(ParseOverlongPolicy(Str(d, "overlong")));
  o.order = Value(ParsePartOrder(Str(d, "order")));
  o.max_micro_batches = Int(d, "max_micro_batches");
  o.equal_size = d["equal_size"].cast<bool>();
  return o;
}

py::dict ToDict(const MicroBatch& part) {
  py::dict d;
  d["indices"] = part.indices;
  d["tokens"] = part.tokens;
  d["aligned_tokens"] = part.aligned_tokens;
  d["total"] = part.total;
  d["padded_tokens"] = part.padded_tokens;
  d["cost"] = part.cost;
  d["max_seqlen"] = part.max_seqlen;
  d["max_seqlen_aligned"] = part.max_seqlen_aligned;
  d["cu_seqlens"] = part.cu_seqlens;
  d["cu_seqlens_aligned"] = part.cu_seqlens_aligned;
  d["empty"] = part.empty;
  d["overlong"] = part.overlong;
  return d;
}

py::dict ToDict(const PlanStats& s) {
  py::dict d;
  d["num_sequences"] = s.num_sequences;
  d["num_kept"] = s.num_kept;
  d["total_tokens"] = s.total_tokens;
  d["total_cost"] = s.total_cost;
  d["max_part_cost"] = s.max_part_cost;
  d["min_part_cost"] = s.min_part_cost;
  d["imbalance"] = s.imbalance;
  d["lower_bound_k"] = s.lower_bound_k;
  d["local_k"] = s.local_k;
  d["over_cap_parts"] = s.over_cap_parts;
  d["naive_padded_tokens"] = s.naive_padded_tokens;
  d["packed_tokens"] = s.packed_tokens;
  return d;
}

py::dict ToDict(const MicroBatchPlan& plan) {
  py::dict d;
  py::list parts;
  for (const MicroBatch& part : plan.parts) parts.append(ToDict(part));
  d["parts"] = parts;
  d["reorder"] = plan.reorder;
  d["revert"] = plan.revert;
  d["dropped"] = plan.dropped;
  d["stats"] = ToDict(plan.stats);
  return d;
}

// Runs `fn` with the GIL released: planning a large batch takes milliseconds to seconds.
template <typename Fn>
auto WithoutGil(Fn&& fn) {
  py::gil_scoped_release release;
  return fn();
}

LossOptions ToLossOptions(const py::dict& d) {
  LossOptions o;
  o.mode = Value(ParseLossMode(Str(d, "loss_mode")));
  o.dp_reduction = Value(ParseDpReduction(Str(d, "dp_reduction")));
  o.sum_norm_constant = d["sum_norm_constant"].cast<double>();
  return o;
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

// Adds loss_weights, loss_scales and loss_counts (this rank's) to the plan dict `out`. Without
// `global_counts` the round is this rank alone (its own counts are the global ones).
void AddLossWeights(const MicroBatchPlan& plan, const py::dict& loss, py::dict& out) {
  const auto loss_tokens = loss["loss_tokens"].cast<std::vector<int64_t>>();
  const LossCounts local = Value(CountLoss(plan, loss_tokens));
  LossCounts global = local;
  if (!loss["global_counts"].is_none()) {
    auto [tokens, sequences] = loss["global_counts"].cast<std::pair<int64_t, int64_t>>();
    global = {tokens, sequences};
  }
  const LossWeights w = Value(ComputeLossWeights(plan, loss_tokens, ToLossOptions(loss), global,
                                                 loss["world_size"].cast<int64_t>()));
  out["loss_weights"] = w.weights;
  out["loss_scales"] = w.loss_scales;
  out["loss_counts"] = std::make_pair(local.loss_tokens, local.sequences_with_loss);
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

PYBIND11_MODULE(_planner, m) {
  m.doc() = "Low-level bindings of the packsched planner; use packsched.planner instead.";

  m.def(
      "plan",
      [](const Lengths& lengths, const py::dict& options, int64_t k, const py::object& loss) {
        const MicroBatchPlan plan = PlanOne(lengths, ToPlanOptions(options), k);
        py::dict d = ToDict(plan);
        if (!loss.is_none()) AddLossWeights(plan, loss.cast<py::dict>(), d);
        return d;
      },
      py::arg("lengths"), py::arg("options"), py::arg("k") = 0, py::arg("loss") = py::none(),
      "Plans one rank's sequences; k > 0 partitions into exactly k parts. `loss` (a dict of "
      "loss_tokens, loss_mode, dp_reduction, sum_norm_constant, global_counts, world_size) adds "
      "loss_weights, loss_scales and loss_counts.");

  m.def(
      "local_bound",
      [](const Lengths& lengths, const py::dict& options, const py::object& loss_tokens) {
        const PlanOptions o = ToPlanOptions(options);
        Problem problem = WithoutGil([&] { return Value(Problem::Create(Span(lengths), o)); });
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
          d["loss_counts"] = std::make_pair(c.loss_tokens, c.sequences_with_loss);
        }
        return d;
      },
      py::arg("lengths"), py::arg("options"), py::arg("loss_tokens") = py::none());

  m.def(
      "balance",
      [](const Lengths& lengths, int64_t world_size, const py::dict& options,
         const std::vector<int64_t>& group_ids) {
        const PlanOptions o = ToPlanOptions(options);
        BalancedBatch b = WithoutGil(
            [&] { return Value(BalanceBatch(Span(lengths), world_size, o, group_ids)); });
        py::list ranks;
        for (const RankBatch& rank : b.ranks) {
          py::dict r;
          r["indices"] = rank.indices;
          r["cost"] = rank.cost;
          r["plan"] = ToDict(rank.plan);
          ranks.append(r);
        }
        py::dict d;
        d["ranks"] = ranks;
        d["num_micro_batches"] = b.num_micro_batches;
        d["dropped"] = b.dropped;
        return d;
      },
      py::arg("lengths"), py::arg("world_size"), py::arg("options"), py::arg("group_ids"));
}

}  // namespace
}  // namespace packsched::planner
