#include "server/planner/bin_packing.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory_resource>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "server/planner/lpt.h"

namespace packsched::planner::internal {
namespace {

constexpr int64_t kClosed = -1;
constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

// Positions by aligned length descending, ties by position.
std::vector<int32_t> ByAlignedDesc(absl::Span<const Item> items) {
  std::vector<int64_t> aligned(items.size());
  for (size_t i = 0; i < items.size(); ++i) aligned[i] = items[i].aligned;
  return OrderByCostDesc(aligned);
}

// Bins filled in aligned-descending order. A bin's key says what still fits, as one integer:
// in tokens mode the free aligned tokens (an item fits iff key >= its aligned length); in
// padded mode the free padded tokens after one more row of the bin's first (longest) length
// (an item, never longer than that, fits iff key >= 0). kClosed once the sequence limit is hit.
//
// Bins are recorded as one (position, bin) entry per placed item; the parts are built once at
// the end, each with its final size (one allocation per bin instead of one per doubling).
class DecreasingBins {
 public:
  DecreasingBins(const Capacity& capacity, size_t num_items) : capacity_(capacity) {
    placed_.reserve(num_items);
  }

  // The smallest key an open bin needs to take `item`.
  int64_t Need(const Item& item) const { return padded() ? 0 : item.aligned; }

  // Opens a bin with `item`; returns its id.
  int32_t Open(const Item& item, int32_t position) {
    loads_.emplace_back();
    const int32_t bin = static_cast<int32_t>(loads_.size()) - 1;
    Add(bin, item, position);
    return bin;
  }

  void Add(int32_t bin, const Item& item, int32_t position) {
    placed_.emplace_back(position, bin);
    loads_[bin].Add(item);
  }

  int64_t Key(int32_t bin) const {
    const PartLoad& load = loads_[bin];
    if (capacity_.max_seqs() > 0 && load.count >= capacity_.max_seqs()) return kClosed;
    if (!capacity_.has_cap()) return kUnbounded;
    if (!padded()) return capacity_.cap() - load.aligned;
    return capacity_.cap() - (load.count + 1) * load.max_aligned;
  }

  int32_t size() const { return static_cast<int32_t>(loads_.size()); }

  // The bins, each listing its items in the order they were added.
  Parts Take() const {
    Parts parts(loads_.size(), PlanMemory());
    for (size_t bin = 0; bin < loads_.size(); ++bin) parts[bin].reserve(loads_[bin].count);
    for (const auto& [position, bin] : placed_) parts[bin].push_back(position);
    return parts;
  }

 private:
  bool padded() const { return capacity_.mode() == CapMode::kPadded; }

  const Capacity& capacity_;
  std::vector<std::pair<int32_t, int32_t>> placed_;  // (position, bin) in placing order
  std::vector<PartLoad> loads_;
};

// Room for one std::set node of an (int64, int64, int32) tuple (56 bytes with libstdc++).
constexpr size_t kNodeBytes = 64;

// Max-segment tree over bin keys, for the leftmost bin whose key reaches a threshold.
class LeftmostTree {
 public:
  explicit LeftmostTree(int32_t capacity) {
    size_ = 1;
    while (size_ < capacity) size_ *= 2;
    tree_.assign(2 * size_, kClosed - 1);
  }
  void Set(int32_t leaf, int64_t key) {
    int64_t node = leaf + size_;
    tree_[node] = key;
    for (node /= 2; node >= 1; node /= 2)
      tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
  }
  // Leftmost leaf with key >= need, or -1.
  int32_t Find(int64_t need) const {
    if (tree_[1] < need) return -1;
    int64_t node = 1;
    while (node < size_) node = tree_[2 * node] >= need ? 2 * node : 2 * node + 1;
    return static_cast<int32_t>(node - size_);
  }

 private:
  // Leaves: the smallest power of two >= capacity. Node indices are int64_t so that 2 * node
  // is computed in the width it is used in (up to 2^32 for a capacity near 2^31).
  int64_t size_;
  std::vector<int64_t> tree_;
};

}  // namespace

Parts FirstFitDecreasing(absl::Span<const Item> items, const Capacity& capacity) {
  DecreasingBins bins(capacity, items.size());
  LeftmostTree tree(std::max<int32_t>(1, static_cast<int32_t>(items.size())));
  for (int32_t position : ByAlignedDesc(items)) {
    const Item& item = items[position];
    int32_t bin = tree.Find(bins.Need(item));
    if (bin < 0) {
      bin = bins.Open(item, position);
    } else {
      bins.Add(bin, item, position);
    }
    tree.Set(bin, bins.Key(bin));
  }
  return bins.Take();
}

Parts BestFitDecreasing(absl::Span<const Item> items, const Capacity& capacity) {
  return BestFitDecreasing(items, capacity, ByAlignedDesc(items));
}

Parts BestFitDecreasing(absl::Span<const Item> items, const Capacity& capacity,
                        absl::Span<const int32_t> order) {
  DecreasingBins bins(capacity, items.size());
  // One node per open bin, re-keyed in place: the nodes come from a buffer here (and blocks
  // growing geometrically past it), not one malloc each; none is freed before the end.
  std::byte first_nodes[128 * kNodeBytes];
  std::pmr::monotonic_buffer_resource nodes(first_nodes, sizeof(first_nodes));
  // (key, stamp, bin): the tightest fitting bin first; among equally tight bins the one that
  // reached that key first (stamp: a counter taken at each (re)keying), as TRL's BFD chooses.
  std::pmr::set<std::tuple<int64_t, int64_t, int32_t>> open(&nodes);
  int64_t stamp = 0;
  for (int32_t position : order) {
    const Item& item = items[position];
    auto it = open.lower_bound({bins.Need(item), -1, -1});
    if (it == open.end()) {
      const int32_t bin = bins.Open(item, position);
      const int64_t key = bins.Key(bin);
      if (key != kClosed) open.emplace(key, stamp++, bin);
      continue;
    }
    // The bin's node is re-keyed in place (extract, edit, insert): no allocation per item.
    auto node = open.extract(it);
    const int32_t bin = std::get<2>(node.value());
    bins.Add(bin, item, position);
    const int64_t key = bins.Key(bin);
    if (key == kClosed) continue;
    node.value() = {key, stamp++, bin};
    open.insert(std::move(node));
  }
  return bins.Take();
}

Parts Sequential(absl::Span<const Item> items, const Capacity& capacity) {
  Parts parts(PlanMemory());
  PartLoad load;
  for (int32_t position = 0; position < static_cast<int32_t>(items.size()); ++position) {
    const Item& item = items[position];
    if (parts.empty() || !capacity.Fits(load, item.aligned)) {
      parts.emplace_back();
      load = PartLoad{};
    }
    parts.back().push_back(position);
    load.Add(item);
  }
  return parts;
}

}  // namespace packsched::planner::internal
