#include "server/planner/local_search.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

namespace packsched::planner::internal {
namespace {

// How many of the least loaded parts a step tries as targets, and how many items of the
// source part it probes per target: enough to find a good step, few enough to stay cheap.
constexpr int kTargets = 8;
constexpr int kProbes = 16;

}  // namespace

LocalSearch::LocalSearch(absl::Span<const Item> items, const Capacity& capacity, Parts parts,
                         absl::Span<const int32_t> by_cost)
    : items_(items), capacity_(capacity), parts_(std::move(parts)) {
  loads_ = LoadsOf(parts_, items_);
  cost_is_aligned_ = std::all_of(items_.begin(), items_.end(),
                                 [](const Item& item) { return item.cost == item.aligned; });
  if (!by_cost.empty()) {
    // Every part's items in (cost, position) order at once: each item is appended to its part
    // in the global order (the key is unique, so this is the order a sort would give).
    std::vector<int32_t> part_of(items_.size(), -1);
    for (int32_t p = 0; p < static_cast<int32_t>(parts_.size()); ++p) {
      for (int32_t position : parts_[p]) part_of[position] = p;
      parts_[p].clear();  // keeps its capacity
    }
    for (int32_t position : by_cost) {
      if (part_of[position] >= 0) parts_[part_of[position]].push_back(position);
    }
  } else {
    for (Part& part : parts_) std::sort(part.begin(), part.end(), ByCost());
  }
  // When every cost is the aligned length (the tokens cost model) the two indexes would hold
  // the same keys: by_cost_ serves as both.
  auto index = [&](auto key_of) {
    std::vector<int64_t> keys(parts_.size());
    for (size_t p = 0; p < parts_.size(); ++p) keys[p] = key_of(loads_[p]);
    return PartIndex(keys);
  };
  by_cost_ = index([](const PartLoad& load) { return load.cost; });
  if (!cost_is_aligned_) by_aligned_ = index([](const PartLoad& load) { return load.aligned; });
  budget_ = 8 * static_cast<int64_t>(items_.size() + parts_.size()) + 1024;
}

PartLoad LocalSearch::Replaced(int32_t p, size_t slot, const Item* added) const {
  const Item& gone = items_[parts_[p][slot]];
  PartLoad out = loads_[p];
  out.cost -= gone.cost;
  out.aligned -= gone.aligned;
  --out.count;
  // Only the padded cap reads the longest length; recompute it only when it may have left.
  if (capacity_.mode() == CapMode::kPadded && gone.aligned == out.max_aligned) {
    out.max_aligned = 0;
    for (size_t s = 0; s < parts_[p].size(); ++s) {
      if (s != slot) out.max_aligned = std::max(out.max_aligned, items_[parts_[p][s]].aligned);
    }
  }
  if (added != nullptr) out.Add(*added);
  return out;
}

void LocalSearch::Insert(int32_t q, int32_t position) {
  Part& part = parts_[q];
  part.insert(std::upper_bound(part.begin(), part.end(), position, ByCost()), position);
}

void LocalSearch::Reindex(int32_t p, const PartLoad& old) {
  by_cost_.Rekey(p, old.cost, loads_[p].cost);
  if (!cost_is_aligned_) by_aligned_.Rekey(p, old.aligned, loads_[p].aligned);
}

void LocalSearch::Move(int32_t p, size_t slot, int32_t q) {
  const int32_t position = parts_[p][slot];
  const PartLoad old_p = loads_[p], old_q = loads_[q];
  loads_[p] = Replaced(p, slot, nullptr);
  parts_[p].erase(parts_[p].begin() + static_cast<ptrdiff_t>(slot));
  Insert(q, position);
  loads_[q].Add(items_[position]);
  Reindex(p, old_p);
  Reindex(q, old_q);
}

void LocalSearch::Swap(int32_t p, size_t slot_p, int32_t q, size_t slot_q) {
  const PartLoad after_p = Replaced(p, slot_p, &items_[parts_[q][slot_q]]);
  const PartLoad after_q = Replaced(q, slot_q, &items_[parts_[p][slot_p]]);
  const int32_t from_p = parts_[p][slot_p];
  const int32_t from_q = parts_[q][slot_q];
  parts_[p].erase(parts_[p].begin() + static_cast<ptrdiff_t>(slot_p));
  parts_[q].erase(parts_[q].begin() + static_cast<ptrdiff_t>(slot_q));
  Insert(p, from_q);
  Insert(q, from_p);
  const PartLoad old_p = loads_[p], old_q = loads_[q];
  loads_[p] = after_p;
  loads_[q] = after_q;
  Reindex(p, old_p);
  Reindex(q, old_q);
}

bool LocalSearch::TryMove(int32_t p, int32_t q, int64_t gap) {
  // Moving cost c from p to q lowers the pair's maximum iff 0 < c < gap; c = gap / 2 is best.
  // Slots are in cost order, so the probes walk outwards from gap / 2.
  auto cost = [&](size_t s) { return items_[parts_[p][s]].cost; };
  const int64_t target = gap / 2;
  auto it =
      std::lower_bound(parts_[p].begin(), parts_[p].end(), target,
                       [&](int32_t position, int64_t t) { return items_[position].cost < t; });
  ptrdiff_t right = it - parts_[p].begin();
  ptrdiff_t left = right - 1;
  const ptrdiff_t end = static_cast<ptrdiff_t>(parts_[p].size());
  for (int probe = 0; probe < kProbes && (left >= 0 || right < end); ++probe) {
    --budget_;
    const bool take_right = left < 0 || (right < end && std::llabs(cost(right) - target) <=
                                                            std::llabs(cost(left) - target));
    const size_t slot = static_cast<size_t>(take_right ? right++ : left--);
    const Item& item = items_[parts_[p][slot]];
    if (item.cost < 1 || item.cost >= gap) continue;
    if (Fits(q, item)) {
      Move(p, slot, q);
      return true;
    }
  }
  return false;
}

bool LocalSearch::TrySwap(int32_t p, int32_t q, int64_t gap) {
  // Swapping i (in p) for j (in q) lowers the pair's maximum iff 0 < c_i - c_j < gap.
  // q's slots are in cost order.
  const Part& in_q = parts_[q];
  const int64_t target = gap / 2;
  int64_t best_distance = gap;
  size_t best_p = 0, best_q = 0;
  // `at`: the first slot of q whose cost is >= want (a lower bound). p's slots are in cost
  // order, so want never decreases from one sp to the next and `at` only moves forward: one
  // pass over q instead of a binary search per item of p.
  ptrdiff_t at = 0;
  for (size_t sp = 0; sp < parts_[p].size() && budget_ > 0; ++sp) {
    const Item& give = items_[parts_[p][sp]];
    const int64_t want = give.cost - target;  // the c_j that makes the difference gap / 2
    while (at < static_cast<ptrdiff_t>(in_q.size()) && items_[in_q[at]].cost < want) ++at;
    for (ptrdiff_t j = std::max<ptrdiff_t>(0, at - 1);
         j < std::min<ptrdiff_t>(static_cast<ptrdiff_t>(in_q.size()), at + 1); ++j) {
      --budget_;
      const size_t sq = static_cast<size_t>(j);
      const Item& take = items_[parts_[q][sq]];
      const int64_t d = give.cost - take.cost;
      if (d < 1 || d >= gap || std::llabs(d - target) >= best_distance) continue;
      if (capacity_.Over(Replaced(p, sp, &take)) || capacity_.Over(Replaced(q, sq, &give))) {
        continue;
      }
      best_distance = std::llabs(d - target);
      best_p = sp;
      best_q = sq;
    }
    if (best_distance == 0) break;
  }
  if (best_distance == gap) return false;
  Swap(p, best_p, q, best_q);
  return true;
}

void LocalSearch::Rebalance(bool keep_counts) {
  while (budget_ > 0 && by_cost_.size() > 1) {
    const auto [largest, p] = by_cost_.back();
    bool improved = false;
    int tried = 0;
    for (auto it = by_cost_.begin(); it != by_cost_.end() && tried < kTargets; ++it) {
      const int32_t q = it->second;
      if (q == p) continue;
      const int64_t gap = largest - it->first;
      if (gap < 2) break;  // ascending costs: every later gap is smaller still
      ++tried;
      if ((!keep_counts && TryMove(p, q, gap)) || TrySwap(p, q, gap)) {
        improved = true;
        break;
      }
    }
    if (!improved) return;
  }
}

bool LocalSearch::RepairBySwap(int32_t p) {
  // Trade an item of p for a shorter one of a part with free tokens: p sheds the difference.
  // Differences of two lengths are far more varied than lengths, so this succeeds where no
  // single move fits. Prefers the smallest difference that clears p's overflow, else the
  // largest that the target can absorb.
  const int64_t overflow = capacity_.Measure(loads_[p]) - capacity_.cap();
  int tried = 0;
  for (auto it = ByAligned().begin(); it != ByAligned().end() && tried < kTargets; ++it) {
    const int32_t q = it->second;
    if (q == p || capacity_.Over(loads_[q])) continue;
    ++tried;
    std::vector<size_t>& in_q = in_q_;
    in_q.resize(parts_[q].size());
    for (size_t s = 0; s < in_q.size(); ++s) in_q[s] = s;
    auto aligned_q = [&](size_t s) { return items_[parts_[q][s]].aligned; };
    // Parts are kept in (cost, position) order: with costs equal to aligned lengths that is
    // already the (aligned, position) order.
    if (!cost_is_aligned_) {
      std::sort(in_q.begin(), in_q.end(), [&](size_t a, size_t b) {
        return aligned_q(a) != aligned_q(b) ? aligned_q(a) < aligned_q(b)
                                            : parts_[q][a] < parts_[q][b];
      });
    }
    bool found = false;
    int64_t best_score = 0;
    size_t best_p = 0, best_q = 0;
    ptrdiff_t at = 0;
    for (size_t sp = 0; sp < parts_[p].size() && budget_ > 0; ++sp) {
      const Item& give = items_[parts_[p][sp]];
      // Any q item no longer than give.aligned - overflow clears p's overflow; probe the few
      // lengths around that boundary.
      const int64_t want = give.aligned - std::max<int64_t>(overflow, 1);
      // `at`: the first slot of q longer than want (an upper bound). With costs equal to
      // aligned lengths p's slots are in aligned order too, want never decreases from one sp
      // to the next, and `at` only moves forward (one pass over q); else a binary search.
      if (cost_is_aligned_) {
        while (at < static_cast<ptrdiff_t>(in_q.size()) && aligned_q(in_q[at]) <= want) ++at;
      } else {
        at = std::upper_bound(in_q.begin(), in_q.end(), want,
                              [&](int64_t w, size_t s) { return w < aligned_q(s); }) -
             in_q.begin();
      }
      for (ptrdiff_t j = std::max<ptrdiff_t>(0, at - 2);
           j < std::min<ptrdiff_t>(static_cast<ptrdiff_t>(in_q.size()), at + 2); ++j) {
        --budget_;
        const size_t sq = in_q[j];
        const Item& take = items_[parts_[q][sq]];
        const int64_t d = give.aligned - take.aligned;
        if (d <= 0) continue;
        if (capacity_.mode() == CapMode::kTokens) {
          // A swap keeps both counts (q's is within the limit: q is not over), p sheds d > 0
          // tokens, and q stays within the cap iff its tokens plus d do: the check below
          // without building the two loads.
          if (capacity_.has_cap() && loads_[q].aligned + d > capacity_.cap()) continue;
        } else {
          const PartLoad after_p = Replaced(p, sp, &take);
          const PartLoad after_q = Replaced(q, sq, &give);
          if (capacity_.Over(after_q) ||
              capacity_.Measure(after_p) >= capacity_.Measure(loads_[p])) {
            continue;
          }
        }
        // Clearing beats reducing; among clearing swaps the smallest d, else the largest d.
        const int64_t score = d >= overflow ? (int64_t{1} << 62) - d : d;
        if (!found || score > best_score) {
          found = true;
          best_score = score;
          best_p = sp;
          best_q = sq;
        }
      }
    }
    if (found) {
      Swap(p, best_p, q, best_q);
      return true;
    }
  }
  return false;
}

bool LocalSearch::Repair() {
  for (int32_t p = 0; p < static_cast<int32_t>(parts_.size()); ++p) {
    while (capacity_.Over(loads_[p])) {
      if (--budget_ < 0) return false;
      // Evict the smallest item that clears the token overflow in one move, else the largest
      // that fits somewhere; targets are the parts with the most free tokens.
      const int64_t overflow =
          capacity_.has_cap() ? capacity_.Measure(loads_[p]) - capacity_.cap() : 0;
      std::vector<size_t>& slots = slots_;
      slots.resize(parts_[p].size());
      for (size_t s = 0; s < slots.size(); ++s) slots[s] = s;
      auto aligned = [&](size_t s) { return items_[parts_[p][s]].aligned; };
      if (!cost_is_aligned_) {  // else already in this order (see RepairBySwap)
        std::sort(slots.begin(), slots.end(), [&](size_t a, size_t b) {
          return aligned(a) != aligned(b) ? aligned(a) < aligned(b) : parts_[p][a] < parts_[p][b];
        });
      }
      const ptrdiff_t first =
          std::lower_bound(slots.begin(), slots.end(), overflow,
                           [&](size_t s, int64_t o) { return aligned(s) < o; }) -
          slots.begin();
      std::vector<size_t>& candidates = candidates_;
      candidates.clear();
      for (ptrdiff_t s = first; s < static_cast<ptrdiff_t>(slots.size()); ++s) {
        candidates.push_back(slots[s]);
      }
      for (ptrdiff_t s = first - 1; s >= 0; --s) candidates.push_back(slots[s]);
      bool moved = false;
      for (size_t c = 0; c < candidates.size() && c < kProbes && !moved; ++c) {
        const Item& item = items_[parts_[p][candidates[c]]];
        int tried = 0;
        for (auto it = ByAligned().begin(); it != ByAligned().end() && tried < kTargets; ++it) {
          const int32_t q = it->second;
          if (q == p || capacity_.Over(loads_[q])) continue;
          ++tried;
          if (Fits(q, item)) {
            Move(p, candidates[c], q);
            moved = true;
            break;
          }
        }
      }
      if (!moved && !RepairBySwap(p)) return false;
    }
  }
  return true;
}

}  // namespace packsched::planner::internal
