#include "server/planner/tree_cut_exact.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace packsched::planner::internal {
namespace {

// Nodes the bin search may visit before the programme over subsets takes over.
constexpr int64_t kBinSearchNodes = int64_t{1} << 14;

// Martello and Toth's L2: a lower bound on the bins of `capacity` that hold `w`.
int64_t BinsFloor(const std::vector<int64_t>& w, int64_t capacity) {
  int64_t best = 0;
  std::vector<int64_t> thresholds = {0};
  for (int64_t x : w) {
    if (2 * x <= capacity) thresholds.push_back(x);
  }
  for (int64_t k : thresholds) {
    int64_t big = 0;        // over capacity - k: alone in a bin
    int64_t half = 0;       // over half, at most capacity - k: one a bin
    int64_t half_free = 0;  // the room those leave
    int64_t small_sum = 0;  // in [k, half]: must fit around them or in new bins
    for (int64_t x : w) {
      if (x > capacity - k) {
        ++big;
      } else if (2 * x > capacity) {
        ++half;
        half_free += capacity - x;
      } else if (x >= k) {
        small_sum += x;
      }
    }
    const int64_t over = small_sum - half_free;
    const int64_t bins = big + half + (over > 0 ? (over + capacity - 1) / capacity : 0);
    best = std::max(best, bins);
  }
  return best;
}

// The fewest bins of `capacity` for the items `w` (each within it), as pieces, when at most
// `most` bins do, else none: the programme over subsets whose value is (bins, fill of the last
// bin), least first, expanding only the states that may still end within `most` bins.
std::optional<std::vector<uint32_t>> FewestBins(const std::vector<int64_t>& w, int64_t capacity,
                                                int64_t most, StopCheck* stop) {
  const int m = static_cast<int>(w.size());
  const uint32_t full = (uint32_t{1} << m) - 1;
  std::vector<int64_t> placed(size_t{full} + 1, 0);  // the items' sum
  for (uint32_t s = 1; s <= full; ++s) {
    placed[s] = placed[s & (s - 1)] + w[std::countr_zero(s)];
  }
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  // (bins, fill) as bins * (capacity + 1) + fill; capacity < 2^31 and bins <= 16.
  std::vector<int64_t> state(size_t{full} + 1, kNone);
  std::vector<int8_t> last(size_t{full} + 1, -1);
  state[0] = capacity + 1;  // one empty bin open
  for (uint32_t s = 0; s < full; ++s) {
    if (stop != nullptr && !stop->Continue(m)) return std::nullopt;
    if (state[s] == kNone) continue;
    const int64_t bins = state[s] / (capacity + 1);
    const int64_t fill = state[s] % (capacity + 1);
    // The closed bins' room is spent: the rest must fit what `most` bins have left.
    if (bins > most || (bins - 1) * capacity + fill + placed[full] - placed[s] > most * capacity) {
      continue;
    }
    for (uint32_t rest = full & ~s; rest != 0; rest &= rest - 1) {
      const int j = std::countr_zero(rest);
      const int64_t next = fill + w[j] <= capacity ? bins * (capacity + 1) + fill + w[j]
                                                   : (bins + 1) * (capacity + 1) + w[j];
      const uint32_t t = s | (uint32_t{1} << j);
      if (next < state[t]) {
        state[t] = next;
        last[t] = static_cast<int8_t>(j);
      }
    }
  }
  if (state[full] == kNone || state[full] / (capacity + 1) > most) return std::vector<uint32_t>{};
  std::vector<int> items;
  for (uint32_t s = full; s != 0; s ^= uint32_t{1} << last[s]) items.push_back(last[s]);
  std::vector<uint32_t> bins;
  int64_t fill = capacity + 1;
  for (auto it = items.rbegin(); it != items.rend(); ++it) {
    if (fill + w[*it] > capacity) {
      bins.push_back(0);
      fill = 0;
    }
    bins.back() |= uint32_t{1} << *it;
    fill += w[*it];
  }
  return bins;
}

// Whether the items fit in `most` bins, by depth-first search: the items largest first, each
// to a bin with room (bins of equal fill tried once, a new bin only as the first empty one),
// a branch left once the room no remaining item fits passes the slack. nullopt when the
// search passes `budget` nodes; else the bins found (empty when none).
class BinSearch {
 public:
  BinSearch(const std::vector<int64_t>& w, int64_t capacity, int64_t most, int64_t budget)
      : w_(w),
        capacity_(capacity),
        most_(most),
        budget_(budget),
        fill_(most, 0),
        bin_of_(w.size()) {
    order_.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) order_[i] = static_cast<int>(i);
    std::sort(order_.begin(), order_.end(), [&](int a, int b) { return w[a] > w[b]; });
    int64_t sum = 0;
    for (int64_t x : w) sum += x;
    slack_ = most * capacity - sum;
  }

