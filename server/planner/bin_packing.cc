#include "server/planner/bin_packing.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
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
class DecreasingBins {
 public:
  explicit DecreasingBins(const Capacity& capacity) : capacity_(capacity) {}

  // The smallest key an open bin needs to take `item`.
  int64_t Need(const Item& item) const { return padded() ? 0 : item.aligned; }

  // Opens a bin with `item`; returns its id.
  int32_t Open(const Item& item, int32_t position) {
    parts_.emplace_back();
    loads_.emplace_back();
    const int32_t bin = static_cast<int32_t>(parts_.size()) - 1;
    Add(bin, item, position);
    return bin;
  }

  void Add(int32_t bin, const Item& item, int32_t position) {
    parts_[bin].push_back(position);
    loads_[bin].Add(item);
  }

  int64_t Key(int32_t bin) const {
    const PartLoad& load = loads_[bin];
    if (capacity_.max_seqs() > 0 && load.count >= capacity_.max_seqs()) return kClosed;
    if (!capacity_.has_cap()) return kUnbounded;
    if (!padded()) return capacity_.cap() - load.aligned;
    return capacity_.cap() - (load.count + 1) * load.max_aligned;
  }

  int32_t size() const { return static_cast<int32_t>(parts_.size()); }
  Parts Take() { return std::move(parts_); }

 private:
  bool padded() const { return capacity_.mode() == CapMode::kPadded; }

  const Capacity& capacity_;
  Parts parts_;
  std::vector<PartLoad> loads_;
};

// Max-segment tree over bin keys, for the leftmost bin whose key reaches a threshold.
class LeftmostTree {
 public:
  explicit LeftmostTree(int32_t capacity) {
    size_ = 1;
    while (size_ < capacity) size_ *= 2;
    tree_.assign(2 * size_, kClosed - 1);
  }
  void Set(int32_t leaf, int64_t key) {
    int32_t node = leaf + size_;
    tree_[node] = key;
    for (node /= 2; node >= 1; node /= 2)
      tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
  }
  // Leftmost leaf with key >= need, or -1.
  int32_t Find(int64_t need) const {
    if (tree_[1] < need) return -1;
    int32_t node = 1;
    while (node < size_) node = tree_[2 * node] >= need ? 2 * node : 2 * node + 1;
    return node - size_;
  }

 private:
  int32_t size_;
  std::vector<int64_t> tree_;
};

}  // namespace

Parts FirstFitDecreasing(absl::Span<const Item> items, const Capacity& capacity) {
  DecreasingBins bins(capacity);
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
  DecreasingBins bins(capacity);
  std::set<std::pair<int64_t, int32_t>> open;  // (key, bin): the tightest fitting bin first
  for (int32_t position : order) {
    const Item& item = items[position];
    auto it = open.lower_bound({bins.Need(item), -1});
    if (it == open.end()) {
      const int32_t bin = bins.Open(item, position);
      const int64_t key = bins.Key(bin);
      if (key != kClosed) open.emplace(key, bin);
      continue;
    }
    // The bin's node is re-keyed in place (extract, edit, insert): no allocation per item.
    auto node = open.extract(it);
    const int32_t bin = node.value().second;
    bins.Add(bin, item, position);
    const int64_t key = bins.Key(bin);
    if (key == kClosed) continue;
    node.value().first = key;
    open.insert(std::move(node));
  }
  return bins.Take();
}

Parts Sequential(absl::Span<const Item> items, const Capacity& capacity) {
  Parts parts;
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
