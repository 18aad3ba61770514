#include "server/planner/slot_grid.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include "server/planner/lpt.h"

namespace packsched::planner::internal {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

// The cells of a grid as the greedy and the moves see them.
class Cells {
 public:
  Cells(absl::Span<const SlotItem> items, int64_t world_size, int64_t k, int64_t alpha)
      : items_(items),
        alpha_(alpha),
        load_(world_size * k),
        cost_(world_size * k, 0),
        closed_(world_size * k, 0) {}

  int64_t cost(int64_t cell) const { return cost_[cell]; }
  const PartLoad& load(int64_t cell) const { return load_[cell]; }
  bool closed(int64_t cell) const { return closed_[cell] != 0; }
  bool empty(int64_t cell) const { return load_[cell].count == 0; }

  // The cell's cost with `item` added.
  int64_t CostWith(int64_t cell, const SlotItem& item) const {
    return cost_[cell] + item.item.cost + (empty(cell) ? alpha_ : 0);
  }
  // Whether `item` may join `cell` (open; an isolated item only an empty cell).
  bool Accepts(int64_t cell, const SlotItem& item, const Capacity& capacity) const {
    if (closed(cell)) return false;
    if (item.isolated) return empty(cell);
    return capacity.Fits(load_[cell], item.item.aligned);
  }
  void Add(int64_t cell, const SlotItem& item) {
    cost_[cell] = CostWith(cell, item);
    load_[cell].Add(item.item);
    if (item.isolated) closed_[cell] = 1;
  }
  // Recomputes a cell's load and cost from its member list.
  void Reset(int64_t cell, const std::vector<int32_t>& members) {
    load_[cell] = PartLoad{};
    cost_[cell] = 0;
    closed_[cell] = 0;
    for (int32_t position : members) Add(cell, items_[position]);
  }

 private:
  absl::Span<const SlotItem> items_;
  int64_t alpha_;
  std::vector<PartLoad> load_;
  std::vector<int64_t> cost_;
  std::vector<char> closed_;
};

}  // namespace

std::vector<int32_t> PlacementOrder(absl::Span<const SlotItem> items) {
  // items are in index order within the normal and the isolated ones (Validate's order), so
  // ties by position are ties by index.
  std::vector<int64_t> costs(items.size());
  for (size_t p = 0; p < items.size(); ++p) costs[p] = items[p].item.cost;
  std::vector<int32_t> order = OrderByCostDesc(costs);
  std::stable_partition(order.begin(), order.end(), [&](int32_t p) { return items[p].isolated; });
  return order;
}

GridCosts CostsOf(const Grid& grid, absl::Span<const SlotItem> items, int64_t alpha) {
  GridCosts out;
  std::vector<int64_t> slot_max(grid.k, 0);
  for (int64_t r = 0; r < grid.world_size; ++r) {
    int64_t rank_total = 0;
    for (int64_t i = 0; i < grid.k; ++i) {
      const std::vector<int32_t>& cell = grid.cell(r, i);
      int64_t cost = cell.empty() ? 0 : alpha;
      for (int32_t position : cell) cost += items[position].item.cost;
      rank_total += cost;
      slot_max[i] = std::max(slot_max[i], cost);
    }
    out.step_sync = std::max(out.step_sync, rank_total);
  }
  for (int64_t cost : slot_max) out.micro_batch_sync += cost;
  return out;
}

