// Coordinator mode: one global batch balanced over data-parallel ranks, then every rank's
// micro-batches with one common k. No collective is needed: the caller sees the whole batch.

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/local_search.h"
#include "server/planner/lpt.h"
#include "server/planner/planner.h"
#include "server/planner/prepared.h"

namespace packsched::planner {
namespace {

using internal::Capacity;
using internal::Item;
using internal::Parts;

// A unit of assignment: one sequence, or one group of sequences that must share a rank.
// As an Item, `aligned` carries its sequence count so the count bound can reuse Capacity.
struct Units {
  std::vector<Item> items;
  std::vector<std::vector<int64_t>> members;  // global indices of each unit
  int64_t largest = 1;                        // most sequences in one unit
};

Units MakeUnits(const internal::Validated& v, absl::Span<const int64_t> group_ids) {
  std::vector<Item> kept = v.items;
  kept.insert(kept.end(), v.isolated.begin(), v.isolated.end());
  std::sort(kept.begin(), kept.end(),
            [](const Item& a, const Item& b) { return a.index < b.index; });
  Units units;
  absl::flat_hash_map<int64_t, size_t> unit_of_group;
  for (const Item& item : kept) {
    size_t unit = units.items.size();
    if (!group_ids.empty()) {
      auto [it, inserted] = unit_of_group.emplace(group_ids[item.index], unit);
      unit = it->second;
    }
    if (unit == units.items.size()) {
      units.items.push_back(Item{static_cast<int64_t>(unit), 0, 0, 0});
      units.members.emplace_back();
    }
    units.items[unit].cost += item.cost;
    units.items[unit].aligned += 1;
    units.members[unit].push_back(item.index);
    units.largest = std::max(units.largest, units.items[unit].aligned);
  }
  return units;
}

// Units to ranks: LPT by cost under per-rank count bounds, then moves and swaps that keep the
// bounds. Without groups the counts are exact (differ by at most one) and only swaps run.
Parts AssignUnits(const Units& units, int64_t world_size, int64_t num_sequences, bool grouped) {
  std::vector<int64_t> costs;
  for (const Item& unit : units.items) costs.push_back(unit.cost);
  const std::vector<int32_t> order = internal::OrderByCostDesc(costs);
  if (!grouped) {
    std::vector<int64_t> limits(world_size, num_sequences / world_size);
    for (int64_t r = 0; r < num_sequences % world_size; ++r) ++limits[r];
    internal::LocalSearch search(units.items, Capacity(), internal::Lpt(costs, order, limits));
    search.Rebalance(/*keep_counts=*/true);
    return search.Take();
  }
  // Greedy LPT that skips ranks whose count would pass the bound; it never runs out of ranks:
  // a unit fails everywhere only if every rank already holds >= ceil(n / W) sequences.
  const int64_t bound = CeilDiv(num_sequences, world_size) + units.largest - 1;
  Parts ranks(world_size);
  std::vector<internal::PartLoad> loads(world_size);
  for (int32_t unit : order) {
    int64_t best = -1;
    for (int64_t r = 0; r < world_size; ++r) {
      if (loads[r].aligned + units.items[unit].aligned > bound) continue;
      if (best < 0 || loads[r].cost < loads[best].cost) best = r;
    }
    ranks[best].push_back(unit);
    loads[best].Add(units.items[unit]);
  }
  internal::LocalSearch search(units.items, Capacity(bound, CapMode::kTokens, 0), std::move(ranks));
  search.Rebalance(/*keep_counts=*/false);
  return search.Take();
}

}  // namespace

absl::StatusOr<BalancedBatch> BalanceBatch(absl::Span<const int64_t> lengths, int64_t world_size,
                                           const PlanOptions& options,
                                           absl::Span<const int64_t> group_ids) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", world_size, ": must be in [1, ", kMaxWorldSize, "]"));
  }
  if (!group_ids.empty() && group_ids.size() != lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group_ids has ", group_ids.size(),
                                                   " entries for ", lengths.size(),
                                                   " lengths; give one per sequence or none"));
  }
  ASSIGN_OR_RETURN(internal::Validated v,
                   internal::Validate(lengths, options, /*cap_required=*/true, /*balancing=*/true));
  // Every rank gets k micro-batches, empty ones included: bound the total before any of them is
  // allocated (one group of many short sequences on a large world makes k large on one rank and
  // W x k micro-batches in all). First with the least k can be, before W problems are made.
  auto bounded = [&](int64_t k) -> absl::Status {
    const std::optional<int64_t> total = CheckedMul(world_size, k);
    if (total && *total <= options.max_micro_batches) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("the batch needs world_size = ", world_size, " x k = ", k, " = ",
                     total ? absl::StrCat(*total) : std::string("more than 2^63"),
                     " micro-batches over all ranks, more than max_micro_batches = ",
                     options.max_micro_batches));
  };
  RETURN_IF_ERROR(bounded(std::max<int64_t>({options.min_micro_batches, options.divisible_by, 1})));
  const Units units = MakeUnits(v, group_ids);
  const int64_t kept = static_cast<int64_t>(v.items.size() + v.isolated.size());
  const Parts assignment = AssignUnits(units, world_size, kept, !group_ids.empty());

  BalancedBatch out;
  out.dropped = v.dropped;
  out.ranks.resize(world_size);
  std::vector<Problem> problems;
  problems.reserve(world_size);
  for (int64_t r = 0; r < world_size; ++r) {
    RankBatch& rank = out.ranks[r];
    for (int32_t unit : assignment[r]) {
      rank.cost += units.items[unit].cost;
      for (int64_t index : units.members[unit]) rank.indices.push_back(index);
    }
    std::sort(rank.indices.begin(), rank.indices.end());
    std::vector<int64_t> local_lengths;
    local_lengths.reserve(rank.indices.size());
    for (int64_t index : rank.indices) local_lengths.push_back(lengths[index]);
    ASSIGN_OR_RETURN(Problem problem, Problem::Create(local_lengths, options));
    out.num_micro_batches = std::max(out.num_micro_batches, problem.local_k());
    problems.push_back(std::move(problem));
  }
  RETURN_IF_ERROR(bounded(out.num_micro_batches));
  for (int64_t r = 0; r < world_size; ++r) {
    ASSIGN_OR_RETURN(out.ranks[r].plan, problems[r].Partition(out.num_micro_batches));
  }
  return out;
}

}  // namespace packsched::planner
