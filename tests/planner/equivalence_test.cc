// The planner's fast paths against plain reference implementations of the same rules: the radix
// OrderByCostDesc against a stable sort, the sparse Karmarkar–Karp (single items popped from
// their cost order, merged tuples from a heap) against a dense textbook run with one heap and
// explicit tie rules, and LocalSearch's one-pass part ordering against its per-part sort. Each
// must give exactly the same output, not just an equally good one: plans must not change.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <queue>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/karmarkar_karp.h"
#include "server/planner/local_search.h"
#include "server/planner/lpt.h"
#include "server/planner/prepared.h"
#include "tests/testing/lengths.h"

namespace packsched::planner::internal {
namespace {

// Costs with many ties (values in [0, spread]) or spread over a huge range.
std::vector<int64_t> RandomCosts(int64_t n, int64_t spread, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, spread);
  std::vector<int64_t> costs(n);
  for (int64_t& c : costs) c = dist(rng);
  return costs;
}

std::vector<int32_t> StableOrderByCostDesc(const std::vector<int64_t>& costs) {
  std::vector<int32_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return costs[a] > costs[b]; });
  return order;
}

TEST(OrderByCost, MatchesStableSortAcrossSizesAndRanges) {
  for (int64_t n : {0, 1, 2, 63, 64, 65, 200, 1000, 5000}) {
    for (int64_t spread : {int64_t{0}, int64_t{3}, int64_t{255}, int64_t{256}, int64_t{70000},
                           int64_t{1} << 40, int64_t{1} << 62}) {
      const std::vector<int64_t> costs = RandomCosts(n, spread, static_cast<uint64_t>(n + spread));
      EXPECT_EQ(OrderByCostDesc(costs), StableOrderByCostDesc(costs))
          << "n " << n << " spread " << spread;
      std::vector<int32_t> ascending(costs.size());
      std::iota(ascending.begin(), ascending.end(), 0);
      std::stable_sort(ascending.begin(), ascending.end(),
                       [&](int32_t a, int32_t b) { return costs[a] < costs[b]; });
      EXPECT_EQ(OrderByCostAsc(costs), ascending) << "n " << n << " spread " << spread;
    }
  }
}

// LPT by a linear scan: each item (in `order`) to the least loaded part below its limit, ties
// to the lowest part.
Parts ScanLpt(const std::vector<int64_t>& costs, const std::vector<int32_t>& order,
              const std::vector<int64_t>& limits) {
  Parts parts(limits.size());
  std::vector<int64_t> loads(limits.size(), 0);
  for (int32_t item : order) {
    size_t best = limits.size();
    for (size_t p = 0; p < limits.size(); ++p) {
      if (static_cast<int64_t>(parts[p].size()) >= limits[p]) continue;
      if (best == limits.size() || loads[p] < loads[best]) best = p;
    }
    parts[best].push_back(item);
    loads[best] += costs[item];
  }
  return parts;
}

TEST(Lpt, SamePartsAsLinearScanForFewAndManyParts) {
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const int64_t k = seed < 6 ? 3 + static_cast<int64_t>(seed) * 40 : 512 + 300 * (seed - 6);
    const int64_t n = 3 * k + static_cast<int64_t>(seed) * 17;
    const std::vector<int64_t> costs = RandomCosts(n, seed % 2 == 0 ? 9 : 40000, seed);
    std::vector<int64_t> limits(k, n);
    if (seed % 3 == 0) {
      for (int64_t p = 0; p < k; ++p) limits[p] = p % 4 == 0 ? 0 : (p % 4 == 1 ? 2 : n);
    }
    const std::vector<int32_t> order = OrderByCostDesc(costs);
    EXPECT_EQ(Lpt(costs, order, limits), ScanLpt(costs, order, limits)) << "seed " << seed;
  }
}

