#include "server/planner/assemble.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "server/base/checked_math.h"

namespace packsched::planner::internal {
namespace {

// A part over `count` items in index order, item j being `item_at(j)`.
template <typename ItemAt>
MicroBatch MakePart(size_t count, ItemAt item_at, const Validated& v, bool overlong) {
  MicroBatch part;
  part.empty = count == 0;
  part.overlong = overlong;
  part.indices.reserve(count);
  part.cu_seqlens.reserve(count + 1);
  part.cu_seqlens_aligned.reserve(count + 1);
  part.cu_seqlens.push_back(0);
  part.cu_seqlens_aligned.push_back(0);
  for (size_t j = 0; j < count; ++j) {
    const Item& item = item_at(j);
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
  part.padded_tokens = static_cast<int64_t>(count) * part.max_seqlen_aligned;
  return part;
}

}  // namespace

// Sorts `keys` into the plan's part order. Keys tie only between empty parts, which are equal
// in every field, so which of them goes first changes nothing.
void OrderParts(std::vector<PartKey>& keys, PartOrder order) {
  auto by_cost_asc = [](const PartKey& a, const PartKey& b) {
    return a.cost != b.cost ? a.cost < b.cost : a.first_index < b.first_index;
  };
  switch (order) {
    case PartOrder::kIndex:
      std::sort(keys.begin(), keys.end(),
                [](const PartKey& a, const PartKey& b) { return a.first_index < b.first_index; });
      return;
    case PartOrder::kCostDesc:
      std::sort(keys.begin(), keys.end(), [](const PartKey& a, const PartKey& b) {
        return a.cost != b.cost ? a.cost > b.cost : a.first_index < b.first_index;
      });
      return;
    case PartOrder::kInterleave: {
      // Ascending costs dealt to the two ends in turn: the largest land in the middle.
      std::sort(keys.begin(), keys.end(), by_cost_asc);
      std::vector<PartKey> out(keys.size());
      size_t front = 0, back = keys.size();
      for (size_t i = 0; i < keys.size(); ++i) out[i % 2 == 0 ? front++ : --back] = keys[i];
      keys = std::move(out);
      return;
    }
  }
}

MicroBatchPlan Assemble(const Validated& v, const Parts& parts, int64_t lower_bound_k,
                        int64_t local_k) {
  // Every part's positions in ascending order (= original index order: v.items is in input
  // order), laid out part after part by one pass over the positions instead of a sort per part.
  std::vector<int32_t> begin(parts.size() + 1, 0);
  for (size_t p = 0; p < parts.size(); ++p) {
    begin[p + 1] = begin[p] + static_cast<int32_t>(parts[p].size());
  }
  std::vector<int32_t> part_of(v.items.size(), -1);
  for (size_t p = 0; p < parts.size(); ++p) {
    for (int32_t position : parts[p]) part_of[position] = static_cast<int32_t>(p);
  }
  std::vector<int32_t> sorted(begin.back());
  {
    std::vector<int32_t> cursor(begin.begin(), begin.end() - 1);
    for (int32_t position = 0; position < static_cast<int32_t>(v.items.size()); ++position) {
      if (part_of[position] >= 0) sorted[cursor[part_of[position]]++] = position;
    }
  }

  std::vector<PartKey> keys(parts.size() + v.isolated.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    PartKey& key = keys[p];
    key.part = static_cast<int32_t>(p);
    for (int32_t s = begin[p]; s < begin[p + 1]; ++s) key.cost += v.items[sorted[s]].cost;
    if (begin[p] < begin[p + 1]) key.first_index = v.items[sorted[begin[p]]].index;
  }
  for (size_t i = 0; i < v.isolated.size(); ++i) {
    PartKey& key = keys[parts.size() + i];
    key.part = static_cast<int32_t>(parts.size() + i);
    key.cost = v.isolated[i].cost;
    key.first_index = v.isolated[i].index;
  }
  OrderParts(keys, v.options.order);

  MicroBatchPlan plan;
  plan.parts.reserve(keys.size());
  for (const PartKey& key : keys) {
    if (static_cast<size_t>(key.part) < parts.size()) {
      const int32_t* members = sorted.data() + begin[key.part];
      plan.parts.push_back(MakePart(
          begin[key.part + 1] - begin[key.part],
          [&](size_t j) -> const Item& { return v.items[members[j]]; }, v, /*overlong=*/false));
    } else {
      const Item& item = v.isolated[key.part - parts.size()];
      plan.parts.push_back(MakePart(
          1, [&](size_t) -> const Item& { return item; }, v, /*overlong=*/true));
    }
  }

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
  s.forwarded_tokens = s.total_tokens;
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
