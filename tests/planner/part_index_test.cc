// PartIndex (the local search's parts by key) against an ordered set of the same entries, under
// random re-keys: the order, the ends and the size always match.

#include "server/planner/part_index.h"

#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace packsched::planner::internal {
namespace {

using Entry = PartIndex::Entry;

std::vector<Entry> Contents(const PartIndex& index) { return {index.begin(), index.end()}; }

TEST(PartIndex, StartsInKeyThenPartOrder) {
  const std::vector<int64_t> keys = {5, 3, 5, 0, 3};
  const PartIndex index(keys);
  const std::vector<Entry> expected = {{0, 3}, {3, 1}, {3, 4}, {5, 0}, {5, 2}};
  EXPECT_EQ(Contents(index), expected);
  EXPECT_EQ(index.back(), (Entry{5, 2}));
  EXPECT_EQ(index.size(), 5u);
}

TEST(PartIndex, RandomRekeysMatchAnOrderedSet) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int parts = 1 + static_cast<int>(rng() % 40);
    const int64_t key_range = 1 + static_cast<int64_t>(rng() % 20);  // small: many ties
    std::vector<int64_t> keys(parts);
    for (int64_t& key : keys) key = static_cast<int64_t>(rng() % key_range);
    PartIndex index(keys);
    std::set<Entry> model;
    for (int p = 0; p < parts; ++p) model.emplace(keys[p], p);
    for (int step = 0; step < 100; ++step) {
      const int p = static_cast<int>(rng() % parts);
      const int64_t next = static_cast<int64_t>(rng() % key_range);
      index.Rekey(p, keys[p], next);
      model.erase({keys[p], p});
      model.emplace(next, p);
      keys[p] = next;
      ASSERT_EQ(Contents(index), std::vector<Entry>(model.begin(), model.end()))
          << "trial " << trial << " step " << step;
      ASSERT_EQ(index.back(), *model.rbegin());
    }
  }
}

}  // namespace
}  // namespace packsched::planner::internal
