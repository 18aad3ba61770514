#include "server/planner/cell_greedy.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace packsched::planner::internal {

std::optional<Grid> FillCells(absl::Span<const SlotItem> items, absl::Span<const int32_t> order,
                              const Capacity& capacity, int64_t world_size, int64_t k,
                              int64_t alpha, StopCheck* stop) {
  const int64_t w = world_size;
  Grid grid{w, k, std::vector<std::vector<int32_t>>(w * k)};
  std::vector<PartLoad> load(w * k);
  std::vector<int64_t> cost(w * k, 0);
  std::vector<char> closed(w * k, 0);
  std::vector<int64_t> slot_max(k, 0);
  int64_t used = 0;  // slots holding an item: slot `used` is the first empty one
  for (int32_t position : order) {
    const SlotItem& item = items[position];
    const int64_t span = std::min(used + 1, k);
    if (!stop->Continue(span * w + 1)) return std::nullopt;
    int64_t best = -1;
    int64_t best_rise = std::numeric_limits<int64_t>::max();
    for (int64_t i = 0; i < span && best_rise > 0; ++i) {
      for (int64_t r = 0; r < w; ++r) {
        const int64_t cell = r * k + i;
        const bool empty = load[cell].count == 0;
        if (closed[cell] ||
            (item.isolated ? !empty : !capacity.Fits(load[cell], item.item.aligned)))
          continue;
        const int64_t rise =
            std::max<int64_t>(0, cost[cell] + item.item.cost + (empty ? alpha : 0) - slot_max[i]);
        if (rise < best_rise) {
          best_rise = rise;
          best = cell;
          if (rise == 0) break;
        }
      }
    }
    if (best < 0) return std::nullopt;
    const int64_t slot = best % k;
    cost[best] += item.item.cost + (load[best].count == 0 ? alpha : 0);
    load[best].Add(item.item);
    closed[best] = item.isolated ? 1 : 0;
    slot_max[slot] = std::max(slot_max[slot], cost[best]);
    used = std::max(used, slot + 1);
    grid.cells[best].push_back(position);
  }
  return grid;
}

}  // namespace packsched::planner::internal