std::optional<Grid> FillSlots(absl::Span<const SlotItem> items, absl::Span<const int32_t> order,
                              const Capacity& capacity, int64_t world_size, int64_t k,
                              int64_t alpha) {
  const int64_t w = world_size;
  // Cells slot-major here (slot i's cells adjacent: i * w + r), rank-major in the grid.
  std::vector<std::vector<int32_t>> members(w * k);
  Cells cells(items, w, k, alpha);
  std::vector<int64_t> slot_max(k, 0);
  std::vector<int64_t> slot_min(k, 0);    // least cost of an open cell (kNone: none open)
  std::vector<int64_t> slot_empty(k, w);  // empty open cells
  std::vector<int64_t> tried(k, -1);      // the placement that found no cell in the slot
  for (size_t step = 0; step < order.size(); ++step) {
    const int32_t position = order[step];
    const SlotItem& item = items[position];
    while (true) {
      // The slot whose largest cell grows least; ties: least room left under it, lowest slot.
      // As one key: the growth when positive, else the room below -2^62 (every fit first).
      auto key_of = [&](int64_t i, int64_t with) {
        const int64_t d = with - slot_max[i];
        return d > 0 ? d : -(int64_t{1} << 62) - d;
      };
      int64_t best = -1, best_key = kNone;
      const int64_t stamp = static_cast<int64_t>(step);
      if (item.rank >= 0) {
        for (int64_t i = 0; i < k; ++i) {
          const int64_t cell = i * w + item.rank;
          if (tried[i] == stamp || cells.closed(cell) || (item.isolated && !cells.empty(cell))) {
            continue;
          }
          const int64_t key = key_of(i, cells.CostWith(cell, item));
          if (key < best_key) {
            best = i;
            best_key = key;
          }
        }
      } else {
        // slot_base: the cost of the slot's cheapest open cell as a new member sees it (alpha
        // for an empty cell; kNone when none is open).
        for (int64_t i = 0; i < k; ++i) {
          const int64_t base = slot_empty[i] > 0 ? alpha : slot_min[i];
          if (base == kNone || tried[i] == stamp || (item.isolated && slot_empty[i] == 0)) {
            continue;
          }
          const int64_t key = key_of(i, base + item.item.cost);
          if (key < best_key) {
            best = i;
            best_key = key;
          }
        }
      }
      if (best < 0) return std::nullopt;
      // The cell; and the slot's two least open costs, to update its least without a rescan.
      int64_t chosen = -1, least = -1, second = kNone;
      const int64_t first_cell = best * w;
      if (item.rank >= 0) {
        const int64_t cell = first_cell + item.rank;
        if (cells.Accepts(cell, item, capacity)) chosen = cell;
      } else {
        for (int64_t cell = first_cell; cell < first_cell + w; ++cell) {
          if (cells.closed(cell)) continue;
          if (least < 0 || cells.cost(cell) < cells.cost(least)) {
            if (least >= 0) second = cells.cost(least);
            least = cell;
          } else {
            second = std::min(second, cells.cost(cell));
          }
          if (!cells.Accepts(cell, item, capacity)) continue;
          if (chosen < 0 || cells.cost(cell) < cells.cost(chosen)) chosen = cell;
        }
      }
      if (chosen < 0) {
        tried[best] = static_cast<int64_t>(step);
        continue;
      }
      const int64_t before = cells.cost(chosen);
      if (cells.empty(chosen)) --slot_empty[best];
      cells.Add(chosen, item);
      members[chosen].push_back(position);
      slot_max[best] = std::max(slot_max[best], cells.cost(chosen));
      const int64_t after = cells.closed(chosen) ? kNone : cells.cost(chosen);
      if (item.rank < 0) {
        slot_min[best] = chosen == least ? std::min(second, after) : cells.cost(least);
      } else if (before == slot_min[best]) {
        slot_min[best] = kNone;
        for (int64_t cell = first_cell; cell < first_cell + w; ++cell) {
          if (!cells.closed(cell)) slot_min[best] = std::min(slot_min[best], cells.cost(cell));
        }
      }
      break;
    }
  }
  Grid grid{w, k, std::vector<std::vector<int32_t>>(w * k)};
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t r = 0; r < w; ++r) grid.cell(r, i) = std::move(members[i * w + r]);
  }
  return grid;
}

