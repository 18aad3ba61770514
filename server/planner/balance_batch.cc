// Coordinator mode: one global batch balanced over data-parallel ranks, then every rank's
// micro-batches with one common k. No collective is needed: the caller sees the whole batch.
// Sync::kStep balances the ranks' totals (each rank then plans as Problem would); Sync::kMicroBatch
// balances the ranks slot by slot over a grid of W x k micro-batches (slot_grid.h).

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/bin_packing.h"
#include "server/planner/cell_greedy.h"
#include "server/planner/grid_plans.h"
#include "server/planner/local_search.h"
#include "server/planner/lpt.h"
#include "server/planner/planner.h"
#include "server/planner/prepared.h"
#include "server/planner/rank_search.h"
#include "server/planner/slot_grid.h"
#include "server/planner/stop_check.h"

namespace packsched::planner {
namespace {

using internal::Capacity;
using internal::FewestCells;
using internal::Grid;
using internal::Item;
using internal::Parts;
using internal::SlotItem;

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

// `value` (>= 0) rounded up to a multiple of `multiple` (>= 1).
int64_t RoundUpTo(int64_t value, int64_t multiple) { return CeilDiv(value, multiple) * multiple; }

// `grid` without its trailing empty slots, down to the least k >= least_k that is a multiple of
// divisible_by.
Grid Trimmed(Grid grid, int64_t least_k, int64_t divisible_by) {
  int64_t used = 0;
  for (int64_t i = 0; i < grid.k; ++i) {
    for (int64_t r = 0; r < grid.world_size; ++r) {
      if (!grid.cell(r, i).empty()) used = i + 1;
    }
  }
  const int64_t k = RoundUpTo(std::max(used, least_k), divisible_by);
  if (k >= grid.k) return grid;
  Grid out{grid.world_size, k, std::vector<std::vector<int32_t>>(grid.world_size * k)};
  for (int64_t r = 0; r < grid.world_size; ++r) {
    for (int64_t i = 0; i < k; ++i) out.cell(r, i) = std::move(grid.cell(r, i));
  }
  return out;
}

// `grid` with empty slots added up to k (none when it has k or more).
Grid Widened(Grid grid, int64_t k) {
  if (k <= grid.k) return grid;
  Grid out{grid.world_size, k, std::vector<std::vector<int32_t>>(grid.world_size * k)};
  for (int64_t r = 0; r < grid.world_size; ++r) {
    for (int64_t i = 0; i < grid.k; ++i) out.cell(r, i) = std::move(grid.cell(r, i));
  }
  return out;
}

// The per-rank plans of `out` as a grid over `items` (slot i of rank r: its i-th micro-batch, or
// with `by_cost` its micro-batches by cost descending).
Grid GridOfPlans(const BalancedBatch& out, absl::Span<const SlotItem> items, int64_t num_sequences,
                 bool by_cost) {
  const int64_t w = static_cast<int64_t>(out.ranks.size());
  const int64_t k = out.num_micro_batches;
  std::vector<int32_t> position_of(num_sequences, -1);
  for (size_t p = 0; p < items.size(); ++p) {
    position_of[items[p].item.index] = static_cast<int32_t>(p);
  }
  Grid grid{w, k, std::vector<std::vector<int32_t>>(w * k)};
  for (int64_t r = 0; r < w; ++r) {
    const RankBatch& rank = out.ranks[r];
    std::vector<int32_t> order(k);
    for (int64_t i = 0; i < k; ++i) order[i] = static_cast<int32_t>(i);
    if (by_cost) {
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return rank.plan.parts[a].cost > rank.plan.parts[b].cost;
      });
    }
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t local : rank.plan.parts[order[i]].indices) {
        grid.cell(r, i).push_back(position_of[rank.indices[local]]);
      }
    }
  }
  return grid;
}

// Sequences up to which every Sync::kMicroBatch candidate is shortened by moves before they are
// compared (above it, only the shortest is).
constexpr int64_t kImproveEvery = int64_t{1} << 12;

