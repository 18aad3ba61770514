#include "server/planner/lpt.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

namespace packsched::planner::internal {

std::vector<int32_t> OrderByCostDesc(absl::Span<const int64_t> costs) {
  // Sorted as (-cost, position) pairs (costs are >= 0): unique keys, so the order is the
  // stable one, without an indirect comparison per step.
  std::vector<std::pair<int64_t, int32_t>> keys(costs.size());
  for (size_t i = 0; i < costs.size(); ++i) keys[i] = {-costs[i], static_cast<int32_t>(i)};
  std::sort(keys.begin(), keys.end());
  std::vector<int32_t> order(costs.size());
  for (size_t i = 0; i < keys.size(); ++i) order[i] = keys[i].second;
  return order;
}

Parts Lpt(absl::Span<const int64_t> costs, absl::Span<const int32_t> order,
          absl::Span<const int64_t> limits) {
  const int64_t k = static_cast<int64_t>(limits.size());
  Parts parts(k);
  // Room for twice the mean count: most parts never reallocate.
  const size_t room = k > 0 ? 2 * (order.size() / static_cast<size_t>(k)) + 2 : 0;
  for (std::vector<int32_t>& part : parts) part.reserve(room);
  // Min-heap (std::make_heap order under greater) of (load, part); keys are unique, so the
  // least loaded part, ties to the lowest, is always the top.
  using Entry = std::pair<int64_t, int64_t>;
  const std::greater<Entry> greater;
  std::vector<Entry> least;
  least.reserve(k);
  for (int64_t p = 0; p < k; ++p) {
    if (limits[p] > 0) least.emplace_back(0, p);
  }  // ascending: already a heap
  for (int32_t item : order) {
    const auto [load, p] = least.front();
    parts[p].push_back(item);
    if (static_cast<int64_t>(parts[p].size()) < limits[p]) {
      // The part stays: its new load replaces it at the top and sinks to its place as a hole
      // (each step moves one child up; the entry lands once).
      const Entry top{load + costs[item], p};
      size_t i = 0;
      const size_t n = least.size();
      while (true) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && greater(least[child], least[child + 1])) ++child;
        if (!greater(top, least[child])) break;
        least[i] = least[child];
        i = child;
      }
      least[i] = top;
    } else {
      std::pop_heap(least.begin(), least.end(), greater);
      least.pop_back();
    }
  }
  return parts;
}

}  // namespace packsched::planner::internal
