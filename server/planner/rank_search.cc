#include "server/planner/rank_search.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace packsched::planner::internal {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

// One change: `from` item (a position in `cell`) to `target`, or traded with `other` there.
struct Change {
  int64_t score = kNone;  // the larger of the two ranks' totals after it
  int64_t cell = -1, member = -1, target = -1, other = -1;
};

}  // namespace

void ImproveRankTotals(Grid& grid, absl::Span<const SlotItem> items, const Capacity& capacity,
                       int64_t alpha, int64_t rounds, bool keep_counts, StopCheck* stop) {
  const int64_t w = grid.world_size;
  const int64_t k = grid.k;
  std::vector<PartLoad> load(w * k);
  std::vector<char> closed(w * k, 0);
  std::vector<int64_t> total(w, 0);
  auto reset = [&](int64_t cell) {
    load[cell] = PartLoad{};
    closed[cell] = 0;
    for (int32_t p : grid.cells[cell]) {
      load[cell].Add(items[p].item);
      if (items[p].isolated || items[p].rank >= 0) closed[cell] = 1;
    }
  };
  auto cell_cost = [&](int64_t cell) {
    return load[cell].count == 0 ? 0 : alpha + load[cell].cost;
  };
  auto retotal = [&](int64_t r) {
    total[r] = 0;
    for (int64_t i = 0; i < k; ++i) total[r] += cell_cost(r * k + i);
  };
  for (int64_t cell = 0; cell < w * k; ++cell) reset(cell);
  for (int64_t r = 0; r < w; ++r) retotal(r);
  const bool swaps = capacity.mode() == CapMode::kTokens;
  // Each rank's movable items by cost: (cost, cell * 2^32 + member index).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> by_cost(w);
  auto sort_rank = [&](int64_t r) {
    by_cost[r].clear();
    for (int64_t i = 0; i < k; ++i) {
      const int64_t cell = r * k + i;
      if (closed[cell]) continue;
      for (size_t m = 0; m < grid.cells[cell].size(); ++m) {
        by_cost[r].emplace_back(items[grid.cells[cell][m]].item.cost,
                                (cell << 32) | static_cast<int64_t>(m));
      }
    }
    std::sort(by_cost[r].begin(), by_cost[r].end());
  };
  if (swaps) {
    for (int64_t r = 0; r < w; ++r) sort_rank(r);
  }
  std::vector<int64_t> ranks(w);
  for (int64_t round = 0; round < rounds; ++round) {
    if (!stop->Continue(static_cast<int64_t>(items.size()) + w * (k + 1))) return;
    int64_t top = 0;
    for (int64_t r = 1; r < w; ++r) {
      if (total[r] > total[top]) top = r;
    }
    const int64_t most = total[top];
    for (int64_t r = 0; r < w; ++r) ranks[r] = r;
    std::sort(ranks.begin(), ranks.end(), [&](int64_t a, int64_t b) {
      return total[a] != total[b] ? total[a] < total[b] : a < b;
    });
    Change best;
    best.score = most;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t from = top * k + i;
      if (closed[from]) continue;
      const std::vector<int32_t>& members = grid.cells[from];
      for (size_t m = 0; m < members.size(); ++m) {
        const Item& item = items[members[m]].item;
        const int64_t top_after = most - item.cost - (members.size() == 1 ? alpha : 0);
        // Moves: the ranks by total, up to the first that cannot beat the best.
        for (int64_t r : ranks) {
          if (keep_counts) break;
          if (r == top) continue;
          if (std::max(top_after, total[r] + item.cost) >= best.score) break;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t to = r * k + j;
            if (closed[to] || !capacity.Fits(load[to], item.aligned)) continue;
            const int64_t score =
                std::max(top_after, total[r] + item.cost + (load[to].count == 0 ? alpha : 0));
            if (score < best.score) {
              best = Change{score, from, static_cast<int64_t>(m), to, -1};
            }
          }
        }
        if (!swaps) continue;
        // Trades: in each other rank, the items whose cost is nearest to closing half the gap.
        for (int64_t r : ranks) {
          if (r == top || total[r] >= most) continue;
          const int64_t gap = most - total[r];
          const int64_t want = item.cost - gap / 2;  // the other item's ideal cost
          const auto& list = by_cost[r];
          const auto mid =
              std::lower_bound(list.begin(), list.end(), std::pair<int64_t, int64_t>{want, -1});
          const auto lo = mid - std::min<ptrdiff_t>(mid - list.begin(), 3);
          const auto hi = mid + std::min<ptrdiff_t>(list.end() - mid, 3);
          for (auto it = lo; it != hi; ++it) {
            const int64_t delta = item.cost - it->first;
            if (delta <= 0) continue;
            const int64_t score = std::max(most - delta, total[r] + delta);
            if (score >= best.score) continue;
            const int64_t to = it->second >> 32;
            const int64_t other = it->second & 0xffffffff;
            const int64_t shift = item.aligned - items[grid.cells[to][other]].item.aligned;
            if (capacity.has_cap() && (load[from].aligned - shift > capacity.cap() ||
                                       load[to].aligned + shift > capacity.cap())) {
              continue;
            }
            best = Change{score, from, static_cast<int64_t>(m), to, other};
          }
        }
      }
    }
    if (best.cell < 0) return;
    std::vector<int32_t>& source = grid.cells[best.cell];
    std::vector<int32_t>& target = grid.cells[best.target];
    const int32_t position = source[best.member];
    if (best.other >= 0) {
      source[best.member] = target[best.other];
      target[best.other] = position;
    } else {
      source.erase(source.begin() + best.member);
      target.push_back(position);
    }
    reset(best.cell);
    reset(best.target);
    retotal(best.cell / k);
    retotal(best.target / k);
    if (swaps) {
      sort_rank(best.cell / k);
      sort_rank(best.target / k);
    }
  }
}

}  // namespace packsched::planner::internal
