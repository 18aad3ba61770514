// The sparse k-way Karmarkar–Karp against a plain dense implementation of the same method.

#include "server/planner/karmarkar_karp.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <queue>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/lengths.h"

namespace packsched::planner::internal {
namespace {

// Plain largest differencing with dense k-tuples of sums: O(n·k) memory, the textbook method.
int64_t DenseKarmarkarKarpMax(const std::vector<int64_t>& costs, int64_t k) {
  using Tuple = std::vector<int64_t>;  // sorted descending
  auto spread = [](const Tuple& t) { return t.front() - t.back(); };
  std::vector<Tuple> tuples;
  using Entry = std::pair<int64_t, int64_t>;  // (spread, -id)
  std::priority_queue<Entry> heap;
  for (int64_t c : costs) {
    Tuple t(k, 0);
    t[0] = c;
    tuples.push_back(t);
    heap.emplace(spread(t), -static_cast<int64_t>(tuples.size() - 1));
  }
  if (tuples.empty()) return 0;
  while (heap.size() > 1) {
    const int64_t a = -heap.top().second;
    heap.pop();
    const int64_t b = -heap.top().second;
    heap.pop();
    Tuple merged(k);
    for (int64_t j = 0; j < k; ++j) merged[j] = tuples[a][j] + tuples[b][k - 1 - j];
    std::sort(merged.begin(), merged.end(), std::greater<>());
    tuples[a] = std::move(merged);
    tuples[b].clear();
    heap.emplace(spread(tuples[a]), -a);
  }
  return tuples[-heap.top().second].front();
}

int64_t SparseMax(const std::vector<int64_t>& costs, int64_t k, int64_t* placed = nullptr) {
  const Parts parts = KarmarkarKarp(costs, k);
  EXPECT_EQ(static_cast<int64_t>(parts.size()), k);
  int64_t best = 0, count = 0;
  for (const auto& part : parts) {
    int64_t sum = 0;
    for (int32_t i : part) sum += costs[i];
    best = std::max(best, sum);
    count += static_cast<int64_t>(part.size());
  }
  if (placed != nullptr) *placed = count;
  return best;
}

TEST(KarmarkarKarp, SanityExampleHasLargestPartEight) {
  // [1,2,2,5,3,7,6,3] into 4 parts: total 29, so the largest part is at least 8.
  EXPECT_EQ(SparseMax({1, 2, 2, 5, 3, 7, 6, 3}, 4), 8);
}

TEST(KarmarkarKarp, EveryItemExactlyOnce) {
  const std::vector<int64_t> costs = packsched::testing::UniformLengths(500, 1, 1000, 3);
  const Parts parts = KarmarkarKarp(costs, 37);
  std::vector<int32_t> all;
  for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
  std::sort(all.begin(), all.end());
  std::vector<int32_t> expected(costs.size());
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(all, expected);
}

TEST(KarmarkarKarp, MorePartsThanItemsLeavesPartsEmpty) {
  const Parts parts = KarmarkarKarp({5, 9, 2}, 6);
  ASSERT_EQ(parts.size(), 6u);
  EXPECT_EQ(std::count_if(parts.begin(), parts.end(), [](const auto& p) { return p.empty(); }), 3);
  EXPECT_EQ(SparseMax({5, 9, 2}, 6), 9);
}

TEST(KarmarkarKarp, OnePartHoldsEverything) { EXPECT_EQ(SparseMax({4, 5, 6}, 1), 15); }

TEST(KarmarkarKarp, MatchesDenseLargestDifferencingOnSmallInputs) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const int64_t n = 1 + static_cast<int64_t>(seed % 60);
    const int64_t k = 1 + static_cast<int64_t>(seed % 9);
    const std::vector<int64_t> costs = packsched::testing::UniformLengths(n, 1, 5000, seed);
    EXPECT_EQ(SparseMax(costs, k), DenseKarmarkarKarpMax(costs, k)) << "seed " << seed;
  }
}

TEST(KarmarkarKarp, WithinATenthOfAPercentOfDenseOnBenchmarkInputs) {
  // The realistic RL mix at the benchmark's shape: n = 4,096, k = ceil(total / 16,384).
  const std::vector<int64_t> costs = packsched::testing::RealisticRlLengths(4096, 1);
  const int64_t total = std::accumulate(costs.begin(), costs.end(), int64_t{0});
  const int64_t k = (total + 16383) / 16384;
  const int64_t sparse = SparseMax(costs, k);
  const int64_t dense = DenseKarmarkarKarpMax(costs, k);
  EXPECT_LE(sparse, dense + dense / 1000) << "sparse " << sparse << " dense " << dense;
}

}  // namespace
}  // namespace packsched::planner::internal
