#include "server/cli/dynamic_cp_command.h"

#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/base/status_macros.h"
#include "server/cli/json_writer.h"
#include "server/planner/schema.h"

namespace packsched::cli {
namespace {

// The flag of each option the planner names: the table's (name, flag) columns, and R's.
struct FlagName {
  absl::string_view option;  // as PlanDynamicCp's messages name it
  absl::string_view flag;
};

// The row
//   X(micro_batch_cost, 10, Weight, int64, cost.micro_batch, cp_micro_batch_cost, Own, "...")
// expands, through PACKSCHED_DCP_FLAG_NAME, to
//   FlagName{"cost.micro_batch", "cp_micro_batch_cost"},
#define PACKSCHED_DCP_FLAG_NAME(name, number, Rule, Type, member, flag, Owner, help) \
  FlagName{#member, #flag},
constexpr FlagName kFlagNames[] = {PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_DCP_FLAG_NAME)
                                       FlagName{"ranks", "world_size"}};

// The planner's "dynamic_cp: <option> = v: why" as "--<flag> = v: why" (other messages as they
// are, after "--dynamic_cp: ").
absl::Status AsFlagError(const absl::Status& s) {
  absl::string_view message = s.message();
  absl::ConsumePrefix(&message, "dynamic_cp: ");
  for (const FlagName& f : kFlagNames) {
    if (absl::StartsWith(message, absl::StrCat(f.option, " = "))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.flag, message.substr(f.option.size())));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("--dynamic_cp: ", message));
}

// The links' ranges (the Ratio and Bytes rows): the row
//   X(bytes_per_element, 15, Bytes, int64, bytes_per_element, cp_bytes_per_element, Own, "...")
// expands, through PACKSCHED_DCP_CHECK, to
//   if (!(l.bytes_per_element >= 1)) return Bad("cp_bytes_per_element", ..., "must be >= 1");
#define PACKSCHED_DCP_CHECK_Ratio(l, member, flag)                                \
  if (!((l).member >= 0) || !std::isfinite((l).member)) {                         \
    return absl::InvalidArgumentError(                                            \
        absl::StrCat("--" #flag " = ", (l).member, ": must be finite and >= 0")); \
  }
#define PACKSCHED_DCP_CHECK_Bytes(l, member, flag)                     \
  if ((l).member < 1) {                                                \
    return absl::InvalidArgumentError(                                 \
        absl::StrCat("--" #flag " = ", (l).member, ": must be >= 1")); \
  }
#define PACKSCHED_DCP_CHECK(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_DCP_CHECK, Rule, Ratio, Bytes)(l, member, flag)

absl::Status CheckLinks(const planner::CpModelLinks& l) {
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_DCP_CHECK)
  return absl::OkStatus();
}

// The options object, by rule: the row
//   X(min_cp, 3, Int, int64, min_cp, min_cp, Own, "...")
// expands, through PACKSCHED_DCP_JSON, to
//   w.Key("min_cp");
//   w.Int(r.options.min_cp);
#define PACKSCHED_DCP_JSON_Int(w, r, name, member) \
  (w).Key(#name);                                  \
  (w).Int((r).options.member);
#define PACKSCHED_DCP_JSON_Cap PACKSCHED_DCP_JSON_Int
#define PACKSCHED_DCP_JSON_MaxCp PACKSCHED_DCP_JSON_Int
#define PACKSCHED_DCP_JSON_Weight PACKSCHED_DCP_JSON_Int
#define PACKSCHED_DCP_JSON_Nodes PACKSCHED_DCP_JSON_Int
#define PACKSCHED_DCP_JSON_Enum(w, r, name, member) \
  (w).Key(#name);                                   \
  (w).String(planner::Name((r).options.member));
#define PACKSCHED_DCP_JSON_Ratio(w, r, name, member) \
  if ((r).model) {                                   \
    (w).Key(#name);                                  \
    (w).Double((r).links.member);                    \
  }
#define PACKSCHED_DCP_JSON_Bytes(w, r, name, member) \
  if ((r).model) {                                   \
    (w).Key(#name);                                  \
    (w).Int((r).links.member);                       \
  }
#define PACKSCHED_DCP_JSON(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_DCP_JSON_##Rule(w, r, name, member)

void WriteOptions(const DynamicCpRequest& r, JsonWriter& w) {
  w.BeginObject();
  w.Key("world_size");
  w.Int(r.options.ranks);
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_DCP_JSON)
  w.Key("model_config");
  w.Bool(r.model.has_value());
  w.EndObject();
}

std::vector<int64_t> CostWeights(const planner::CpCostModel& c) {
  return {c.linear, c.quadratic, c.comm, c.micro_batch, c.node_ranks, c.comm_across_nodes};
}

std::string RankRange(int64_t first, int64_t size) {
  return size == 1 ? absl::StrCat(first) : absl::StrCat(first, "-", first + size - 1);
}

// The planner's error with the cap named as its flag ("... above --max_token_len = 4096"): a
// sequence that does not fit names the cap it passes.
#define PACKSCHED_DCP_CAP_NAME_Cap(name, flag) {#name " = ", "--" #flag " = "},
#define PACKSCHED_DCP_CAP_NAME(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_DCP_CAP_NAME, Rule, Cap)(name, flag)

absl::Status CapAsFlag(const absl::Status& s) {
  return absl::Status(
      s.code(),
      absl::StrReplaceAll(s.message(), {PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_DCP_CAP_NAME)}));
}

}  // namespace

absl::Status CheckDynamicCpRequest(const DynamicCpRequest& request) {
  if (absl::StatusOr<planner::DynamicCpPlan> none = planner::PlanDynamicCp({}, request.options);
      !none.ok()) {
    return AsFlagError(none.status());
  }
  return CheckLinks(request.links);
}

absl::StatusOr<DynamicCpRun> RunDynamicCp(absl::Span<const int64_t> lengths,
                                          const DynamicCpRequest& request) {
  RETURN_IF_ERROR(CheckDynamicCpRequest(request));
  DynamicCpRun run;
  run.request = request;
  const auto start = std::chrono::steady_clock::now();
  if (request.model) {
    ASSIGN_OR_RETURN(run.request.options.cost,
                     planner::CpCostOfModelFields(request.model->ints, request.model->strings,
                                                  lengths, request.options, request.links));
  }
  absl::StatusOr<planner::DynamicCpPlan> plan =
      planner::PlanDynamicCp(lengths, run.request.options);
  if (!plan.ok()) return CapAsFlag(plan.status());
  run.plan = *std::move(plan);
  run.plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

std::string DynamicCpJson(const DynamicCpRun& run) {
  const planner::DynamicCpPlan& p = run.plan;
  JsonWriter w;
  w.BeginObject();
  w.Key("mode");
  w.String("dynamic_cp");
  w.Key("options");
  WriteOptions(run.request, w);
  w.Key("cost_model");
  w.IntArray(CostWeights(run.request.options.cost));
  w.Key("num_micro_batches");
  w.Int(static_cast<int64_t>(p.slots.size()));
  w.Key("slots");
  w.BeginArray();
  for (const planner::CpSlotPlan& slot : p.slots) {
    w.BeginObject();
    w.Key("cost");
    w.Int(slot.cost);
    w.Key("groups");
    w.BeginArray();
    for (const planner::CpGroupPlan& g : slot.groups) {
      std::vector<int64_t> ranks(g.size);
      for (int64_t i = 0; i < g.size; ++i) ranks[i] = g.first_rank + i;
      w.BeginObject();
      w.Key("first_rank");
      w.Int(g.first_rank);
      w.Key("size");
      w.Int(g.size);
      w.Key("name");
      w.Int(g.name);
      w.Key("ranks");
      w.IntArray(ranks);
      w.Key("sequences");
      w.IntArray(g.sequences);
      w.Key("cu_seqlens");
      w.IntArray(g.cu_seqlens);
      w.Key("tokens_per_rank");
      w.Int(g.tokens_per_rank);
      w.Key("cost");
      w.Int(g.cost);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("group_names");
  w.BeginArray();
  for (const auto& [first, size] : p.group_names) w.IntArray(std::vector<int64_t>{first, size});
  w.EndArray();
  w.Key("cp_of_sequence");
  w.IntArray(p.cp_of_sequence);
  w.Key("slot_of_sequence");
  w.IntArray(p.slot_of_sequence);
  w.Key("step_cost");
  w.Int(p.step_cost);
  w.Key("lower_bound");
  w.Int(p.lower_bound);
  w.Key("comm_tokens");
  w.Int(p.comm_tokens);
  w.Key("plan_ms");
  w.Double(run.plan_seconds * 1e3);
  w.EndObject();
  return w.Take() + "\n";
}

std::string DynamicCpTable(const DynamicCpRun& run) {
  const planner::DynamicCpPlan& p = run.plan;
  const planner::DynamicCpOptions& o = run.request.options;
  const int64_t max_cp = o.max_cp == 0 ? o.ranks : o.max_cp;
  std::string out =
      absl::StrCat("packsched plan --dynamic_cp: ", p.cp_of_sequence.size(), " sequences over ",
                   o.ranks, " ranks -> ", p.slots.size(), " micro-batch slots (cap ",
                   o.max_tokens_per_rank, " tokens a rank, CP sizes ", planner::Name(o.sizes),
                   " in [", o.min_cp, ", ", max_cp, "], tp ", o.tensor_parallel, ")\n");
  const double efficiency =
      p.step_cost > 0 ? static_cast<double>(p.lower_bound) / static_cast<double>(p.step_cost) : 1.0;
  absl::StrAppendFormat(&out, "step cost %d, lower bound %d (%.1f%%), comm tokens %d\n",
                        p.step_cost, p.lower_bound, 100.0 * efficiency, p.comm_tokens);
  absl::StrAppend(&out, "groups (one process group each):");
  for (size_t name = 0; name < p.group_names.size(); ++name) {
    const auto& [first, size] = p.group_names[name];
    absl::StrAppend(&out, " ", name, "=[", RankRange(first, size), "]");
  }
  absl::StrAppend(&out, "\n\n");
  for (size_t i = 0; i < p.slots.size(); ++i) {
    const planner::CpSlotPlan& slot = p.slots[i];
    absl::StrAppend(&out, "slot ", i, "  cost ", slot.cost, "\n");
    for (const planner::CpGroupPlan& g : slot.groups) {
      absl::StrAppendFormat(&out,
                            "  ranks %-9s cp %-3d group %-3d %4d seqs %10d tokens/rank  cost %d\n",
                            RankRange(g.first_rank, g.size), g.size, g.name, g.sequences.size(),
                            g.tokens_per_rank, g.cost);
    }
  }
  absl::StrAppendFormat(&out, "\nplanned in %.3f ms\n", run.plan_seconds * 1e3);
  return out;
}

}  // namespace packsched::cli