  std::optional<std::vector<uint32_t>> Run() {
    if (slack_ < 0) return std::vector<uint32_t>{};
    const bool found = Place(0, 0);
    if (nodes_ > budget_) return std::nullopt;
    std::vector<uint32_t> bins;
    if (!found) return bins;
    bins.assign(most_, 0);
    for (size_t i = 0; i < w_.size(); ++i) bins[bin_of_[i]] |= uint32_t{1} << i;
    bins.erase(std::remove(bins.begin(), bins.end(), 0u), bins.end());
    return bins;
  }

  int64_t nodes() const { return nodes_; }

 private:
  bool Place(size_t next, int64_t used) {
    if (next == order_.size()) return true;
    if (++nodes_ > budget_) return false;
    const int item = order_[next];
    const int64_t x = w_[item];
    // Room that no remaining item (each at least the smallest) can use is waste.
    const int64_t smallest = w_[order_.back()];
    int64_t waste = 0;
    for (int64_t b = 0; b < used; ++b) {
      if (capacity_ - fill_[b] < smallest) waste += capacity_ - fill_[b];
    }
    if (waste > slack_) return false;
    for (int64_t b = 0; b < std::min(used + 1, most_); ++b) {
      if (fill_[b] + x > capacity_) continue;
      bool tried = false;
      for (int64_t a = 0; a < b && !tried; ++a) tried = fill_[a] == fill_[b];
      if (tried) continue;
      fill_[b] += x;
      bin_of_[item] = b;
      if (Place(next + 1, std::max(used, b + 1))) return true;
      fill_[b] -= x;
      if (nodes_ > budget_) return false;
    }
    return false;
  }

  const std::vector<int64_t>& w_;
  const int64_t capacity_;
  const int64_t most_;
  const int64_t budget_;
  std::vector<int64_t> fill_;
  std::vector<int64_t> bin_of_;
  std::vector<int> order_;
  int64_t slack_ = 0;
  int64_t nodes_ = 0;
};

// The pieces in the order of their lowest rollout.
void SortPieces(std::vector<uint32_t>& pieces) {
  std::sort(pieces.begin(), pieces.end(),
            [](uint32_t a, uint32_t b) { return std::countr_zero(a) < std::countr_zero(b); });
}

}  // namespace