// Rounds of ImproveRankTotals for n sequences over W ranks x k: up to 4 W, and about `steps`
// steps in all (a round: the largest rank's items against every cell of a few ranks, a binary
// search in every rank for each, and the ranks sorted).
int64_t RankRounds(int64_t n, int64_t world_size, int64_t k, int64_t steps = int64_t{1} << 24) {
  const int64_t per_round = (n / world_size + 1) * (k + 1) * 4 + 4 * n + 20 * world_size;
  return std::clamp<int64_t>(steps / per_round, 1, 4 * world_size);
}

}  // namespace

absl::StatusOr<BalancedBatch> BalanceBatch(absl::Span<const int64_t> lengths, int64_t world_size,
                                           const PlanOptions& options,
                                           absl::Span<const int64_t> group_ids,
                                           const BalanceOptions& balance,
                                           absl::Span<const int64_t> costs) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", world_size, ": must be in [1, ", kMaxWorldSize, "]"));
  }
  if (!group_ids.empty() && group_ids.size() != lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group_ids has ", group_ids.size(),
                                                   " entries for ", lengths.size(),
                                                   " lengths; give one per sequence or none"));
  }
  if (balance.micro_batch_cost < 0 || balance.micro_batch_cost > kMaxMicroBatchCost) {
    return absl::InvalidArgumentError(absl::StrCat("micro_batch_cost = ", balance.micro_batch_cost,
                                                   ": must be in [0, ", kMaxMicroBatchCost, "]"));
  }
  ASSIGN_OR_RETURN(
      internal::Validated v,
      internal::Validate(lengths, options, /*cap_required=*/true, /*balancing=*/true, costs));
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
  // Every cost a step sums (the sequences' and alpha per micro-batch) fits in int64.
  auto fits = [&](int64_t k) -> absl::Status {
    int64_t cost = 0;
    for (const Item& item : v.items) cost += item.cost;
    for (const Item& item : v.isolated) cost += item.cost;
    const std::optional<int64_t> parts = CheckedMul(world_size, k);
    const std::optional<int64_t> fixed =
        parts ? CheckedMul(balance.micro_batch_cost, *parts) : std::nullopt;
    if (fixed && CheckedAdd(cost, *fixed)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batch_cost = ", balance.micro_batch_cost, " over world_size = ", world_size,
        " x k = ", k, " micro-batches: the step's cost overflows int64"));
  };
  const int64_t least_k = std::max<int64_t>({options.min_micro_batches, options.divisible_by, 1});
  RETURN_IF_ERROR(bounded(least_k));
  const bool grouped = !group_ids.empty();
  internal::StopCheck stop(balance.stop);

  // The sequences as grid items: v.items, then v.isolated.
  std::vector<SlotItem> items;
  items.reserve(v.items.size() + v.isolated.size());
  for (const Item& item : v.items) items.push_back(SlotItem{item, false, -1});
  for (const Item& item : v.isolated) items.push_back(SlotItem{item, true, -1});

  // The k bound (without groups): first-fit-decreasing bins of the global batch over W ranks.
  std::vector<std::vector<int32_t>> bins;
  int64_t k_bound = 0;
  if (!grouped) {
    internal::PlanArena arena;
    for (const internal::Part& bin : internal::FirstFitDecreasing(v.items, v.capacity)) {
      bins.emplace_back(bin.begin(), bin.end());
    }
    for (size_t j = 0; j < v.isolated.size(); ++j) {
      bins.push_back({static_cast<int32_t>(v.items.size() + j)});
    }
    k_bound = RoundUpTo(std::max({CeilDiv(static_cast<int64_t>(bins.size()), world_size), least_k}),
                        options.divisible_by);
  }

  BalancedBatch out;
  out.dropped = v.dropped;
  std::optional<Grid> grid;  // the plan as a grid; nullopt: the per-rank problems below

  // Sync::kStep, one step of divisible_by above the k bound: `best` (the plan so far, a grid of
  // step `best_step`) widened to k_bound + divisible_by slots, the FFD bins by rank total in
  // that many slots and `extra` (if any, widened alike), each with its sequences moved and traded
  // between ranks; the shortest replaces the plan only when it shortens the step by more than
  // 1/1024 (the smaller k wins otherwise). Tried only within max_micro_batches and int64, and
  // only when the lower bound leaves such a gain possible (`worth_one_more`).
  const int64_t k_plus = k_bound + options.divisible_by;
  auto worth_one_more = [&](int64_t best_step) {
    return world_size > 1 && bounded(k_plus).ok() && fits(k_plus).ok() &&
           internal::StepLowerBound(v, world_size, balance.micro_batch_cost) <
               best_step - best_step / 1024;
  };
  auto one_step_more = [&](const Grid& best, int64_t best_step, int64_t kept,
                           std::optional<Grid> extra) -> absl::Status {
    if (!worth_one_more(best_step)) return absl::OkStatus();
    const int64_t alpha = balance.micro_batch_cost;
    const int64_t wanted = best_step - best_step / 1024;
    Grid wider = Widened(best, k_plus);
    Grid from_bins = internal::GridFromBins(bins, items, world_size, k_plus, true);
    Grid from_extra = extra ? Widened(*std::move(extra), k_plus) : Grid{};
    std::optional<Grid> shortest;
    int64_t shortest_step = wanted;
    for (Grid* start : {&wider, &from_bins, &from_extra}) {
      if (start->k == 0) continue;
      internal::ImproveRankTotals(*start, items, v.capacity, alpha,
                                  RankRounds(kept, world_size, k_plus, int64_t{1} << 22),
                                  /*keep_counts=*/false, &stop);
      RETURN_IF_ERROR(stop.status());
      const int64_t cost = internal::CostsOf(*start, items, alpha).step_sync;
      if (cost < shortest_step) {
        shortest_step = cost;
        shortest = std::move(*start);
      }
    }
    if (shortest) grid = Trimmed(*std::move(shortest), least_k, options.divisible_by);
    return absl::OkStatus();
  };

  // Sync::kMicroBatch without groups, the candidates: the slot greedy at each k from the cap's
  // bound up to the k bound (at most three; past about 2^23 cell visits, only until one fits),
  // the row greedy, the FFD bins dealt slot by slot and the cell greedy (cell_greedy.h; inputs
  // with n k W up to kCellGreedyVisits), each shortened by moves before they are compared.
  if (!grouped && balance.sync == Sync::kMicroBatch) {
    RETURN_IF_ERROR(bounded(k_bound));
    RETURN_IF_ERROR(fits(k_bound));
    const int64_t alpha = balance.micro_batch_cost;
    const int64_t k_low =
        RoundUpTo(std::max(CeilDiv(FewestCells(v), world_size), least_k), options.divisible_by);
    std::vector<Grid> candidates;
    const std::vector<int32_t> order = internal::PlacementOrder(items);
    const int64_t n = static_cast<int64_t>(items.size());
    int64_t work = 0;
    for (int64_t k = k_low, tries = 0; k <= k_bound && tries < 3; k += options.divisible_by) {
      if (!candidates.empty() && work > (int64_t{1} << 23)) break;
      ++tries;
      work += n * (k + world_size);
      std::optional<Grid> filled =
          internal::FillSlots(items, order, v.capacity, world_size, k, alpha, &stop);
      RETURN_IF_ERROR(stop.status());
      if (filled) candidates.push_back(*std::move(filled));
    }
    // The slots filled one after the other (better on some heavy-tailed batches).
    std::optional<Grid> rows =
        internal::FillRows(items, order, v.capacity, world_size, k_bound, alpha, &stop);
    RETURN_IF_ERROR(stop.status());
    if (rows) candidates.push_back(Trimmed(*std::move(rows), least_k, options.divisible_by));
    candidates.push_back(
        internal::GridFromBins(bins, items, world_size, k_bound, /*by_rank_total=*/false));
    const size_t constructions = candidates.size();  // the cell greedy's, if any, follows
    if (n <= internal::kCellGreedyVisits / (k_bound * world_size)) {
      std::optional<Grid> cells =
          internal::FillCells(items, order, v.capacity, world_size, k_bound, alpha, &stop);
      RETURN_IF_ERROR(stop.status());
      if (cells) candidates.push_back(Trimmed(*std::move(cells), least_k, options.divisible_by));
    }
    // The shortest of candidates[first, last) (ties: the fewer micro-batches, then the earlier).
    auto shortest = [&](size_t first, size_t last) {
      size_t best = first;
      int64_t best_cost = 0;
      for (size_t c = first; c < last; ++c) {
        const int64_t cost = internal::CostsOf(candidates[c], items, alpha).micro_batch_sync;
        if (c == first || cost < best_cost ||
            (cost == best_cost && candidates[c].k < candidates[best].k)) {
          best = c;
          best_cost = cost;
        }
      }
      return best;
    };
    // Moves shorten every candidate on inputs of up to kImproveEvery sequences; above it, the
    // shortest of the other constructions and the cell greedy's. The shortest after them wins.
    std::vector<char> improve(candidates.size(), n <= kImproveEvery ? 1 : 0);
    improve[shortest(0, constructions)] = 1;
    if (candidates.size() > constructions) improve[constructions] = 1;
    // Swaps search every cell's members for each member of a slot's costliest cell: about
    // n^2 / W a pass, affordable below 2^24.
    const bool swaps = n * n / world_size <= (int64_t{1} << 24);
    std::vector<Grid> improved;
    for (size_t c = 0; c < candidates.size(); ++c) {
      if (!improve[c]) continue;
      internal::ImproveSlots(candidates[c], items, v.capacity, alpha, swaps ? 16 : 4, swaps, &stop);
      RETURN_IF_ERROR(stop.status());
      improved.push_back(std::move(candidates[c]));
    }
    candidates = std::move(improved);
    grid = std::move(candidates[shortest(0, candidates.size())]);
  } else {
    // Ranks first (today's Sync::kStep), each rank's own bound, k = the largest.
    const Units units = MakeUnits(v, group_ids);
    const int64_t kept = static_cast<int64_t>(v.items.size() + v.isolated.size());
    const Parts assignment = AssignUnits(units, world_size, kept, grouped);
    if (!stop.ContinueNow()) return stop.status();
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
      std::vector<int64_t> local_costs;
      local_lengths.reserve(rank.indices.size());
      for (int64_t index : rank.indices) local_lengths.push_back(lengths[index]);
      if (!costs.empty()) {
        for (int64_t index : rank.indices) local_costs.push_back(costs[index]);
      }
      if (!stop.Continue(static_cast<int64_t>(local_lengths.size()) + 64)) return stop.status();
      ASSIGN_OR_RETURN(Problem problem, Problem::Create(local_lengths, options,
                                                        /*cap_optional=*/false, local_costs));
      out.num_micro_batches = std::max(out.num_micro_batches, problem.local_k());
      problems.push_back(std::move(problem));
    }
    if (!grouped && out.num_micro_batches > k_bound) {
      // Equal counts would need more micro-batches than the bound: whole FFD bins instead, then
      // moves and trades of sequences between ranks.
      RETURN_IF_ERROR(bounded(k_bound));
      RETURN_IF_ERROR(fits(k_bound));
      grid = internal::GridFromBins(bins, items, world_size, k_bound, /*by_rank_total=*/true);
      internal::ImproveRankTotals(*grid, items, v.capacity, balance.micro_batch_cost,
                                  RankRounds(kept, world_size, k_bound), /*keep_counts=*/false,
                                  &stop);
      RETURN_IF_ERROR(stop.status());
      const int64_t bins_step = internal::CostsOf(*grid, items, balance.micro_batch_cost).step_sync;
      if (balance.sync == Sync::kStep && worth_one_more(bins_step)) {
        // The equal-count plan starts the search as well when it needs one step more at most.
        std::optional<Grid> equal;
        if (out.num_micro_batches <= k_plus) {
          for (int64_t r = 0; r < world_size; ++r) {
            if (!stop.Continue(problems[r].num_sequences() + 64)) return stop.status();
            ASSIGN_OR_RETURN(out.ranks[r].plan, problems[r].Partition(out.num_micro_batches));
          }
          equal = GridOfPlans(out, items, v.num_sequences, /*by_cost=*/false);
        }
        RETURN_IF_ERROR(one_step_more(*grid, bins_step, kept, std::move(equal)));
      }
    } else {
      RETURN_IF_ERROR(bounded(out.num_micro_batches));
      RETURN_IF_ERROR(fits(out.num_micro_batches));
      for (int64_t r = 0; r < world_size; ++r) {
        if (!stop.Continue(problems[r].num_sequences() + 64)) return stop.status();
        ASSIGN_OR_RETURN(out.ranks[r].plan, problems[r].Partition(out.num_micro_batches));
      }
      if (!grouped && balance.sync == Sync::kStep && kept > world_size) {
        // Trades of sequences between ranks (counts stay equal) when they shorten the step; with
        // at most one sequence a rank none can.
        const int64_t alpha = balance.micro_batch_cost;
        int64_t step = 0;
        for (const RankBatch& rank : out.ranks) {
          int64_t total = 0;
          for (const MicroBatch& part : rank.plan.parts)
            total += part.empty ? 0 : alpha + part.cost;
          step = std::max(step, total);
        }
        Grid traded = GridOfPlans(out, items, v.num_sequences, /*by_cost=*/false);
        const int64_t rounds = RankRounds(kept, world_size, traded.k);
        internal::ImproveRankTotals(traded, items, v.capacity, alpha, rounds,
                                    /*keep_counts=*/true, &stop);
        RETURN_IF_ERROR(stop.status());
        const int64_t equal_step = internal::CostsOf(traded, items, alpha).step_sync;
        if (equal_step < step) grid = traded;
        // Counts free, up to the k bound: moves of single sequences as well, from the
        // equal-count plan and from the FFD bins by rank total (about 2^22 steps each). The shorter
        // is taken only when it shortens the step by more than 1/1024 (equal counts are kept
        // otherwise), so none is searched for when the lower bound rules that out.
        int64_t best_step = equal_step;
        int64_t free_step = equal_step - equal_step / 1024;
        const bool may_gain = internal::StepLowerBound(v, world_size, alpha) < free_step;
        Grid from_bins =
            may_gain ? internal::GridFromBins(bins, items, world_size, k_bound, true) : Grid{};
        Grid from_equal = may_gain ? Widened(std::move(traded), k_bound) : Grid{};
        for (Grid* free : {&from_equal, &from_bins}) {
          if (!may_gain) break;
          internal::ImproveRankTotals(*free, items, v.capacity, alpha,
                                      RankRounds(kept, world_size, k_bound, int64_t{1} << 22),
                                      /*keep_counts=*/false, &stop);
          RETURN_IF_ERROR(stop.status());
          const int64_t cost = internal::CostsOf(*free, items, alpha).step_sync;
          if (cost < free_step) {
            free_step = cost;
            best_step = cost;
            grid = Trimmed(std::move(*free), least_k, options.divisible_by);
          }
        }
        if (may_gain) {
          RETURN_IF_ERROR(one_step_more(
              grid ? *grid : GridOfPlans(out, items, v.num_sequences, /*by_cost=*/false), best_step,
              kept, std::nullopt));
        }
      }
      if (grouped && balance.sync == Sync::kMicroBatch) {
        // The ranks stay; their sequences are placed slot by slot, or each rank's partition
        // with its micro-batches by cost descending, whichever step is shorter.
        const int64_t k = out.num_micro_batches;
        Grid today = GridOfPlans(out, items, v.num_sequences, /*by_cost=*/true);
        for (int64_t r = 0; r < world_size; ++r) {
          for (int64_t i = 0; i < k; ++i) {
            for (int32_t position : today.cell(r, i))
              items[position].rank = static_cast<int32_t>(r);
          }
        }
        const int64_t alpha = balance.micro_batch_cost;
        int64_t best_cost = internal::CostsOf(today, items, alpha).micro_batch_sync;
        grid = std::move(today);
        std::optional<Grid> filled = internal::FillSlots(items, internal::PlacementOrder(items),
                                                         v.capacity, world_size, k, alpha, &stop);
        RETURN_IF_ERROR(stop.status());
        if (filled) {
          internal::ImproveSlots(*filled, items, v.capacity, alpha, 4, /*swaps=*/false, &stop);
          RETURN_IF_ERROR(stop.status());
          if (internal::CostsOf(*filled, items, alpha).micro_batch_sync < best_cost) {
            grid = std::move(filled);
          }
        }
      }
    }
  }
  if (!stop.ContinueNow()) return stop.status();
  if (grid) {
    out.num_micro_batches = grid->k;
    ASSIGN_OR_RETURN(out.ranks, internal::RanksOfGrid(*grid, items, lengths, options, costs));
  }
  if (!stop.ContinueNow()) return stop.status();
  out.step = internal::StepOf(out, v, world_size, balance);
  return out;
}

}  // namespace packsched::planner
