#include "server/planner/grid_plans.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/assemble.h"
#include "server/planner/plan_memory.h"

namespace packsched::planner::internal {
namespace {

// Puts `plan`'s parts in the order `perm` (plan.parts[j] becomes the old parts[perm[j]]) and
// rebuilds reorder and revert to match.
void PermuteParts(MicroBatchPlan& plan, const std::vector<int32_t>& perm) {
  std::vector<MicroBatch> parts;
  parts.reserve(perm.size());
  for (int32_t p : perm) parts.push_back(std::move(plan.parts[p]));
  plan.parts = std::move(parts);
  plan.reorder.clear();
  std::fill(plan.revert.begin(), plan.revert.end(), -1);
  for (const MicroBatch& part : plan.parts) {
    for (int64_t index : part.indices) {
      plan.revert[index] = static_cast<int64_t>(plan.reorder.size());
      plan.reorder.push_back(index);
    }
  }
}

}  // namespace

int64_t FewestCells(const Validated& v) {
  int64_t aligned = 0;
  for (const Item& item : v.items) aligned += item.aligned;
  int64_t cells = v.capacity.has_cap() ? CeilDiv(aligned, v.capacity.cap()) : 0;
  if (v.capacity.max_seqs() > 0) {
    cells = std::max(cells, CeilDiv(static_cast<int64_t>(v.items.size()), v.capacity.max_seqs()));
  }
  return cells + static_cast<int64_t>(v.isolated.size());
}

int64_t StepLowerBound(const Validated& v, int64_t world_size, int64_t alpha) {
  int64_t cost = 0, largest = 0;
  for (const auto* list : {&v.items, &v.isolated}) {
    for (const Item& item : *list) {
      cost += item.cost;
      largest = std::max(largest, item.cost);
    }
  }
  if (cost == 0) return 0;
  return std::max(CeilDiv(cost + alpha * FewestCells(v), world_size), alpha + largest);
}

absl::StatusOr<std::vector<RankBatch>> RanksOfGrid(const Grid& grid,
                                                   absl::Span<const SlotItem> items,
                                                   absl::Span<const int64_t> lengths,
                                                   const PlanOptions& options,
                                                   absl::Span<const int64_t> costs) {
  const int64_t k = grid.k;
  std::vector<PartKey> keys(k);
  for (int64_t i = 0; i < k; ++i) {
    keys[i].part = static_cast<int32_t>(i);
    for (int64_t r = 0; r < grid.world_size; ++r) {
      int64_t cost = 0;
      for (int32_t position : grid.cell(r, i)) {
        cost += items[position].item.cost;
        keys[i].first_index = std::min(keys[i].first_index, items[position].item.index);
      }
      keys[i].cost = std::max(keys[i].cost, cost);
    }
  }
  OrderParts(keys, options.order);
  std::vector<int32_t> perm;
  perm.reserve(keys.size());
  for (const PartKey& key : keys) perm.push_back(key.part);

  std::vector<RankBatch> ranks(grid.world_size);
  for (int64_t r = 0; r < grid.world_size; ++r) {
    RankBatch& rank = ranks[r];
    for (int64_t i = 0; i < k; ++i) {
      for (int32_t position : grid.cell(r, i)) {
        rank.indices.push_back(items[position].item.index);
        rank.cost += items[position].item.cost;
      }
    }
    std::sort(rank.indices.begin(), rank.indices.end());
    auto local_of = [&](int64_t index) {
      return static_cast<int64_t>(
          std::lower_bound(rank.indices.begin(), rank.indices.end(), index) - rank.indices.begin());
    };
    std::vector<int64_t> local_lengths;
    local_lengths.reserve(rank.indices.size());
    for (int64_t index : rank.indices) local_lengths.push_back(lengths[index]);
    std::vector<int64_t> local_costs;
    if (!costs.empty()) {
      for (int64_t index : rank.indices) local_costs.push_back(costs[index]);
    }
    ASSIGN_OR_RETURN(Validated local, Validate(local_lengths, options, /*cap_required=*/true,
                                               /*balancing=*/true, local_costs));
    // Local index -> position in local.items (-1: isolated), and -> slot.
    std::vector<int32_t> position_of(local_lengths.size(), -1);
    for (size_t j = 0; j < local.items.size(); ++j) {
      position_of[local.items[j].index] = static_cast<int32_t>(j);
    }
    std::vector<int32_t> slot_of(local_lengths.size(), 0);
    PlanArena arena;  // the parts are gone before it (Assemble copies out)
    {
      Parts parts(PlanMemory());
      for (int64_t i = 0; i < k; ++i) {
        const std::vector<int32_t>& cell = grid.cell(r, i);
        bool isolated = false;
        Part part(PlanMemory());
        for (int32_t position : cell) {
          const int64_t local_index = local_of(items[position].item.index);
          slot_of[local_index] = static_cast<int32_t>(i);
          isolated = isolated || items[position].isolated;
          if (position_of[local_index] >= 0) part.push_back(position_of[local_index]);
        }
        if (!isolated) parts.push_back(std::move(part));
      }
      const int64_t lower_bound_k =
          std::max({FewestCells(local), options.min_micro_batches, int64_t{1}});
      rank.plan = Assemble(local, parts, lower_bound_k, k);
    }
    // Assemble's order -> slot order (empty parts take the free slots), then the common order.
    std::vector<int32_t> by_slot(k, -1);
    std::vector<int32_t> empties;
    for (size_t p = 0; p < rank.plan.parts.size(); ++p) {
      const MicroBatch& part = rank.plan.parts[p];
      if (part.empty) {
        empties.push_back(static_cast<int32_t>(p));
      } else {
        by_slot[slot_of[part.indices.front()]] = static_cast<int32_t>(p);
      }
    }
    for (int32_t& p : by_slot) {
      if (p < 0) {
        p = empties.back();
        empties.pop_back();
      }
    }
    std::vector<int32_t> order(k);
    for (int64_t j = 0; j < k; ++j) order[j] = by_slot[perm[j]];
    PermuteParts(rank.plan, order);
  }
  return ranks;
}

StepStats StepOf(const BalancedBatch& out, const Validated& v, int64_t world_size,
                 const BalanceOptions& balance) {
  const int64_t alpha = balance.micro_batch_cost;
  StepStats s;
  std::vector<int64_t> slot_max(out.num_micro_batches, 0);
  for (const RankBatch& rank : out.ranks) {
    int64_t total = 0;
    for (size_t i = 0; i < rank.plan.parts.size(); ++i) {
      const MicroBatch& part = rank.plan.parts[i];
      const int64_t cost = part.empty ? 0 : alpha + part.cost;
      total += cost;
      slot_max[i] = std::max(slot_max[i], cost);
    }
    s.step_sync_cost = std::max(s.step_sync_cost, total);
  }
  for (int64_t cost : slot_max) s.micro_batch_sync_cost += cost;
  int64_t cost = 0, aligned = 0;
  for (const auto* list : {&v.items, &v.isolated}) {
    for (const Item& item : *list) {
      cost += item.cost;
      aligned += item.aligned;
    }
  }
  const int64_t k_min = CeilDiv(aligned, world_size * v.options.max_token_len);
  s.ideal = (static_cast<double>(cost) + static_cast<double>(alpha) * static_cast<double>(k_min) *
                                             static_cast<double>(world_size)) /
            static_cast<double>(world_size);
  // Within int64: the plan itself has at least FewestCells micro-batches, each paying alpha.
  s.lower_bound = StepLowerBound(v, world_size, alpha);
  const int64_t actual = balance.sync == Sync::kStep ? s.step_sync_cost : s.micro_batch_sync_cost;
  s.efficiency = actual == 0 ? 1.0 : s.ideal / static_cast<double>(actual);
  s.lower_bound_efficiency =
      s.lower_bound == 0 ? 1.0 : s.ideal / static_cast<double>(s.lower_bound);
  return s;
}

}  // namespace packsched::planner::internal
