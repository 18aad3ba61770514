#include "server/cli/table_output.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/planner/options.h"

namespace packsched::cli {
namespace {

// The attention cost's formula with its weights (options.h, AttentionCost).
std::string CostFormula(const planner::AttentionCost& a) {
  std::string out = absl::StrCat(a.linear, "*L + ", a.quadratic, "*L^2");
  if (a.windowed > 0) absl::StrAppend(&out, " + ", a.windowed, "*window(L, ", a.window, ")");
  if (a.chunked > 0) absl::StrAppend(&out, " + ", a.chunked, "*chunks(L, ", a.chunk, ")");
  return out;
}

constexpr int kBarWidth = 30;

// What the cap measures for one part (see planner::CapMode).
int64_t CapMeasure(const planner::MicroBatch& part, planner::CapMode mode) {
  return mode == planner::CapMode::kTokens ? part.total : part.padded_tokens;
}

std::string Percent(int64_t part, int64_t whole) {
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

}  // namespace

std::string FillBar(double fraction, int width) {
  if (!(fraction > 0.0)) fraction = 0.0;  // NaN included
  fraction = std::min(fraction, 1.0);
  const int filled = static_cast<int>(std::lround(fraction * width));
  return std::string(filled, '#') + std::string(width - filled, ' ');
}

namespace {

// Coordinator mode: one line per rank, then the step.
std::string BatchTable(const PlanRun& run) {
  const planner::BalancedBatch& batch = *run.batch;
  const planner::PlanOptions& o = run.request.options;
  std::string out;
  int64_t n = 0;
  for (const planner::RankBatch& rank : batch.ranks) n += rank.indices.size();
  absl::StrAppend(&out, "packsched plan: ", n, " sequences over ", batch.ranks.size(), " ranks -> ",
                  batch.num_micro_batches, " micro-batches each (sync ",
                  planner::Name(run.request.balance.sync), ", cap ", o.max_token_len);
  if (o.cost == planner::CostModel::kAttention) {
    absl::StrAppend(&out, ", cost ", CostFormula(o.attention));
  }
  if (run.request.balance.micro_batch_cost > 0) {
    absl::StrAppend(&out, " + ", run.request.balance.micro_batch_cost, " a micro-batch");
  }
  absl::StrAppend(&out, ")\n\n");
  absl::StrAppend(&out, absl::StrFormat("%6s %6s %10s %18s %10s\n", "rank", "seqs", "tokens",
                                        "cost", "over cap"));
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    const planner::RankBatch& rank = batch.ranks[r];
    absl::StrAppend(&out, absl::StrFormat("%6d %6d %10d %18d %10d\n", r, rank.indices.size(),
                                          rank.plan.stats.total_tokens, rank.cost,
                                          rank.plan.stats.over_cap_parts));
  }
  const planner::StepStats& s = batch.step;
  absl::StrAppend(&out, "\nstep cost: ", s.step_sync_cost, " (sync step), ",
                  s.micro_batch_sync_cost, " (sync micro_batch); lower bound ", s.lower_bound,
                  "\n");
  absl::StrAppend(&out, absl::StrFormat("efficiency %.4f (ideal %.6g; at best %.4f)\n",
                                        s.efficiency, s.ideal, s.lower_bound_efficiency));
  if (!batch.dropped.empty()) absl::StrAppend(&out, "dropped: ", batch.dropped.size(), "\n");
  absl::StrAppend(&out, absl::StrFormat("planned in %.3f ms\n", run.plan_seconds * 1e3));
  return out;
}

}  // namespace

std::string PlanTable(const PlanRun& run) {
  if (run.batch) return BatchTable(run);
  const planner::MicroBatchPlan& plan = run.plan;
  const planner::PlanStats& s = plan.stats;
  const planner::PlanOptions& o = run.request.options;
  const int64_t cap = o.max_token_len;
  const int64_t k = static_cast<int64_t>(plan.parts.size());
  std::string out;

  absl::StrAppend(&out, "packsched plan: ", s.num_sequences, " sequences, ", s.total_tokens,
                  " tokens -> ", k, " micro-batches (", planner::Name(o.algorithm));
  if (cap > 0) {
    absl::StrAppend(&out, ", cap ", cap, " ",
                    o.cap_mode == planner::CapMode::kTokens ? "tokens" : "padded tokens");
  }
  if (run.request.num_parts > 0) absl::StrAppend(&out, ", fixed k");
  if (o.cost == planner::CostModel::kAttention) {
    absl::StrAppend(&out, ", cost ", CostFormula(o.attention));
  }
  absl::StrAppend(&out, ")\n\n");

  const std::string against = cap > 0 ? absl::StrCat("fill of cap ", cap) : "fill of largest";
  absl::StrAppend(
      &out, absl::StrFormat("%6s %6s %10s %14s  %s\n", "#", "seqs", "tokens", "cost", against));
  for (int64_t i = 0; i < k; ++i) {
    const planner::MicroBatch& part = plan.parts[i];
    const int64_t measure = cap > 0 ? CapMeasure(part, o.cap_mode) : part.cost;
    const int64_t whole = cap > 0 ? cap : std::max<int64_t>(s.max_part_cost, 1);
    const double fraction = static_cast<double>(measure) / static_cast<double>(whole);
    std::string flags;
    if (part.empty) flags = "  empty";
    if (part.overlong) {
      flags = "  overlong";
    } else if (cap > 0 && measure > cap) {
      flags = "  over cap";
    }
    absl::StrAppend(&out, absl::StrFormat("%6d %6d %10d %14d  |%s| %6.1f%%%s\n", i,
                                          part.indices.size(), part.tokens, part.cost,
                                          FillBar(fraction, kBarWidth), 100.0 * fraction, flags));
  }

  absl::StrAppend(&out, "\n");
  auto line = [&](absl::string_view name, const std::string& value) {
    absl::StrAppend(&out, absl::StrFormat("%-20s %s\n", name, value));
  };
  line("micro-batches",
       absl::StrCat(k, " (lower bound ", s.lower_bound_k, ", fewest found ", s.local_k, ")"));
  line("max / mean cost", absl::StrFormat("%.4f (largest %d, smallest %d)", s.imbalance,
                                          s.max_part_cost, s.min_part_cost));
  if (cap > 0) {
    // Flagged overlong parts, and (equal_size, which ignores the cap) any other part over the
    // cap with a single sequence: no plan could bring those within it.
    int64_t overlong = 0;
    for (const planner::MicroBatch& part : plan.parts) {
      overlong +=
          part.overlong || (part.indices.size() == 1 && CapMeasure(part, o.cap_mode) > cap) ? 1 : 0;
    }
    line("over the cap", absl::StrCat(s.over_cap_parts, " micro-batches (", overlong,
                                      " holding one sequence longer than the cap)"));
  }
  line("dropped", absl::StrCat(plan.dropped.size(), " sequences"));
  if (s.naive_padded_tokens > 0) {
    const int64_t longest =
        s.num_kept > 0 ? s.naive_padded_tokens / s.num_kept : 0;  // exact: n x longest
    line("padding",
         absl::StrCat("a naive [", s.num_kept, " x ", longest, "] batch holds ",
                      s.naive_padded_tokens, " tokens, ",
                      Percent(s.naive_padded_tokens - s.total_tokens, s.naive_padded_tokens),
                      " of them padding; packed ", s.packed_tokens, " (",
                      Percent(s.packed_tokens - s.total_tokens, s.packed_tokens), " padding)"));
  }
  line("tokens", absl::StrCat("logical ", s.total_tokens, ", executed ", s.packed_tokens,
                              " (rows, padding included), forwarded ", s.forwarded_tokens));
  line("planning time", absl::StrFormat("%.3f ms", run.plan_seconds * 1e3));
  return out;
}

}  // namespace packsched::cli
