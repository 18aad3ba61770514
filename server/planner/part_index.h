#ifndef PACKSCHED_SERVER_PLANNER_PART_INDEX_H_
#define PACKSCHED_SERVER_PLANNER_PART_INDEX_H_

// The parts of a partition ordered by a key (a cost or a token count): the local search's view
// of which parts are the least and the most loaded.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace packsched::planner::internal {

// (key, part) entries in ascending order, one per part, kept in a sorted array. A re-key moves
// the entry by shifting the ones between its old and new place: for the hundreds of parts of a
// plan that is a short memmove, cheaper than a balanced tree's rebalancing and pointer chasing,
// and iteration from either end is a scan of contiguous memory.
class PartIndex {
 public:
  using Entry = std::pair<int64_t, int32_t>;  // (key, part)

  PartIndex() = default;
  // Part p under keys[p], for every p.
  explicit PartIndex(absl::Span<const int64_t> keys) {
    entries_.reserve(keys.size());
    for (size_t p = 0; p < keys.size(); ++p) {
      entries_.emplace_back(keys[p], static_cast<int32_t>(p));
    }
    std::sort(entries_.begin(), entries_.end());
  }

  // Part `part`, now under `old_key`, goes under `new_key`.
  // REQUIRES: (old_key, part) is an entry. O(log k + distance moved).
  void Rekey(int32_t part, int64_t old_key, int64_t new_key) {
    const Entry old_entry{old_key, part};
    const Entry new_entry{new_key, part};
    auto at = std::lower_bound(entries_.begin(), entries_.end(), old_entry);
    if (new_entry > old_entry) {
      // Entries after `at` that order before the new one shift down by one.
      auto to = std::lower_bound(at + 1, entries_.end(), new_entry);
      std::move(at + 1, to, at);
      *(to - 1) = new_entry;
    } else if (new_entry < old_entry) {
      // Entries before `at` that order after the new one shift up by one.
      auto to = std::lower_bound(entries_.begin(), at, new_entry);
      std::move_backward(to, at, at + 1);
      *to = new_entry;
    }
  }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // Ascending: the smallest key first; back() is the largest.
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  const Entry& back() const { return entries_.back(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_PART_INDEX_H_