// Textbook k-way largest differencing with dense tuples and the same tie rules as the planner's:
// the pair with the largest spreads merges (ties: lowest id; the result keeps the first id); the
// tuple with more non-empty sums takes the other's (ties: the first); its smallest sums (empty
// ones first, then by (sum, first item)) meet the other's largest (by sum, ties by first item);
// a merged sum lists the receiving sum's items, then the incoming one's. Parts come out by sum
// descending, ties by first item.
Parts DenseKarmarkarKarp(const std::vector<int64_t>& costs, int64_t k) {
  struct Sum {
    int64_t sum = 0;
    std::vector<int32_t> items;  // empty: a zero sum
  };
  using Tuple = std::vector<Sum>;  // always k sums
  auto filled = [](const Tuple& t) {
    return std::count_if(t.begin(), t.end(), [](const Sum& s) { return !s.items.empty(); });
  };
  auto spread = [&](const Tuple& t) {
    int64_t max = 0, min = 0;
    bool first = true;
    for (const Sum& s : t) {
      const int64_t v = s.items.empty() ? 0 : s.sum;
      max = first ? v : std::max(max, v);
      min = first ? v : std::min(min, v);
      first = false;
    }
    return max - min;
  };
  const int64_t n = static_cast<int64_t>(costs.size());
  Parts parts(k);
  if (n == 0) return parts;
  std::vector<Tuple> tuples(n, Tuple(k));
  std::priority_queue<std::pair<int64_t, int64_t>> heap;  // (spread, -id)
  for (int64_t i = 0; i < n; ++i) {
    tuples[i][0] = {costs[i], {static_cast<int32_t>(i)}};
    heap.emplace(spread(tuples[i]), -i);
  }
  while (heap.size() > 1) {
    const int64_t a = -heap.top().second;
    heap.pop();
    const int64_t b = -heap.top().second;
    heap.pop();
    const bool a_big = filled(tuples[a]) >= filled(tuples[b]);
    Tuple big = std::move(tuples[a_big ? a : b]);
    Tuple small = std::move(tuples[a_big ? b : a]);
    // Receivers: empty sums first, then non-empty ones by (sum, first item) ascending.
    std::stable_sort(big.begin(), big.end(), [](const Sum& x, const Sum& y) {
      if (x.items.empty() != y.items.empty()) return x.items.empty();
      if (x.items.empty()) return false;
      return x.sum != y.sum ? x.sum < y.sum : x.items.front() < y.items.front();
    });
    // Incoming: non-empty sums by sum descending, ties by first item.
    std::vector<Sum> incoming;
    for (Sum& s : small) {
      if (!s.items.empty()) incoming.push_back(std::move(s));
    }
    std::sort(incoming.begin(), incoming.end(), [](const Sum& x, const Sum& y) {
      return x.sum != y.sum ? x.sum > y.sum : x.items.front() < y.items.front();
    });
    for (size_t j = 0; j < incoming.size(); ++j) {
      big[j].sum = (big[j].items.empty() ? 0 : big[j].sum) + incoming[j].sum;
      big[j].items.insert(big[j].items.end(), incoming[j].items.begin(), incoming[j].items.end());
    }
    tuples[a] = std::move(big);
    tuples[b] = Tuple(k);
    heap.emplace(spread(tuples[a]), -a);
  }
  Tuple last = std::move(tuples[-heap.top().second]);
  std::vector<Sum> sums;
  for (Sum& s : last) {
    if (!s.items.empty()) sums.push_back(std::move(s));
  }
  std::sort(sums.begin(), sums.end(), [](const Sum& x, const Sum& y) {
    return x.sum != y.sum ? x.sum > y.sum : x.items.front() < y.items.front();
  });
  for (size_t p = 0; p < sums.size(); ++p)
    parts[p].assign(sums[p].items.begin(), sums[p].items.end());
  return parts;
}

TEST(KarmarkarKarp, SamePartsAsDenseTextbookRunWithTies) {
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const int64_t n = 1 + static_cast<int64_t>(seed % 70);
    const int64_t k = 1 + static_cast<int64_t>((seed / 7) % 13);
    // Small ranges force equal sums and equal spreads: every tie rule is exercised.
    const int64_t spread = seed % 3 == 0 ? 4 : (seed % 3 == 1 ? 50 : 100000);
    std::vector<int64_t> costs = RandomCosts(n, spread, seed);
    for (int64_t& c : costs) c += seed % 2;  // with and without zero costs
    EXPECT_EQ(KarmarkarKarp(costs, k), DenseKarmarkarKarp(costs, k))
        << "seed " << seed << " n " << n << " k " << k;
  }
}

TEST(KarmarkarKarp, SamePartsAsDenseTextbookRunOnRealisticMix) {
  const std::vector<int64_t> costs = packsched::testing::RealisticRlLengths(600, 5);
  for (int64_t k : {2, 7, 48, 110, 599, 600, 650}) {
    EXPECT_EQ(KarmarkarKarp(costs, OrderByCostDesc(costs), k), DenseKarmarkarKarp(costs, k))
        << "k " << k;
  }
}

// (cost, position) ascending, as the planner passes it.
std::vector<int32_t> ByCostAscending(const std::vector<Item>& items) {
  std::vector<int32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return items[a].cost != items[b].cost ? items[a].cost < items[b].cost : a < b;
  });
  return order;
}

TEST(LocalSearch, GivenOrderGivesTheSameSearchAsSortingEachPart) {
  for (uint64_t seed = 0; seed < 60; ++seed) {
    const int64_t n = 40 + static_cast<int64_t>(seed * 7 % 300);
    const std::vector<int64_t> lengths = packsched::testing::UniformLengths(n, 1, 3000, seed);
    std::vector<Item> items;
    const bool attention = seed % 2 == 1;  // costs equal to or different from aligned lengths
    for (int64_t i = 0; i < n; ++i) {
      items.push_back(
          Item{i, lengths[i], lengths[i],
               attention ? lengths[i] * 3 + lengths[i] * lengths[i] / 100 : lengths[i]});
    }
    const int64_t k = 2 + static_cast<int64_t>(seed % 11);
    std::vector<int64_t> costs;
    for (const Item& item : items) costs.push_back(item.cost);
    const std::vector<int64_t> limits(k, n);
    const Parts start = Lpt(costs, OrderByCostDesc(costs), limits);
    // A cap a little below the LPT loads, so Repair has work (and may fail).
    int64_t total = 0;
    for (int64_t length : lengths) total += length;
    const Capacity capacity(total / k + 2000, seed % 3 == 0 ? CapMode::kPadded : CapMode::kTokens,
                            seed % 5 == 0 ? n / k + 2 : 0);
    const std::vector<int32_t> order = ByCostAscending(items);
    LocalSearch sorted(items, capacity, start);
    LocalSearch given(items, capacity, start, order);
    const bool repaired = sorted.Repair();
    ASSERT_EQ(given.Repair(), repaired) << "seed " << seed;
    if (repaired) {
      sorted.Rebalance(/*keep_counts=*/seed % 4 == 0);
      given.Rebalance(/*keep_counts=*/seed % 4 == 0);
      EXPECT_EQ(given.max_cost(), sorted.max_cost()) << "seed " << seed;
    }
    EXPECT_EQ(given.Take(), sorted.Take()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace packsched::planner::internal
