#ifndef PACKSCHED_TESTS_PLANNER_PLAN_CHECKS_H_
#define PACKSCHED_TESTS_PLANNER_PLAN_CHECKS_H_

// Invariants every plan must satisfy, checked from the plan and its input alone (no knowledge
// of how the planner works), so property tests can run them over thousands of inputs.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "server/planner/options.h"
#include "server/planner/plan.h"

namespace packsched::planner::testing {

inline int64_t RoundUp(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

// The cap measure of a part as the contract defines it.
inline int64_t CapMeasure(const MicroBatch& part, const PlanOptions& o) {
  return o.cap_mode == CapMode::kTokens ? part.total : part.padded_tokens;
}

inline int64_t CostOf(int64_t length, const PlanOptions& o) {
  const int64_t a = RoundUp(length, o.align_to);
  return o.cost == CostModel::kTokens ? a : o.attention.linear * a + o.attention.quadratic * a * a;
}

// Returns "" if `plan` is a consistent plan of `lengths` under `o`, else what is wrong.
// Checks: every kept index exactly once, ascending inside parts; reorder/revert/dropped agree;
// per-part metadata (tokens, totals, cu_seqlens, max lengths, cost, empty) recomputed from the
// lengths; and (when `cap_guaranteed`) no part over the cap or the sequence limit.
std::string CheckPlan(absl::Span<const int64_t> lengths, const PlanOptions& o,
                      const MicroBatchPlan& plan, bool cap_guaranteed);

}  // namespace packsched::planner::testing

#endif  // PACKSCHED_TESTS_PLANNER_PLAN_CHECKS_H_
