#include "tests/planner/plan_checks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace packsched::planner::testing {

std::string CheckPlan(absl::Span<const int64_t> lengths, const PlanOptions& o,
                      const MicroBatchPlan& plan, bool cap_guaranteed) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  if (static_cast<int64_t>(plan.revert.size()) != n) return "revert has the wrong size";
  std::vector<int> seen(n, 0);
  std::vector<int64_t> reorder;
  for (size_t p = 0; p < plan.parts.size(); ++p) {
    const MicroBatch& part = plan.parts[p];
    const std::string where = absl::StrCat("part ", p, ": ");
    if (!std::is_sorted(part.indices.begin(), part.indices.end())) return where + "not ascending";
    if (part.empty != part.indices.empty()) return where + "empty flag wrong";
    if (part.cu_seqlens.size() != part.indices.size() + 1 ||
        part.cu_seqlens_aligned.size() != part.indices.size() + 1) {
      return where + "cu_seqlens size";
    }
    int64_t tokens = 0, aligned = 0, cost = 0, longest = 0, longest_aligned = 0;
    if (part.cu_seqlens[0] != 0 || part.cu_seqlens_aligned[0] != 0) return where + "cu[0] != 0";
    for (size_t j = 0; j < part.indices.size(); ++j) {
      const int64_t i = part.indices[j];
      if (i < 0 || i >= n) return where + "index out of range";
      ++seen[i];
      reorder.push_back(i);
      const int64_t a = RoundUp(lengths[i], o.align_to);
      tokens += lengths[i];
      aligned += a;
      cost += CostOf(lengths[i], o);
      longest = std::max(longest, lengths[i]);
      longest_aligned = std::max(longest_aligned, a);
      if (part.cu_seqlens[j + 1] != tokens || part.cu_seqlens_aligned[j + 1] != aligned) {
        return where + "cu_seqlens wrong";
      }
    }
    if (part.tokens != tokens || part.aligned_tokens != aligned || part.cost != cost ||
        part.max_seqlen != longest || part.max_seqlen_aligned != longest_aligned ||
        part.total != RoundUp(aligned, o.align_total_to) ||
        part.padded_tokens != static_cast<int64_t>(part.indices.size()) * longest_aligned) {
      return where + "metadata wrong";
    }
    if (cap_guaranteed) {
      if (o.max_token_len > 0 && !part.overlong && CapMeasure(part, o) > o.max_token_len) {
        return absl::StrCat(where, "over the cap: ", CapMeasure(part, o), " > ", o.max_token_len);
      }
      if (o.max_seqs_per_micro_batch > 0 &&
          static_cast<int64_t>(part.indices.size()) > o.max_seqs_per_micro_batch) {
        return where + "over max_seqs_per_micro_batch";
      }
    }
    if (part.overlong && part.indices.size() != 1) return where + "overlong part not alone";
  }
  if (reorder != plan.reorder) return "reorder is not the parts' indices in order";
  std::vector<int64_t> dropped;
  for (int64_t i = 0; i < n; ++i) {
    if (seen[i] > 1) return absl::StrCat("index ", i, " planned twice");
    if (seen[i] == 0) dropped.push_back(i);
  }
  if (dropped != plan.dropped) return "dropped is not the unplanned indices";
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = plan.revert[i];
    if (seen[i] == 0 ? r != -1
                     : (r < 0 || r >= static_cast<int64_t>(reorder.size()) || reorder[r] != i)) {
      return absl::StrCat("revert[", i, "] = ", r, " does not invert reorder");
    }
  }
  if (plan.stats.num_kept != static_cast<int64_t>(reorder.size())) return "num_kept wrong";
  return "";
}

}  // namespace packsched::planner::testing
