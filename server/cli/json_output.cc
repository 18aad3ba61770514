#include "server/cli/json_output.h"

#include "server/cli/json_writer.h"
#include "server/planner/options.h"

namespace packsched::cli {
namespace {

void WritePart(const planner::MicroBatch& part, JsonWriter& w) {
  w.BeginObject();
  w.Key("indices");
  w.IntArray(part.indices);
  w.Key("tokens");
  w.Int(part.tokens);
  w.Key("aligned_tokens");
  w.Int(part.aligned_tokens);
  w.Key("total");
  w.Int(part.total);
  w.Key("padded_tokens");
  w.Int(part.padded_tokens);
  w.Key("cost");
  w.Int(part.cost);
  w.Key("max_seqlen");
  w.Int(part.max_seqlen);
  w.Key("max_seqlen_aligned");
  w.Int(part.max_seqlen_aligned);
  w.Key("cu_seqlens");
  w.IntArray(part.cu_seqlens);
  w.Key("cu_seqlens_aligned");
  w.IntArray(part.cu_seqlens_aligned);
  w.Key("empty");
  w.Bool(part.empty);
  w.Key("overlong");
  w.Bool(part.overlong);
  w.EndObject();
}

void WriteStats(const planner::PlanStats& s, JsonWriter& w) {
  w.BeginObject();
  w.Key("num_sequences");
  w.Int(s.num_sequences);
  w.Key("num_kept");
  w.Int(s.num_kept);
  w.Key("total_tokens");
  w.Int(s.total_tokens);
  w.Key("total_cost");
  w.Int(s.total_cost);
  w.Key("max_part_cost");
  w.Int(s.max_part_cost);
  w.Key("min_part_cost");
  w.Int(s.min_part_cost);
  w.Key("imbalance");
  w.Double(s.imbalance);
  w.Key("lower_bound_k");
  w.Int(s.lower_bound_k);
  w.Key("local_k");
  w.Int(s.local_k);
  w.Key("over_cap_parts");
  w.Int(s.over_cap_parts);
  w.Key("naive_padded_tokens");
  w.Int(s.naive_padded_tokens);
  w.Key("packed_tokens");
  w.Int(s.packed_tokens);
  w.EndObject();
}

void WriteOptions(const PlanRun& run, JsonWriter& w) {
  const planner::PlanOptions& o = run.request.options;
  w.BeginObject();
  w.Key("mode");
  w.String(run.mode);
  w.Key("algorithm");
  w.String(planner::Name(o.algorithm));
  w.Key("max_token_len");
  w.Int(o.max_token_len);
  w.Key("num_parts");
  w.Int(run.request.num_parts);
  w.Key("equal_size");
  w.Bool(o.equal_size);
  w.Key("cap_mode");
  w.String(planner::Name(o.cap_mode));
  w.Key("max_seqs_per_micro_batch");
  w.Int(o.max_seqs_per_micro_batch);
  w.Key("min_micro_batches");
  w.Int(o.min_micro_batches);
  w.Key("divisible_by");
  w.Int(o.divisible_by);
  w.Key("align_to");
  w.Int(o.align_to);
  w.Key("align_total_to");
  w.Int(o.align_total_to);
  w.Key("cost");
  w.String(planner::Name(o.cost));
  w.Key("attention_cost");
  w.BeginArray();
  w.Int(o.attention.linear);
  w.Int(o.attention.quadratic);
  w.EndArray();
  w.Key("overlong");
  w.String(planner::Name(o.overlong));
  w.Key("order");
  w.String(planner::Name(o.order));
  w.Key("max_micro_batches");
  w.Int(o.max_micro_batches);
  w.EndObject();
}

}  // namespace

std::string PlanJson(const PlanRun& run) {
  const planner::MicroBatchPlan& plan = run.plan;
  JsonWriter w;
  w.BeginObject();
  w.Key("num_micro_batches");
  w.Int(static_cast<int64_t>(plan.parts.size()));
  w.Key("micro_batches");
  w.BeginArray();
  for (const planner::MicroBatch& part : plan.parts) WritePart(part, w);
  w.EndArray();
  w.Key("reorder");
  w.IntArray(plan.reorder);
  w.Key("revert");
  w.IntArray(plan.revert);
  w.Key("dropped");
  w.IntArray(plan.dropped);
  w.Key("stats");
  WriteStats(plan.stats, w);
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
