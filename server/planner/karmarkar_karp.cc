#include "server/planner/karmarkar_karp.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "server/planner/lpt.h"

namespace packsched::planner::internal {
namespace {

// Restores the heap [first, last) (std::make_heap's order under `less`) after its top element
// was overwritten: one pass down instead of a pop_heap plus a push_heap. Every key used here is
// unique, so the sequence of tops is the one the pop/push pair would give.
template <typename It, typename Less>
void ReplaceTop(It first, It last, Less less) {
  // The new top sinks as a hole: each step moves one child up, and the top lands once.
  const ptrdiff_t n = last - first;
  auto top = std::move(first[0]);
  ptrdiff_t i = 0;
  while (true) {
    ptrdiff_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && less(first[child], first[child + 1])) ++child;
    if (!less(top, first[child])) break;
    first[i] = std::move(first[child]);
    i = child;
  }
  first[i] = std::move(top);
}

// One non-empty sum of a tuple; its items form a linked list through `next`.
struct Slot {
  int64_t sum;
  int32_t head;
  int32_t tail;
};

// Min-heap order on slots; ties by head item so every run decides identically.
struct SlotGreater {
  bool operator()(const Slot& a, const Slot& b) const {
    return a.sum != b.sum ? a.sum > b.sum : a.head > b.head;
  }
};

// A k-tuple holding only its non-empty sums (the other k - slots.size() are 0). A tuple of one
// item (every tuple at the start) keeps its sum in `single` with `slots` empty, so the n
// starting tuples allocate nothing; `slots` is used from the first merge into it.
struct Tuple {
  std::vector<Slot> slots;  // min-heap under SlotGreater
  Slot single{0, -1, -1};   // the one sum while slots is empty (head -1: consumed)
  int64_t max = 0;

  int64_t size() const { return slots.empty() ? (single.head >= 0 ? 1 : 0) : slots.size(); }
  const Slot& smallest() const { return slots.empty() ? single : slots.front(); }
};

class Merger {
 public:
  Merger(int64_t k, std::vector<int32_t>& next) : k_(k), next_(next) {}

  int64_t Spread(const Tuple& t) const {
    const int64_t min = t.size() < k_ ? 0 : t.smallest().sum;
    return t.max - min;
  }

  // Merges `small` into `big`: big's smallest sums (zeros first) take small's sums, largest to
  // smallest. Costs O(|small| log |big|).
  void Merge(Tuple& big, Tuple& small) {
    if (big.slots.empty()) {  // big holds one item: it moves into its heap (of one)
      big.slots.reserve(2);
      big.slots.push_back(big.single);
      big.single.head = -1;
    }
    Slot* incoming = &small.single;
    if (!small.slots.empty()) {
      incoming = small.slots.data();
      std::sort(small.slots.begin(), small.slots.end(), [](const Slot& a, const Slot& b) {
        return a.sum != b.sum ? a.sum > b.sum : a.head < b.head;
      });
    }
    const int64_t zeros = k_ - static_cast<int64_t>(big.slots.size());
    const int64_t m = small.size();
    const int64_t from_zeros = std::min(zeros, m);
    // The big tuple's m smallest sums in ascending order: from_zeros empty ones, then heap pops.
    // The last of them is not popped: it stays at the top and its merged sum replaces it there.
    taken_.clear();
    for (int64_t j = from_zeros; j + 1 < m; ++j) {
      std::pop_heap(big.slots.begin(), big.slots.end(), SlotGreater());
      taken_.push_back(big.slots.back());
      big.slots.pop_back();
    }
    const bool last_from_heap = from_zeros < m;
    if (last_from_heap) taken_.push_back(big.slots.front());
    auto merged_at = [&](int64_t j) {
      Slot merged = incoming[j];
      if (j >= from_zeros) {
        const Slot& old = taken_[j - from_zeros];
        merged.sum += old.sum;
        next_[old.tail] = incoming[j].head;
        merged.head = old.head;
        merged.tail = incoming[j].tail;
      }
      big.max = std::max(big.max, merged.sum);
      return merged;
    };
    if (last_from_heap) {
      big.slots.front() = merged_at(m - 1);
      ReplaceTop(big.slots.begin(), big.slots.end(), SlotGreater());
    }
    for (int64_t j = 0; j < (last_from_heap ? m - 1 : m); ++j) {
      big.slots.push_back(merged_at(j));
      std::push_heap(big.slots.begin(), big.slots.end(), SlotGreater());
    }
    std::vector<Slot>().swap(small.slots);
    small.single.head = -1;
  }

