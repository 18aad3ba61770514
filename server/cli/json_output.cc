#include "server/cli/json_output.h"

#include <cstdint>
#include <iterator>
#include <vector>

#include "server/cli/json_writer.h"
#include "server/planner/options.h"
#include "server/planner/schema.h"

namespace packsched::cli {
namespace {

// The plan's fields by the schema table (server/planner/schema.h), in its order, under their
// proto names.
void Write(JsonWriter& w, int64_t v) { w.Int(v); }
void Write(JsonWriter& w, double v) { w.Double(v); }
void Write(JsonWriter& w, bool v) { w.Bool(v); }
template <typename T>
void Write(JsonWriter& w, const std::vector<T>& v) {
  w.IntArray(v);
}

// A micro-batch (PACKSCHED_MICRO_BATCH): its planner fields (a LossScale is not one). The row
//   X(tokens, 2, Int)
// expands, through PACKSCHED_JSON_PART, to
//   w.Key("tokens");
//   Write(w, part.tokens);
#define PACKSCHED_JSON_PART_Int(w, part, name) \
  (w).Key(#name);                              \
  Write(w, (part).name);
#define PACKSCHED_JSON_PART_Ints PACKSCHED_JSON_PART_Int
#define PACKSCHED_JSON_PART_Bool PACKSCHED_JSON_PART_Int
#define PACKSCHED_JSON_PART(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_JSON_PART, Kind, LossScale)(w, part, name)

}  // namespace

void WriteMicroBatchFields(const planner::MicroBatch& part, JsonWriter& w) {
  PACKSCHED_MICRO_BATCH(PACKSCHED_JSON_PART)
}

namespace {

void WritePart(const planner::MicroBatch& part, JsonWriter& w) {
  w.BeginObject();
  WriteMicroBatchFields(part, w);
  w.EndObject();
}

// The planner's stats (PACKSCHED_PLAN_STATS; the wire-only ones, Cap and Micros, are not the
// planner's: nothing to write). The row
//   X(imbalance, 7, Double, _)
// expands, through PACKSCHED_JSON_STATS, to
//   w.Key("imbalance");
//   Write(w, s.imbalance);
#define PACKSCHED_JSON_STATS_Int(w, s, name) \
  (w).Key(#name);                            \
  Write(w, (s).name);
#define PACKSCHED_JSON_STATS_Double PACKSCHED_JSON_STATS_Int
#define PACKSCHED_JSON_STATS_LocalK PACKSCHED_JSON_STATS_Int
#define PACKSCHED_JSON_STATS(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_JSON_STATS, Kind, Cap, Micros)(w, s, name)

}  // namespace

void WriteStats(const planner::PlanStats& s, JsonWriter& w) {
  w.BeginObject();
  PACKSCHED_PLAN_STATS(PACKSCHED_JSON_STATS)
  w.EndObject();
}

namespace {

// The Weight options as one pair, [A, B] in table order (PACKSCHED_PLAN_OPTIONS' Weight rows; the
// other rules are not part of it: nothing to write). The row
//   X(attention_linear, 10, Weight, int64, attention.linear, 10, "")
// expands, through PACKSCHED_JSON_PAIR_ELEMENT, to
//   w.Int(o.attention.linear);
#define PACKSCHED_JSON_PAIR_ELEMENT_Weight(w, o, member) (w).Int((o).member);
#define PACKSCHED_JSON_PAIR_ELEMENT(name, number, Rule, Type, member, json, help) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_JSON_PAIR_ELEMENT, Rule, Weight)(w, o, member)

void WritePair(const planner::PlanOptions& o, JsonWriter& w) {
  w.Key(PACKSCHED_WEIGHT_PAIR_KEY);
  w.BeginArray();
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_JSON_PAIR_ELEMENT)
  w.EndArray();
}

// The options by flag name, at their `json` positions (the row whose `json` column is
// `position`, on each turn): --num_parts right after the cap, the Weight options as one pair
// (both rows share a position; the first writes the pair). The row
//   X(cap_mode, 2, Enum, CapMode, cap_mode, 3, "tokens ... | padded ...")
// expands, through PACKSCHED_JSON_OPTION, to
//   if (position == 3) {
//     w.Key("cap_mode");
//     w.String(planner::Name(o.cap_mode));
//   }
#define PACKSCHED_JSON_OPTION_INT(w, o, run, pair_written, name, member) \
  (w).Key(#name);                                                        \
  (w).Int((o).member);
#define PACKSCHED_JSON_OPTION_Cap(w, o, run, pair_written, name, member) \
  PACKSCHED_JSON_OPTION_INT(w, o, run, pair_written, name, member)       \
  (w).Key("num_parts");                                                  \
  (w).Int((run).request.num_parts);
#define PACKSCHED_JSON_OPTION_Unlimited PACKSCHED_JSON_OPTION_INT
#define PACKSCHED_JSON_OPTION_Count PACKSCHED_JSON_OPTION_INT
#define PACKSCHED_JSON_OPTION_Align PACKSCHED_JSON_OPTION_INT
#define PACKSCHED_JSON_OPTION_Ceiling PACKSCHED_JSON_OPTION_INT
#define PACKSCHED_JSON_OPTION_FixedK(w, o, run, pair_written, name, member) \
  (w).Key(#name);                                                           \
  (w).Bool((o).member);
#define PACKSCHED_JSON_OPTION_Enum(w, o, run, pair_written, name, member) \
  (w).Key(#name);                                                         \
  (w).String(planner::Name((o).member));
#define PACKSCHED_JSON_OPTION_Weight(w, o, run, pair_written, name, member) \
  if (!(pair_written)) {                                                    \
    (pair_written) = true;                                                  \
    WritePair(o, w);                                                        \
  }
#define PACKSCHED_JSON_OPTION(name, number, Rule, Type, member, json, help) \
  if (position == (json)) {                                                 \
    PACKSCHED_JSON_OPTION_##Rule(w, o, run, pair_written, name, member)     \
  }

}  // namespace

void WriteOptions(const PlanRun& run, JsonWriter& w) {
  const planner::PlanOptions& o = run.request.options;
  w.BeginObject();
  w.Key("mode");
  w.String(run.mode);
  bool pair_written = false;
  for (int position = 0; position < std::ssize(planner::schema::kPlanOptions); ++position) {
    PACKSCHED_PLAN_OPTIONS(PACKSCHED_JSON_OPTION)
  }
  if (run.batch) {
    w.Key("world_size");
    w.Int(run.request.world_size);
    w.Key("sync");
    w.String(planner::Name(run.request.balance.sync));
    w.Key("micro_batch_cost");
    w.Int(run.request.balance.micro_batch_cost);
  }
  w.EndObject();
}

// The plan's fields in table order (PACKSCHED_PLAN_RESPONSE; the sidecar's own — this rank's
// bound, loss weights and global counts — are not the CLI's: nothing to write; the tree's
// entries are written by the tree command). The row
//   X(reorder, 4, Indices)
// expands, through PACKSCHED_JSON_PLAN, to
//   w.Key("reorder");
//   w.IntArray(plan.reorder);
#define PACKSCHED_JSON_PLAN_Count(w, plan, name) \
  (w).Key(#name);                                \
  (w).Int(static_cast<int64_t>((plan).parts.size()));
#define PACKSCHED_JSON_PLAN_Parts(w, plan, name)                           \
  (w).Key(#name);                                                          \
  (w).BeginArray();                                                        \
  for (const planner::MicroBatch& part : (plan).parts) WritePart(part, w); \
  (w).EndArray();
#define PACKSCHED_JSON_PLAN_Indices(w, plan, name) \
  (w).Key(#name);                                  \
  (w).IntArray((plan).name);
#define PACKSCHED_JSON_PLAN_Stats(w, plan, name) \
  (w).Key(#name);                                \
  WriteStats((plan).name, w);
#define PACKSCHED_JSON_PLAN(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_JSON_PLAN, Kind, LocalK, Weights, Global, Tree)(w, plan, name)

namespace {

// One plan's fields (a rank's in coordinator mode), inside an open object.
void WritePlanFields(const planner::MicroBatchPlan& plan, JsonWriter& w) {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_JSON_PLAN)
}

// Coordinator mode: the common k, every rank's share and plan, the dropped, the step.
void WriteBatchFields(const planner::BalancedBatch& batch, JsonWriter& w) {
  w.Key("num_micro_batches");
  w.Int(batch.num_micro_batches);
  w.Key("ranks");
  w.BeginArray();
  for (const planner::RankBatch& rank : batch.ranks) {
    w.BeginObject();
    w.Key("indices");
    w.IntArray(rank.indices);
    w.Key("cost");
    w.Int(rank.cost);
    w.Key("plan");
    w.BeginObject();
    WritePlanFields(rank.plan, w);
    w.EndObject();
    w.EndObject();
  }
  w.EndArray();
  w.Key("dropped");
  w.IntArray(batch.dropped);
  w.Key("step");
  WriteStep(batch.step, w);
}

}  // namespace

void WriteStep(const planner::StepStats& s, JsonWriter& w) {
  w.BeginObject();
  w.Key("step_sync_cost");
  w.Int(s.step_sync_cost);
  w.Key("micro_batch_sync_cost");
  w.Int(s.micro_batch_sync_cost);
  w.Key("ideal");
  w.Double(s.ideal);
  w.Key("efficiency");
  w.Double(s.efficiency);
  w.Key("lower_bound");
  w.Int(s.lower_bound);
  w.Key("lower_bound_efficiency");
  w.Double(s.lower_bound_efficiency);
  w.EndObject();
}

// The plan's micro-batch list's name (the Parts row of PACKSCHED_PLAN_RESPONSE).
#define PACKSCHED_JSON_PARTS_KEY_Parts(name) #name
#define PACKSCHED_JSON_PARTS_KEY(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_JSON_PARTS_KEY, Kind, Parts)(name)

absl::string_view MicroBatchesKey() { return PACKSCHED_PLAN_RESPONSE(PACKSCHED_JSON_PARTS_KEY); }

std::string PlanJson(const PlanRun& run) {
  JsonWriter w;
  w.BeginObject();
  if (run.batch) {
    WriteBatchFields(*run.batch, w);
  } else {
    WritePlanFields(run.plan, w);
  }
  w.Key("options");
  WriteOptions(run, w);
  w.Key("timing");
  w.BeginObject();
  w.Key("plan_ms");
  w.Double(run.plan_seconds * 1e3);
  w.EndObject();
  w.EndObject();
  std::string out = w.Take();
  out += '\n';
  return out;
}

}  // namespace packsched::cli