void ImproveSlots(Grid& grid, absl::Span<const SlotItem> items, const Capacity& capacity,
                  int64_t alpha, int rounds, bool swaps) {
  const int64_t w = grid.world_size;
  const int64_t k = grid.k;
  Cells cells(items, w, k, alpha);
  for (int64_t cell = 0; cell < w * k; ++cell) cells.Reset(cell, grid.cells[cell]);
  std::vector<int64_t> slot_max(k, 0);
  auto refresh = [&](int64_t i) {
    slot_max[i] = 0;
    for (int64_t r = 0; r < w; ++r) slot_max[i] = std::max(slot_max[i], cells.cost(r * k + i));
  };
  for (int64_t i = 0; i < k; ++i) refresh(i);
  // Swaps keep every cell's count; in tokens mode its cap measure is its aligned sum.
  swaps = swaps && capacity.mode() == CapMode::kTokens;
  for (int round = 0; round < rounds; ++round) {
    bool moved = false;
    for (int64_t i = 0; i < k; ++i) {
      // The slot's costliest cell, if it alone sets the slot's cost, and the next two.
      int64_t top = -1, ties = 0;
      for (int64_t r = 0; r < w; ++r) {
        const int64_t cell = r * k + i;
        if (top < 0 || cells.cost(cell) > cells.cost(top)) {
          top = cell;
          ties = 1;
        } else if (cells.cost(cell) == cells.cost(top)) {
          ++ties;
        }
      }
      if (ties > 1 || cells.closed(top) || grid.cells[top].empty()) continue;
      int64_t runner = -1, second = 0, third = 0;  // runner: the second costliest cell
      for (int64_t r = 0; r < w; ++r) {
        const int64_t cell = r * k + i;
        if (cell == top) continue;
        if (runner < 0 || cells.cost(cell) > second) {
          third = runner < 0 ? 0 : second;
          runner = cell;
          second = cells.cost(cell);
        } else {
          third = std::max(third, cells.cost(cell));
        }
      }
      const int64_t top_cost = cells.cost(top);
      const int64_t top_rank = top / k;
      // The move (or swap) that lowers slot i most without raising its target slot's cost.
      int64_t best_gain = 0, best_member = -1, best_target = -1, best_other = -1;
      const std::vector<int32_t>& members = grid.cells[top];
      for (size_t m = 0; m < members.size(); ++m) {
        const SlotItem& item = items[members[m]];
        const int64_t left = members.size() == 1 ? 0 : top_cost - item.item.cost;
        const int64_t r_begin = item.rank >= 0 ? item.rank : 0;
        const int64_t r_end = item.rank >= 0 ? item.rank + 1 : w;
        if (top_cost - std::max(second, left) > best_gain) {
          for (int64_t r = r_begin; r < r_end; ++r) {
            for (int64_t j = 0; j < k; ++j) {
              const int64_t cell = r * k + j;
              if (cell == top || !cells.Accepts(cell, item, capacity)) continue;
              const int64_t with = cells.CostWith(cell, item);
              const int64_t slot_after =
                  j == i ? std::max({second, left, with}) : std::max(second, left);
              if (j != i && with > slot_max[j]) continue;
              if (top_cost - slot_after <= best_gain) continue;
              best_gain = top_cost - slot_after;
              best_member = static_cast<int64_t>(m);
              best_target = cell;
              best_other = -1;
            }
          }
        }
        if (!swaps || item.isolated) continue;
        for (int64_t r = r_begin; r < r_end; ++r) {
          for (int64_t j = 0; j < k; ++j) {
            const int64_t cell = r * k + j;
            if (cell == top || cells.closed(cell)) continue;
            const std::vector<int32_t>& others = grid.cells[cell];
            for (size_t o = 0; o < others.size(); ++o) {
              const SlotItem& other = items[others[o]];
              const int64_t delta = item.item.cost - other.item.cost;
              if (delta <= 0 || (other.rank >= 0 && other.rank != top_rank)) continue;
              const int64_t new_top = top_cost - delta;
              const int64_t new_cell = cells.cost(cell) + delta;
              int64_t slot_after;
              if (j == i) {
                slot_after = std::max({cell == runner ? third : second, new_top, new_cell});
              } else {
                if (new_cell > slot_max[j]) continue;
                slot_after = std::max(second, new_top);
              }
              if (top_cost - slot_after <= best_gain) continue;
              const int64_t shift = item.item.aligned - other.item.aligned;
              if (cells.load(top).aligned - shift > capacity.cap() ||
                  cells.load(cell).aligned + shift > capacity.cap()) {
                continue;
              }
              best_gain = top_cost - slot_after;
              best_member = static_cast<int64_t>(m);
              best_target = cell;
              best_other = static_cast<int64_t>(o);
            }
          }
        }
      }
      if (best_member < 0) continue;
      std::vector<int32_t>& from = grid.cells[top];
      std::vector<int32_t>& to = grid.cells[best_target];
      const int32_t position = from[best_member];
      if (best_other >= 0) {
        from[best_member] = to[best_other];
        to[best_other] = position;
      } else {
        from.erase(from.begin() + best_member);
        to.push_back(position);
      }
      cells.Reset(top, from);
      cells.Reset(best_target, to);
      refresh(i);
      refresh(best_target % k);
      moved = true;
    }
    if (!moved) return;
  }
}

Grid GridFromBins(const std::vector<std::vector<int32_t>>& bins, absl::Span<const SlotItem> items,
                  int64_t world_size, int64_t k, bool by_rank_total) {
  std::vector<int64_t> costs(bins.size(), 0);
  for (size_t b = 0; b < bins.size(); ++b) {
    for (int32_t position : bins[b]) costs[b] += items[position].item.cost;
  }
  const std::vector<int32_t> order = OrderByCostDesc(costs);
  Grid grid{world_size, k, std::vector<std::vector<int32_t>>(world_size * k)};
  if (!by_rank_total) {
    for (size_t j = 0; j < order.size(); ++j) {
      grid.cell(static_cast<int64_t>(j) % world_size, static_cast<int64_t>(j) / world_size) =
          bins[order[j]];
    }
    return grid;
  }
  const std::vector<int64_t> limits(world_size, k);
  const Parts ranks = Lpt(costs, order, limits);
  for (int64_t r = 0; r < world_size; ++r) {
    std::vector<int32_t> mine(ranks[r].begin(), ranks[r].end());
    std::sort(mine.begin(), mine.end(), [&](int32_t a, int32_t b) {
      return costs[a] != costs[b] ? costs[a] > costs[b] : a < b;
    });
    for (size_t i = 0; i < mine.size(); ++i) grid.cell(r, static_cast<int64_t>(i)) = bins[mine[i]];
  }
  return grid;
}

}  // namespace packsched::planner::internal
