#ifndef PACKSCHED_SERVER_PLANNER_LOCAL_SEARCH_H_
#define PACKSCHED_SERVER_PLANNER_LOCAL_SEARCH_H_

// Moves and swaps between the parts of a fixed-k partition: repair (bring parts within the
// cap) and rebalance (lower the largest cost without breaking the cap).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "server/planner/part_index.h"
#include "server/planner/prepared.h"

namespace packsched::planner::internal {

// Holds one partition and its part loads. Deterministic; work is bounded by a budget fixed
// from the input size, at most O(n + k) per unit of budget (a move or swap shifts items within
// two parts and index entries between a part's old and new place), so a call always ends.
class LocalSearch {
 public:
  // `by_cost`, if given, lists every item's position in (cost, position) order, the order each
  // part is kept in: the parts are then put in order by one pass over it, not a sort each.
  LocalSearch(absl::Span<const Item> items, const Capacity& capacity, Parts parts,
              absl::Span<const int32_t> by_cost = {});
  // Moves items out of parts over the capacity into parts that stay within it. Returns whether
  // every part is within the capacity afterwards (false: no single move could help).
  bool Repair();

  // Lowers the largest part cost with moves (unless `keep_counts`) and swaps. A move or swap is
  // taken only if both parts end within the capacity and both end below the old largest cost,
  // so the sorted cost vector decreases at every step: the largest cost never rises.
  void Rebalance(bool keep_counts);

  int64_t max_cost() const { return by_cost_.empty() ? 0 : by_cost_.back().first; }
  Parts Take() { return std::move(parts_); }

 private:
  // Orders item positions by (cost, position): every part's list is kept in this order, so
  // the item of a cost nearest a target is a binary search away and no step sorts a part.
  struct CostLess {
    absl::Span<const Item> items;
    bool operator()(int32_t a, int32_t b) const {
      return items[a].cost != items[b].cost ? items[a].cost < items[b].cost : a < b;
    }
  };
  CostLess ByCost() const { return {items_}; }
  // Adds item `position` to part q at its place in the cost order.
  void Insert(int32_t q, int32_t position);
  // Removes the item at slot `slot` of part p's list from p and adds it to q.
  void Move(int32_t p, size_t slot, int32_t q);
  void Swap(int32_t p, size_t slot_p, int32_t q, size_t slot_q);
  bool Fits(int32_t q, const Item& item) const { return capacity_.Fits(loads_[q], item.aligned); }
  // The load of part p without the item at `slot`, and with `added` instead if not null.
  PartLoad Replaced(int32_t p, size_t slot, const Item* added) const;
  // Re-keys p in the indexes after its load changed from `old`.
  void Reindex(int32_t p, const PartLoad& old);
  bool TryMove(int32_t p, int32_t q, int64_t gap);
  bool TrySwap(int32_t p, int32_t q, int64_t gap);
  // One swap that lowers part p's cap measure without breaking the target's capacity.
  bool RepairBySwap(int32_t p);

  absl::Span<const Item> items_;
  Capacity capacity_;
  Parts parts_;
  std::vector<PartLoad> loads_;
  PartIndex by_cost_;     // (cost, part)
  PartIndex by_aligned_;  // (aligned tokens, part)
  // Every item's cost is its aligned length: by_aligned_ stays empty and by_cost_ serves.
  bool cost_is_aligned_ = false;
  const PartIndex& ByAligned() const { return cost_is_aligned_ ? by_cost_ : by_aligned_; }
  int64_t budget_;
  // Scratch for Repair and RepairBySwap, reused across their steps.
  std::vector<size_t> slots_;
  std::vector<size_t> candidates_;
  std::vector<size_t> in_q_;
};

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_LOCAL_SEARCH_H_
