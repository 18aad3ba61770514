#include "server/planner/lpt.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

namespace packsched::planner::internal {

namespace {

// Positions 0..n-1 by cost (descending or ascending), ties by position ascending.
std::vector<int32_t> OrderByCost(absl::Span<const int64_t> costs, bool descending) {
  const size_t n = costs.size();
  std::vector<int32_t> order(n);
  if (n < 64) {
    // Sorted as (+-cost, position) pairs: unique keys, so the order is the stable one, without
    // an indirect comparison per step.
    std::vector<std::pair<int64_t, int32_t>> keys(n);
    for (size_t i = 0; i < n; ++i) {
      keys[i] = {descending ? -costs[i] : costs[i], static_cast<int32_t>(i)};
    }
    std::sort(keys.begin(), keys.end());
    for (size_t i = 0; i < n; ++i) order[i] = keys[i].second;
    return order;
  }
  // Least-significant-digit radix sort of max - cost (descending) or cost - min (ascending),
  // one byte a pass, only as many passes as the largest key has bytes. Each pass is stable and
  // the first starts from position order, so equal costs stay in position order: the same order
  // as the sort above, in O(n) per pass instead of O(n log n) comparisons.
  struct Entry {
    uint64_t key;
    int32_t position;
  };
  const auto [min, max] = std::minmax_element(costs.begin(), costs.end());
  const uint64_t base = static_cast<uint64_t>(descending ? *max : *min);
  std::vector<Entry> from(n), to(n);
  uint64_t largest = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t cost = static_cast<uint64_t>(costs[i]);
    from[i] = {descending ? base - cost : cost - base, static_cast<int32_t>(i)};
    largest = std::max(largest, from[i].key);
  }
  for (int shift = 0; shift < 64 && (largest >> shift) != 0; shift += 8) {
    size_t start[257] = {};
    for (const Entry& e : from) ++start[((e.key >> shift) & 0xff) + 1];
    for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
    for (const Entry& e : from) to[start[(e.key >> shift) & 0xff]++] = e;
    from.swap(to);
  }
  for (size_t i = 0; i < n; ++i) order[i] = from[i].position;
  return order;
}

}  // namespace

std::vector<int32_t> OrderByCostDesc(absl::Span<const int64_t> costs) {
  return OrderByCost(costs, /*descending=*/true);
}

std::vector<int32_t> OrderByCostAsc(absl::Span<const int64_t> costs) {
  return OrderByCost(costs, /*descending=*/false);
}

namespace {

// Lpt with each (load, part) heap entry packed into one integer, load << shift | part, which
// orders as the pair does: one comparison per step and a branch-free choice of child. For many
// parts, where the heap is deep. REQUIRES: every load fits 63 - shift bits.
void PackedLpt(absl::Span<const int64_t> costs, absl::Span<const int32_t> order,
               absl::Span<const int64_t> limits, int shift, Parts& parts) {
  const uint64_t part_mask = (uint64_t{1} << shift) - 1;
  std::vector<uint64_t> least;  // min-heap; ascending part ids: already a heap
  least.reserve(limits.size());
  for (size_t p = 0; p < limits.size(); ++p) {
    if (limits[p] > 0) least.push_back(p);
  }
  for (int32_t item : order) {
    const uint64_t top = least.front();
    const size_t p = top & part_mask;
    parts[p].push_back(item);
    if (static_cast<int64_t>(parts[p].size()) < limits[p]) {
      const uint64_t entry = top + (static_cast<uint64_t>(costs[item]) << shift);
      size_t i = 0;
      const size_t n = least.size();
      while (true) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n) child += least[child + 1] < least[child];
        if (entry <= least[child]) break;  // keys are unique: entry < least[child]
        least[i] = least[child];
        i = child;
      }
      least[i] = entry;
    } else {
      std::pop_heap(least.begin(), least.end(), std::greater<uint64_t>());
      least.pop_back();
    }
  }
}

}  // namespace

Parts Lpt(absl::Span<const int64_t> costs, absl::Span<const int32_t> order,
          absl::Span<const int64_t> limits) {
  const int64_t k = static_cast<int64_t>(limits.size());
  Parts parts(k, PlanMemory());
  // Room for twice the mean count: most parts never reallocate.
  const size_t room = k > 0 ? 2 * (order.size() / static_cast<size_t>(k)) + 2 : 0;
  for (Part& part : parts) part.reserve(room);
  // Many parts, and every load fits beside a part id in 64 bits: the packed heap.
  if (k >= 512) {
    int shift = 1;
    while ((int64_t{1} << shift) < k) ++shift;
    uint64_t total = 0;
    for (int32_t item : order) total += static_cast<uint64_t>(costs[item]);  // costs >= 0
    if (shift < 40 && total < (uint64_t{1} << (63 - shift))) {
      PackedLpt(costs, order, limits, shift, parts);
      return parts;
    }
  }
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
