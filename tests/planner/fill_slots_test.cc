// The slot greedy (internal::FillSlots) against a direct reading of its contract: for each item in
// order, every slot is scored by its cheapest open cell, the best slot's cells are searched in
// cost order for one that takes the item, and a slot with none is passed over for that item.
// The reference scans everything (O(n (k + W)) per item); FillSlots must make the same grid.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/planner/prepared.h"
#include "server/planner/slot_grid.h"

namespace packsched::planner::internal {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

std::optional<Grid> ReferenceFill(const std::vector<SlotItem>& items,
                                  const std::vector<int32_t>& order, const Capacity& capacity,
                                  int64_t w, int64_t k, int64_t alpha) {
  Grid grid{w, k, std::vector<std::vector<int32_t>>(w * k)};
  std::vector<PartLoad> load(w * k);
  std::vector<int64_t> cost(w * k, 0);
  std::vector<bool> closed(w * k, false);
  auto accepts = [&](int64_t c, const SlotItem& item) {
    if (closed[c]) return false;
    if (item.isolated) return load[c].count == 0;
    return capacity.Fits(load[c], item.item.aligned);
  };
  for (int32_t position : order) {
    const SlotItem& item = items[position];
    std::vector<bool> tried(k, false);
    while (true) {
      int64_t best = -1, best_key = kNone;
      for (int64_t i = 0; i < k; ++i) {
        if (tried[i]) continue;
        int64_t slot_max = 0, cheapest = kNone;
        bool has_empty = false;
        for (int64_t r = 0; r < w; ++r) {
          const int64_t c = r * k + i;
          slot_max = std::max(slot_max, cost[c]);
          if (closed[c]) continue;
          if (item.rank >= 0 && r != item.rank) continue;
          has_empty = has_empty || load[c].count == 0;
          cheapest = std::min(cheapest, load[c].count == 0 ? alpha : cost[c]);
        }
        if (item.isolated && !has_empty) continue;
        if (has_empty) cheapest = alpha;
        if (cheapest == kNone) continue;
        const int64_t d = cheapest + item.item.cost - slot_max;
        const int64_t key = d > 0 ? d : -(int64_t{1} << 62) - d;
        if (key < best_key) {
          best = i;
          best_key = key;
        }
      }
      if (best < 0) return std::nullopt;
      int64_t chosen = -1;
      for (int64_t r = 0; r < w; ++r) {
        const int64_t c = r * k + best;
        if (item.rank >= 0 && r != item.rank) continue;
        if (!accepts(c, item)) continue;
        if (chosen < 0 || cost[c] < cost[chosen]) chosen = c;
      }
      if (chosen < 0) {
        tried[best] = true;
        continue;
      }
      cost[chosen] += item.item.cost + (load[chosen].count == 0 ? alpha : 0);
      load[chosen].Add(item.item);
      if (item.isolated) closed[chosen] = true;
      grid.cells[chosen].push_back(position);
      break;
    }
  }
  return grid;
}

struct Case {
  int64_t n, w, k, cap, alpha, max_seqs;
  CapMode mode;
  bool isolated, ranked;
};

TEST(FillSlots, MatchesTheReferenceScan) {
  const std::function<absl::Status()> never;  // no stop
  StopCheck stop(never);
  std::mt19937_64 rng(7);
  int compared = 0, filled = 0;
  for (int trial = 0; trial < 600; ++trial) {
    Case c;
    c.n = std::uniform_int_distribution<int64_t>(1, 120)(rng);
    c.w = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    c.k = std::uniform_int_distribution<int64_t>(1, 10)(rng);
    c.cap = std::uniform_int_distribution<int64_t>(0, 3)(rng) == 0
                ? 0
                : std::uniform_int_distribution<int64_t>(64, 4096)(rng);
    c.alpha = std::uniform_int_distribution<int64_t>(0, 2)(rng) * 1000;
    c.max_seqs = std::uniform_int_distribution<int64_t>(0, 1)(rng) == 0
                     ? 0
                     : std::uniform_int_distribution<int64_t>(1, 8)(rng);
    c.mode = trial % 3 == 0 ? CapMode::kPadded : CapMode::kTokens;
    c.isolated = trial % 5 == 0;
    c.ranked = trial % 7 == 0;
    std::vector<SlotItem> items;
    std::vector<SlotItem> isolated;
    std::uniform_int_distribution<int64_t> length(1, c.cap > 0 ? c.cap : 4096);
    for (int64_t p = 0; p < c.n; ++p) {
      SlotItem s;
      const int64_t a = (c.isolated && p % 9 == 0 && c.cap > 0) ? c.cap + 1 + p : length(rng);
      s.item = Item{p, a, a, a * 7 + a * a / 64};
      s.isolated = a > c.cap && c.cap > 0;
      if (c.ranked) s.rank = static_cast<int32_t>(rng() % c.w);
      (s.isolated ? isolated : items).push_back(s);
    }
    items.insert(items.end(), isolated.begin(), isolated.end());
    const Capacity capacity(c.cap, c.mode, c.max_seqs);
    const std::vector<int32_t> order = PlacementOrder(items);
    const std::optional<Grid> want = ReferenceFill(items, order, capacity, c.w, c.k, c.alpha);
    const std::optional<Grid> got = FillSlots(items, order, capacity, c.w, c.k, c.alpha, &stop);
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": n ", c.n, " W ", c.w, " k ", c.k, " cap ", c.cap,
                              " alpha ", c.alpha, " max_seqs ", c.max_seqs));
    ASSERT_EQ(want.has_value(), got.has_value());
    ++compared;
    if (!want) continue;
    ++filled;
    EXPECT_EQ(want->cells, got->cells);
  }
  // Both outcomes are exercised.
  EXPECT_GT(filled, 100);
  EXPECT_LT(filled, compared);
}

// One sequence per rank: every item to its own cell of the single slot, the costliest first.
TEST(FillSlots, OneSequencePerRank) {
  const std::function<absl::Status()> never;
  StopCheck stop(never);
  const int64_t w = 5000;
  std::vector<SlotItem> items;
  for (int64_t p = 0; p < w; ++p) {
    const int64_t a = 1 + (p * 7919) % 3000;
    items.push_back(SlotItem{Item{p, a, a, a}, false, -1});
  }
  const std::vector<int32_t> order = PlacementOrder(items);
  const std::optional<Grid> got =
      FillSlots(items, order, Capacity(4096, CapMode::kTokens, 0), w, 1, 100, &stop);
  ASSERT_TRUE(got.has_value());
  for (int64_t r = 0; r < w; ++r) {
    ASSERT_EQ(got->cell(r, 0).size(), 1u) << "rank " << r;
    EXPECT_EQ(got->cell(r, 0)[0], order[r]) << "rank " << r;
  }
}

}  // namespace
}  // namespace packsched::planner::internal
