#include "server/planner/assemble.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "server/base/checked_math.h"

namespace packsched::planner::internal {
namespace {

// `members` is the caller's scratch: sorted here.
MicroBatch MakePart(std::vector<Item>& members, const Validated& v, bool overlong) {
  std::sort(members.begin(), members.end(),
            [](const Item& a, const Item& b) { return a.index < b.index; });
  MicroBatch part;
  part.empty = members.empty();
  part.overlong = overlong;
  part.indices.reserve(members.size());
  part.cu_seqlens.reserve(members.size() + 1);
  part.cu_seqlens_aligned.reserve(members.size() + 1);
  part.cu_seqlens.push_back(0);
  part.cu_seqlens_aligned.push_back(0);
  for (const Item& item : members) {
    part.indices.push_back(item.index);
    part.tokens += item.length;
    part.aligned_tokens += item.aligned;
    part.cost += item.cost;
    part.max_seqlen = std::max(part.max_seqlen, item.length);
    part.max_seqlen_aligned = std::max(part.max_seqlen_aligned, item.aligned);
    // Validation bounds every part's aligned total by kMaxLength (int32).
    part.cu_seqlens.push_back(static_cast<int32_t>(part.tokens));
    part.cu_seqlens_aligned.push_back(static_cast<int32_t>(part.aligned_tokens));
  }
  part.total = *CheckedRoundUp(part.aligned_tokens, v.options.align_total_to);
  part.padded_tokens = static_cast<int64_t>(members.size()) * part.max_seqlen_aligned;
  return part;
}

int64_t FirstIndex(const MicroBatch& part) {
  return part.empty ? std::numeric_limits<int64_t>::max() : part.indices.front();
}

void Order(std::vector<MicroBatch>& parts, PartOrder order) {
  auto by_index = [](const MicroBatch& a, const MicroBatch& b) {
    return FirstIndex(a) < FirstIndex(b);
  };
  auto by_cost_asc = [](const MicroBatch& a, const MicroBatch& b) {
    return a.cost != b.cost ? a.cost < b.cost : FirstIndex(a) < FirstIndex(b);
  };
  switch (order) {
    case PartOrder::kIndex:
      std::sort(parts.begin(), parts.end(), by_index);
      return;
    case PartOrder::kCostDesc:
      std::sort(parts.begin(), parts.end(), [](const MicroBatch& a, const MicroBatch& b) {
        return a.cost != b.cost ? a.cost > b.cost : FirstIndex(a) < FirstIndex(b);
      });
      return;
    case PartOrder::kInterleave: {
      // Ascending costs dealt to the two ends in turn: the largest land in the middle.
      std::sort(parts.begin(), parts.end(), by_cost_asc);
      std::vector<MicroBatch> out(parts.size());
      size_t front = 0, back = parts.size();
      for (size_t i = 0; i < parts.size(); ++i) {
        out[i % 2 == 0 ? front++ : --back] = std::move(parts[i]);
      }
      parts = std::move(out);
      return;
    }
  }
}

}  // namespace

MicroBatchPlan Assemble(const Validated& v, const Parts& parts, int64_t lower_bound_k,
                        int64_t local_k) {
  MicroBatchPlan plan;
  plan.parts.reserve(parts.size() + v.isolated.size());
  std::vector<Item> members;  // reused for every part
  for (const std::vector<int32_t>& positions : parts) {
    members.clear();
    for (int32_t position : positions) members.push_back(v.items[position]);
    plan.parts.push_back(MakePart(members, v, /*overlong=*/false));
  }
  for (const Item& item : v.isolated) {
    members.assign(1, item);
    plan.parts.push_back(MakePart(members, v, /*overlong=*/true));
  }
  Order(plan.parts, v.options.order);

  plan.revert.assign(v.num_sequences, -1);
  plan.reorder.reserve(v.items.size() + v.isolated.size());
  plan.dropped = v.dropped;
  PlanStats& s = plan.stats;
  s.num_sequences = v.num_sequences;
  s.min_part_cost = plan.parts.empty() ? 0 : std::numeric_limits<int64_t>::max();
  int64_t longest = 0;
  for (const MicroBatch& part : plan.parts) {
    for (int64_t index : part.indices) {
      plan.revert[index] = static_cast<int64_t>(plan.reorder.size());
      plan.reorder.push_back(index);
    }
    s.total_tokens += part.tokens;
    s.total_cost += part.cost;
    s.max_part_cost = std::max(s.max_part_cost, part.cost);
    s.min_part_cost = std::min(s.min_part_cost, part.cost);
    s.packed_tokens += part.total;
    longest = std::max(longest, part.max_seqlen);
    PartLoad load{part.cost, part.aligned_tokens, static_cast<int64_t>(part.indices.size()),
                  part.max_seqlen_aligned};
    if (v.capacity.Over(load)) ++s.over_cap_parts;
  }
  s.num_kept = static_cast<int64_t>(plan.reorder.size());
  s.naive_padded_tokens = s.num_kept * longest;
  s.imbalance = s.total_cost == 0 ? 0.0
                                  : static_cast<double>(s.max_part_cost) *
                                        static_cast<double>(plan.parts.size()) /
                                        static_cast<double>(s.total_cost);
  s.lower_bound_k = lower_bound_k;
  s.local_k = local_k;
  return plan;
}

}  // namespace packsched::planner::internal