 private:
  int64_t k_;
  std::vector<int32_t>& next_;
  std::vector<Slot> taken_;
};

}  // namespace

Parts KarmarkarKarp(absl::Span<const int64_t> costs, int64_t k) {
  return KarmarkarKarp(costs, OrderByCostDesc(costs), k);
}

Parts KarmarkarKarp(absl::Span<const int64_t> costs, absl::Span<const int32_t> cost_order,
                    int64_t k) {
  const int32_t n = static_cast<int32_t>(costs.size());
  Parts parts(k, PlanMemory());
  if (n == 0) return parts;
  std::vector<int32_t> next(n, -1);
  std::vector<Tuple> tuples(n);
  Merger merger(k, next);
  for (int32_t i = 0; i < n; ++i) {
    tuples[i].single = Slot{costs[i], i, i};
    tuples[i].max = costs[i];
  }
  // The textbook method keeps every tuple in one max-heap of (spread, -id): the largest spread
  // first, ties to the lowest id. Almost every merge here takes a tuple that is still a single
  // item, and a single's key never changes before it is popped: the singles wait in a list
  // already in key order, and only the merged tuples live in a heap. Every pop takes the larger
  // of the two fronts; keys are unique, so the pops are the ones the one heap would give.
  // A single's spread is its cost for k >= 2 (the list is cost_order) and 0 for k = 1 (the
  // list is every id in turn).
  using Entry = std::pair<int64_t, int64_t>;
  std::vector<Entry> merged;  // max-heap (std::make_heap order) of merged tuples
  int32_t next_single = 0;
  auto single_at = [&](int32_t s) { return k >= 2 ? cost_order[s] : s; };
  auto pop = [&]() -> int64_t {
    if (next_single < n) {
      const int32_t id = single_at(next_single);
      const Entry single{merger.Spread(tuples[id]), -static_cast<int64_t>(id)};
      if (merged.empty() || merged.front() < single) {
        ++next_single;
        return id;
      }
    }
    std::pop_heap(merged.begin(), merged.end());
    const int64_t id = -merged.back().second;
    merged.pop_back();
    return id;
  };
  while ((n - next_single) + static_cast<int64_t>(merged.size()) > 1) {
    const int64_t a = pop();
    const int64_t b = pop();
    const bool a_big = tuples[a].size() >= tuples[b].size();
    const int64_t big = a_big ? a : b;
    const int64_t small = a_big ? b : a;
    merger.Merge(tuples[big], tuples[small]);
    // The result keeps the id of the first popped tuple, as the textbook method does, so ties
    // in later rounds break the same way.
    if (big != a) std::swap(tuples[a], tuples[big]);
    merged.emplace_back(merger.Spread(tuples[a]), -a);
    std::push_heap(merged.begin(), merged.end());
  }
  const Tuple& last = tuples[next_single < n ? single_at(next_single) : -merged.front().second];
  // Emit parts in descending sum order for a stable, readable result.
  std::vector<Slot> slots = last.slots.empty() ? std::vector<Slot>{last.single} : last.slots;
  std::sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) {
    return a.sum != b.sum ? a.sum > b.sum : a.head < b.head;
  });
  for (size_t p = 0; p < slots.size(); ++p) {
    size_t count = 1;  // each part's list is walked twice: one allocation per part
    for (int32_t i = slots[p].head; i != slots[p].tail && i != -1; i = next[i]) ++count;
    parts[p].reserve(count);
    for (int32_t i = slots[p].head; i != -1; i = next[i]) {
      parts[p].push_back(i);
      if (i == slots[p].tail) break;
    }
  }
  return parts;
}

}  // namespace packsched::planner::internal
