#include "server/planner/slot_grid.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>
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
                              int64_t alpha, StopCheck* stop) {
  const int64_t w = world_size;
  // Cells slot-major here (slot i's cells adjacent: i * w + r), rank-major in the grid.
  std::vector<std::vector<int32_t>> members(w * k);
  Cells cells(items, w, k, alpha);
  std::vector<int64_t> slot_max(k, 0);
  std::vector<int64_t> slot_empty(k, w);  // empty open cells
  std::vector<int64_t> tried(k, -1);      // the placement that found no cell in the slot
  // Each slot's open cells as a min-heap of (cost, cell), kept lazily: an entry counts while its
  // cell is open at that cost. All empty at the start: ascending, so already a heap.
  using Entry = std::pair<int64_t, int64_t>;
  std::vector<std::vector<Entry>> heaps(k);
  for (int64_t i = 0; i < k; ++i) {
    heaps[i].reserve(w);
    for (int64_t r = 0; r < w; ++r) heaps[i].emplace_back(0, i * w + r);
  }
  // The same, less the cells that no item still to come fits (shortest[step]: the least aligned
  // length of a normal item from `step` on): the cells a search for one visits. A slot without
  // one is never chosen, as it would be rejected.
  std::vector<std::vector<Entry>> open = heaps;
  std::vector<int64_t> shortest(order.size() + 1, kNone);
  for (size_t step = order.size(); step-- > 0;) {
    const SlotItem& item = items[order[step]];
    shortest[step] =
        item.isolated ? shortest[step + 1] : std::min(shortest[step + 1], item.item.aligned);
  }
  // In tokens mode with a cap, each slot's open cells by room under the cap, largest first (lazily
  // too): a slot whose roomiest cell is too small for an item is rejected without a search.
  const bool by_room = capacity.has_cap() && capacity.mode() == CapMode::kTokens;
  std::vector<std::vector<Entry>> roomy(by_room ? k : 0);
  for (int64_t i = 0; i < static_cast<int64_t>(roomy.size()); ++i) {
    for (int64_t r = w - 1; r >= 0; --r) roomy[i].emplace_back(capacity.cap(), i * w + r);
  }
  auto room_under_cap = [&](int64_t cell) { return capacity.cap() - cells.load(cell).aligned; };
  auto dead = [&](int64_t cell, size_t step) {
    return !cells.empty(cell) &&
           (shortest[step] == kNone || !capacity.Fits(cells.load(cell), shortest[step]));
  };
  const auto later = std::greater<Entry>();
  auto current = [&](const Entry& e) {
    return !cells.closed(e.second) && cells.cost(e.second) == e.first;
  };
  // The least cost of an open cell of slot i (kNone: none open).
  auto slot_min = [&](int64_t i) {
    std::vector<Entry>& heap = heaps[i];
    while (!heap.empty() && !current(heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), later);
      heap.pop_back();
    }
    return heap.empty() ? kNone : heap.front().first;
  };
  // The slots by room: the largest cell's cost less the cost of the slot's cheapest open cell as
  // a new member sees it (alpha for an empty cell), as (room, slot); `with_empty` holds only the
  // slots with an empty open cell (an isolated item's choice). room_of[i]: slot i's key, if in.
  std::set<Entry> rooms, with_empty;
  std::vector<int64_t> room_of(k, kNone);
  auto unlist = [&](int64_t i) {
    if (room_of[i] == kNone) return;
    rooms.erase({room_of[i], i});
    with_empty.erase({room_of[i], i});
    room_of[i] = kNone;
  };
  auto list = [&](int64_t i) {
    unlist(i);
    const int64_t base = slot_empty[i] > 0 ? alpha : slot_min(i);
    if (base == kNone || open[i].empty()) return;
    room_of[i] = slot_max[i] - base;
    rooms.emplace(room_of[i], i);
    if (slot_empty[i] > 0) with_empty.emplace(room_of[i], i);
  };
  for (int64_t i = 0; i < k; ++i) list(i);
  // The slot whose largest cell grows least when a cost-c member joins its cheapest open cell;
  // ties: the least room left under that cell, then the lowest slot. -1 when none is listed.
  auto pick = [](const std::set<Entry>& listed, int64_t c) -> int64_t {
    if (listed.empty()) return -1;
    auto it = listed.lower_bound({c, -1});  // the least room that fits c
    if (it == listed.end()) it = listed.lower_bound({std::prev(listed.end())->first, -1});
    return it->second;
  };
  std::vector<int64_t> skipped;  // slots unlisted for the item being placed
  std::vector<Entry> passed;     // a slot's open cells that could not take it
  for (size_t step = 0; step < order.size(); ++step) {
    const int32_t position = order[step];
    const SlotItem& item = items[position];
    const int64_t stamp = static_cast<int64_t>(step);
    skipped.clear();
    while (true) {
      if (!stop->Continue(64)) return std::nullopt;
      // The slot: as one key, the growth when positive, else the room below -2^62 (every fit
      // first).
      int64_t best = -1;
      if (item.rank >= 0) {
        int64_t best_key = kNone;
        for (int64_t i = 0; i < k; ++i) {
          const int64_t cell = i * w + item.rank;
          if (tried[i] == stamp || cells.closed(cell) || (item.isolated && !cells.empty(cell))) {
            continue;
          }
          const int64_t d = cells.CostWith(cell, item) - slot_max[i];
          const int64_t key = d > 0 ? d : -(int64_t{1} << 62) - d;
          if (key < best_key) {
            best = i;
            best_key = key;
          }
        }
      } else {
        best = pick(item.isolated ? with_empty : rooms, item.item.cost);
      }
      if (best < 0) {
        for (int64_t i : skipped) list(i);
        return std::nullopt;
      }
      // The cell: the slot's cheapest that takes the item (ties: the lowest rank).
      int64_t chosen = -1;
      if (item.rank >= 0) {
        const int64_t cell = best * w + item.rank;
        if (cells.Accepts(cell, item, capacity)) chosen = cell;
      } else {
        bool may_fit = true;
        if (by_room && !item.isolated) {
          std::vector<Entry>& room = roomy[best];
          while (!room.empty() && (cells.closed(room.front().second) ||
                                   room_under_cap(room.front().second) != room.front().first)) {
            std::pop_heap(room.begin(), room.end());
            room.pop_back();
          }
          may_fit = !room.empty() && room.front().first >= item.item.aligned;
        }
        std::vector<Entry>& heap = open[best];
        passed.clear();
        while (may_fit && !heap.empty()) {
          const Entry top = heap.front();
          std::pop_heap(heap.begin(), heap.end(), later);
          heap.pop_back();
          if (!current(top) || dead(top.second, step)) continue;
          if (cells.Accepts(top.second, item, capacity)) {
            chosen = top.second;
            break;
          }
          passed.push_back(top);
        }
        for (const Entry& e : passed) {
          heap.push_back(e);
          std::push_heap(heap.begin(), heap.end(), later);
        }
      }
      if (chosen < 0) {
        tried[best] = stamp;
        unlist(best);
        skipped.push_back(best);
        continue;
      }
      if (cells.empty(chosen)) --slot_empty[best];
      cells.Add(chosen, item);
      members[chosen].push_back(position);
      slot_max[best] = std::max(slot_max[best], cells.cost(chosen));
      if (!cells.closed(chosen)) {
        heaps[best].emplace_back(cells.cost(chosen), chosen);
        std::push_heap(heaps[best].begin(), heaps[best].end(), later);
        if (!dead(chosen, step + 1)) {
          open[best].emplace_back(cells.cost(chosen), chosen);
          std::push_heap(open[best].begin(), open[best].end(), later);
        }
        if (by_room) {
          roomy[best].emplace_back(room_under_cap(chosen), chosen);
          std::push_heap(roomy[best].begin(), roomy[best].end());
        }
      }
      list(best);
      break;
    }
    for (int64_t i : skipped) list(i);
  }
  Grid grid{w, k, std::vector<std::vector<int32_t>>(w * k)};
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t r = 0; r < w; ++r) grid.cell(r, i) = std::move(members[i * w + r]);
  }
  return grid;
}