std::optional<ExactPieces> ExactCut(const std::vector<int64_t>& len,
                                    const std::vector<int64_t>& common, int64_t room, int64_t known,
                                    StopCheck* stop) {
  const int m = static_cast<int>(len.size());
  const uint32_t full = (uint32_t{1} << m) - 1;
  // A group: every two rollouts share the same `prompt` tokens.
  const int64_t prompt = m > 1 ? common[1] : 0;
  bool group = m > 1;
  for (int i = 0; i < m && group; ++i) {
    for (int j = i + 1; j < m && group; ++j) group = common[i * m + j] == prompt;
  }
  if (group) {
    std::vector<int64_t> w(m);
    int64_t sum = 0;
    for (int i = 0; i < m; ++i) sum += w[i] = len[i] - prompt;
    ExactPieces out;
    // Each bin forwards the prompt once: fewer tokens than `known` need at most `most` bins.
    // Fewer bins are asked for until none do.
    const int64_t floor = BinsFloor(w, room - prompt);
    for (int64_t most = (known - sum - 1) / prompt; most >= floor;) {
      // The search first, the programme over subsets (the fewest at once) past its budget.
      BinSearch search(w, room - prompt, most, kBinSearchNodes);
      std::optional<std::vector<uint32_t>> bins = search.Run();
      if (stop != nullptr && !stop->Continue(search.nodes())) return std::nullopt;
      if (!bins) bins = FewestBins(w, room - prompt, most, stop);
      if (!bins) return std::nullopt;
      if (bins->empty()) break;
      out.pieces = std::move(*bins);
      most = static_cast<int64_t>(out.pieces.size()) - 1;
    }
    if (out.pieces.empty()) return out;
    SortPieces(out.pieces);
    out.tokens = static_cast<int64_t>(out.pieces.size()) * prompt + sum;
    return out;
  }
  // tokens[s]: the union of the paths of the rollouts in s, built from s without its highest
  // rollout h: h adds its path below the deepest prefix it shares with the others.
  std::vector<int64_t> tokens(size_t{full} + 1, 0);
  for (uint32_t s = 1; s <= full; ++s) {
    const int h = std::bit_width(s) - 1;
    const uint32_t rest = s ^ (uint32_t{1} << h);
    int64_t shared = 0;
    for (uint32_t r = rest; r != 0; r &= r - 1) {
      const int i = std::countr_zero(r);
      if (common[i * m + h] > shared) shared = common[i * m + h];
    }
    tokens[s] = tokens[rest] + len[h] - shared;
  }
  // The pieces within the room that hold rollout i, for the states whose lowest rollout is i.
  std::vector<std::vector<uint32_t>> fits(m);
  for (uint32_t s = 1; s <= full; ++s) {
    if (tokens[s] <= room) fits[std::countr_zero(s)].push_back(s);
  }
  // best[s]: the fewest (tokens, pieces) covering s; first[s]: the piece holding s's lowest
  // rollout in that cut.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> best(size_t{full} + 1, kNone);
  std::vector<int32_t> count(size_t{full} + 1, 0);
  std::vector<uint32_t> first(size_t{full} + 1, 0);
  best[0] = 0;
  for (uint32_t s = 1; s <= full; ++s) {
    const int low = std::countr_zero(s);
    const uint32_t bit = uint32_t{1} << low;
    auto consider = [&](uint32_t piece) {
      const uint32_t rest = s ^ piece;
      if (best[rest] == kNone) return;
      const int64_t t = tokens[piece] + best[rest];
      const int32_t c = count[rest] + 1;
      if (t < best[s] || (t == best[s] && c < count[s])) {
        best[s] = t;
        count[s] = c;
        first[s] = piece;
      }
    };
    const uint32_t others = s ^ bit;
    const int64_t subsets = int64_t{1} << std::popcount(others);
    if (static_cast<int64_t>(fits[low].size()) < subsets) {
      for (uint32_t piece : fits[low]) {
        if ((piece & ~s) == 0) consider(piece);
      }
      if (stop != nullptr && !stop->Continue(static_cast<int64_t>(fits[low].size()))) {
        return std::nullopt;
      }
    } else {
      // Every subset of the others, with the lowest rollout added.
      for (uint32_t sub = others;; sub = (sub - 1) & others) {
        if (tokens[sub | bit] <= room) consider(sub | bit);
        if (sub == 0) break;
      }
      if (stop != nullptr && !stop->Continue(subsets)) return std::nullopt;
    }
  }
  ExactPieces out;
  if (best[full] >= known) return out;
  out.tokens = best[full];
  for (uint32_t s = full; s != 0; s ^= first[s]) out.pieces.push_back(first[s]);
  return out;
}

}  // namespace packsched::planner::internal