std::optional<Grid> FillRows(absl::Span<const SlotItem> items, absl::Span<const int32_t> order,
                             const Capacity& capacity, int64_t world_size, int64_t k, int64_t alpha,
                             StopCheck* stop) {
  const int64_t w = world_size;
  Grid grid{w, k, std::vector<std::vector<int32_t>>(w * k)};
  if (order.empty()) return grid;
  // The least aligned length of a normal item from each step on.
  std::vector<int64_t> shortest(order.size() + 1, kNone);
  for (size_t step = order.size(); step-- > 0;) {
    const SlotItem& item = items[order[step]];
    shortest[step] =
        item.isolated ? shortest[step + 1] : std::min(shortest[step + 1], item.item.aligned);
  }
  using Entry = std::pair<int64_t, int64_t>;  // (cost, rank): the slot's cells, cheapest first
  const auto later = std::greater<Entry>();
  std::vector<Entry> heap, passed;
  std::optional<Cells> cells;
  int64_t slot = -1;
  for (size_t step = 0; step < order.size(); ++step) {
    const SlotItem& item = items[order[step]];
    int64_t chosen = -1;
    while (chosen < 0) {
      if (!stop->Continue(64)) return std::nullopt;
      if (!cells) {
        if (++slot == k) return std::nullopt;
        cells.emplace(items, w, 1, alpha);
        heap.clear();
        for (int64_t r = 0; r < w; ++r) heap.emplace_back(0, r);
      }
      passed.clear();
      while (!heap.empty()) {
        const Entry top = heap.front();
        std::pop_heap(heap.begin(), heap.end(), later);
        heap.pop_back();
        // Closed, or no item from here on fits: out of the search for good.
        if (cells->closed(top.second) ||
            (!cells->empty(top.second) &&
             (shortest[step] == kNone ||
              !capacity.Fits(cells->load(top.second), shortest[step])))) {
          continue;
        }
        if (cells->Accepts(top.second, item, capacity)) {
          chosen = top.second;
          break;
        }
        passed.push_back(top);
      }
      for (const Entry& e : passed) {
        heap.push_back(e);
        std::push_heap(heap.begin(), heap.end(), later);
      }
      if (chosen < 0) cells.reset();  // the next slot
    }
    cells->Add(chosen, item);
    grid.cell(chosen, slot).push_back(order[step]);
    if (!cells->closed(chosen)) {
      heap.emplace_back(cells->cost(chosen), chosen);
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
  return grid;
}

void ImproveSlots(Grid& grid, absl::Span<const SlotItem> items, const Capacity& capacity,
                  int64_t alpha, int rounds, bool swaps, StopCheck* stop) {
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
      if (!stop->Continue(w)) return;
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
        if (!stop->Continue((r_end - r_begin) * k)) return;
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
