// Dynamic context parallelism: level packing of CP groups, slot by slot (dynamic_cp.h).
//
// A slot is a level of width R: its groups are columns of their size's width, and a column's
// height is its rank's cost. With every sequence's size fixed, the sequences go by cost
// descending into the first slot that takes them (first fit decreasing height): onto the
// least-loaded group of their size whose cost stays within the slot's height and whose ranks'
// rows stay within the cap, else into a new group on free ranks, else into a new slot. Free ranks
// then shorten their slot: the costliest group is split onto them (a second group of its size)
// or widened to a larger allowed size, while that lowers the slot's cost. The sizes come from a
// floor: every sequence at the smallest allowed size that fits the cap, raised to the floor; a
// few floors are tried (the largest is fixed CP at cp_max) and the shortest step wins.

#include "server/planner/dynamic_cp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"

namespace packsched::planner {
namespace {

// Steps of the search for a slot height (each one packing).
constexpr int kSearchSteps = 5;

absl::Status Overflow() {
  return absl::InvalidArgumentError(
      "dynamic_cp: the costs overflow int64 (scale the cost weights down)");
}

struct Column {
  int64_t width = 0;
  int64_t cost = 0;    // micro_batch + sum of its sequences' h
  int64_t tokens = 0;  // aligned tokens / width, one rank's rows
  std::vector<int32_t> items;
};

struct Level {
  int64_t free = 0;  // ranks in no group
  std::vector<Column> columns;
};

// One packing's levels in flat arrays that the next packing reuses (no allocation once they have
// grown): a group's sequences are a list linked through `next`.
struct Packing {
  struct Group {
    int64_t width = 0;
    int64_t cost = 0;
    int64_t tokens = 0;
    int32_t head = -1;  // first and last sequence; -1 when none
    int32_t tail = -1;
    int32_t count = 0;
  };
  // (cost, group): a min-heap per level and size, cheapest first (ties: created first).
  using Entry = std::pair<int64_t, int32_t>;

  size_t levels = 0;
  std::vector<int64_t> height;               // per level: no group grows past it
  std::vector<int64_t> free;                 // per level: ranks in no group
  std::vector<std::vector<int32_t>> groups;  // per level: its groups, in creation order
  // [level * sizes + size index]: the heap, and its top's cost and rows (rows above the cap when
  // the heap is empty, so that nothing joins it).
  std::vector<std::vector<Entry>> heaps;
  std::vector<int64_t> top_cost, top_tokens;
  std::vector<Group> all;      // every level's groups
  std::vector<int32_t> next;   // per sequence: the next one of its group, -1 after the last
  std::vector<int32_t> items;  // scratch of Shorten
  std::vector<char> side;      // scratch of Shorten

  void Append(Group& g, int32_t i) {
    if (g.tail < 0) {
      g.head = i;
    } else {
      next[g.tail] = i;
    }
    next[i] = -1;
    g.tail = i;
    ++g.count;
  }

  // The levels as the plan needs them.
  std::vector<Level> Levels() const {
    std::vector<Level> out(levels);
    for (size_t l = 0; l < levels; ++l) {
      out[l].free = free[l];
      out[l].columns.reserve(groups[l].size());
      for (const int32_t id : groups[l]) {
        const Group& g = all[id];
        Column col{g.width, g.cost, g.tokens, {}};
        col.items.reserve(g.count);
        for (int32_t i = g.head; i >= 0; i = next[i]) col.items.push_back(i);
        out[l].columns.push_back(std::move(col));
      }
    }
    return out;
  }

  // The sum over levels of the costliest group's cost; nullopt on overflow.
  std::optional<int64_t> Cost() const {
    int64_t cost = 0;
    for (size_t l = 0; l < levels; ++l) {
      int64_t level = 0;
      for (const int32_t id : groups[l]) level = std::max(level, all[id].cost);
      const std::optional<int64_t> sum = CheckedAdd(cost, level);
      if (!sum) return std::nullopt;
      cost = *sum;
    }
    return cost;
  }
};

// The problem with every per-sequence fact the search needs.
class Packer {
 public:
  Packer(absl::Span<const int64_t> lengths, const DynamicCpOptions& options,
         std::vector<int64_t> sizes, std::vector<bool> splittable)
      : lengths_(lengths),
        o_(options),
        sizes_(std::move(sizes)),
        splittable_(std::move(splittable)),
        size_index_(options.ranks + 1, 0),
        by_length_(lengths.size()) {
    for (size_t j = 0; j < sizes_.size(); ++j) size_index_[sizes_[j]] = static_cast<int32_t>(j);
    std::iota(by_length_.begin(), by_length_.end(), 0);
    std::sort(by_length_.begin(), by_length_.end(), [&](int32_t a, int32_t b) {
      return lengths_[a] != lengths_[b] ? lengths_[a] > lengths_[b] : a < b;
    });
  }

  // Aligned length and one rank's cost of sequence i at size c; nullopt on overflow.
  std::optional<std::pair<int64_t, int64_t>> At(int32_t i, int64_t c) const {
    const std::optional<int64_t> aligned = CpAlignedLength(lengths_[i], c, o_.tensor_parallel);
    if (!aligned) return std::nullopt;
    const std::optional<int64_t> h = CpSequenceCost(o_.cost, *aligned, c);
    if (!h) return std::nullopt;
    return std::make_pair(*aligned, *h);
  }

  // Per-sequence facts at sizes `cp` (one per sequence, each fitting the cap): cost, rows a
  // rank, and the packing order (larger groups first, then costlier, then input order).
  struct Sized {
    std::vector<int64_t> cp, h, tok;
    std::vector<int32_t> order;
    std::vector<int32_t> used;  // per sequence: its size among the sizes in use (dense)
    size_t sizes_used = 0;      // the distinct sizes of `cp`: a level's heaps
  };
  absl::StatusOr<Sized> Prepare(std::vector<int64_t> cp) const {
    const int64_t n = static_cast<int64_t>(lengths_.size());
    Sized s;
    s.h.resize(n);
    s.tok.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      const auto at = At(i, cp[i]);
      if (!at) return Overflow();
      s.tok[i] = at->first / cp[i];
      s.h[i] = at->second;
    }
    // At a fixed size h does not decrease with the length (non-negative weights), so the
    // sequences by length descending, bucketed by size descending, are by cost descending;
    // each run of equal costs then goes back to input order.
    const size_t k = sizes_.size();
    std::vector<int64_t> start(k + 1, 0);
    for (int32_t i = 0; i < n; ++i) ++start[k - size_index_[cp[i]]];
    for (size_t b = 1; b <= k; ++b) start[b] += start[b - 1];
    s.order.resize(n);
    for (const int32_t i : by_length_) s.order[start[k - 1 - size_index_[cp[i]]]++] = i;
    for (int64_t a = 0; a < n;) {
      int64_t b = a + 1;
      while (b < n && cp[s.order[b]] == cp[s.order[a]] && s.h[s.order[b]] == s.h[s.order[a]]) ++b;
      if (b - a > 1) std::sort(s.order.begin() + a, s.order.begin() + b);
      a = b;
    }
    // The sizes in use, densely numbered: a level holds one heap per size in use, not per
    // allowed size (up to kMaxCpSizes of them).
    s.used.resize(n);
    int64_t last = 0;
    for (const int32_t i : s.order) {
      if (cp[i] != last) {
        last = cp[i];
        ++s.sizes_used;
      }
      s.used[i] = static_cast<int32_t>(s.sizes_used - 1);
    }
    s.cp = std::move(cp);
    return s;
  }

  // Packs `sized` into `p`, each level at least `target` high; false when more than `max_levels`
  // would be needed.
  absl::StatusOr<bool> Pack(const Sized& sized, int64_t target, size_t max_levels,
                            Packing& p) const {
    const std::vector<int64_t>& cp = sized.cp;
    const std::vector<int64_t>& h = sized.h;
    const std::vector<int64_t>& tok = sized.tok;
    const size_t k = sized.sizes_used;
    const int64_t alpha = o_.cost.micro_batch;
    const int64_t cap = o_.max_tokens_per_rank;
    p.levels = 0;
    p.all.clear();
    p.next.resize(lengths_.size());
    for (const int32_t i : sized.order) {
      const int64_t c = cp[i];
      const size_t s = static_cast<size_t>(sized.used[i]);
      const std::optional<int64_t> need = CheckedAdd(alpha, h[i]);
      if (!need) return Overflow();
      // The first level whose least-loaded group of this size takes it, or whose free ranks
      // take a new group (a group's cost never passes its level's height: no overflow below).
      size_t l = 0;
      bool join = false;
      for (; l < p.levels; ++l) {
        const size_t at = l * k + s;
        if (p.top_tokens[at] + tok[i] <= cap && h[i] <= p.height[l] - p.top_cost[at]) {
          join = true;
          break;
        }
        if (p.free[l] >= c && splittable_[p.free[l] - c] && *need <= p.height[l]) break;
      }
      if (l == p.levels) {
        if (p.levels == max_levels) return false;
        AddLevel(p, std::max(*need, target), k);
      }
      const size_t at = l * k + s;
      std::vector<Packing::Entry>& heap = p.heaps[at];
      if (join) {
        Packing::Group& g = p.all[heap.front().second];
        g.cost += h[i];
        g.tokens += tok[i];
        p.Append(g, i);
        heap.front().first = g.cost;
        SiftDown(heap);
      } else {
        p.free[l] -= c;
        const int32_t id = static_cast<int32_t>(p.all.size());
        p.all.push_back({c, *need, tok[i], -1, -1, 0});
        p.Append(p.all.back(), i);
        p.groups[l].push_back(id);
        heap.emplace_back(*need, id);
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
      p.top_cost[at] = heap.front().first;
      p.top_tokens[at] = p.all[heap.front().second].tokens;
    }
    for (size_t l = 0; l < p.levels; ++l) Shorten(p, l, h, tok);
    return true;
  }

 private:
  // Restores a min-heap whose top grew (entries are distinct: the top is the one least entry).
  static void SiftDown(std::vector<Packing::Entry>& heap) {
    const size_t n = heap.size();
    const Packing::Entry top = heap[0];
    size_t at = 0;
    for (size_t child = 1; child < n; child = 2 * at + 1) {
      if (child + 1 < n && heap[child + 1] < heap[child]) ++child;
      if (!(heap[child] < top)) break;
      heap[at] = heap[child];
      at = child;
    }
    heap[at] = top;
  }

  void AddLevel(Packing& p, int64_t height, size_t k) const {
    const size_t l = p.levels++;
    if (p.height.size() < p.levels) {
      p.height.resize(p.levels);
      p.free.resize(p.levels);
      p.groups.resize(p.levels);
    }
    if (p.heaps.size() < p.levels * k) {
      p.heaps.resize(p.levels * k);
      p.top_cost.resize(p.levels * k);
      p.top_tokens.resize(p.levels * k);
    }
    p.height[l] = height;
    p.free[l] = o_.ranks;
    p.groups[l].clear();
    for (size_t s = l * k; s < (l + 1) * k; ++s) {
      p.heaps[s].clear();
      p.top_cost[s] = 0;
      p.top_tokens[s] = o_.max_tokens_per_rank + 1;
    }
  }

  // Spends level l's free ranks on its costliest group while that lowers the level's cost.
  void Shorten(Packing& p, size_t l, const std::vector<int64_t>& h,
               const std::vector<int64_t>& tok) const {
    const int64_t alpha = o_.cost.micro_batch;
    std::vector<int32_t>& groups = p.groups[l];
    int64_t& free = p.free[l];
    // The groups by cost descending, then position ascending: (cost, -position); only the top
    // one changes, so the heap stays exact.
    std::priority_queue<std::pair<int64_t, int64_t>> by_cost;
    for (size_t j = 0; j < groups.size(); ++j) {
      by_cost.emplace(p.all[groups[j]].cost, -static_cast<int64_t>(j));
    }
    while (free > 0 && !by_cost.empty()) {
      const size_t j = static_cast<size_t>(-by_cost.top().second);
      by_cost.pop();
      const Packing::Group col = p.all[groups[j]];
      const int64_t before = col.cost;
      // Split: the group's sequences dealt to it and a new group of its size, LPT.
      int64_t split_a = alpha;
      int64_t split_b = alpha;
      bool split = false;
      if (col.count >= 2 && free >= col.width && splittable_[free - col.width]) {
        p.items.clear();
        for (int32_t i = col.head; i >= 0; i = p.next[i]) p.items.push_back(i);
        std::stable_sort(p.items.begin(), p.items.end(),
                         [&](int32_t x, int32_t y) { return h[x] > h[y]; });
        p.side.resize(p.items.size());
        for (size_t t = 0; t < p.items.size(); ++t) {
          p.side[t] = split_a <= split_b ? 0 : 1;
          (p.side[t] == 0 ? split_a : split_b) += h[p.items[t]];
        }
        split = std::max(split_a, split_b) < before;
      }
      // Widen: the same sequences on the smallest larger allowed size that lowers the cost.
      int64_t wide = 0;
      int64_t wide_cost = alpha;
      int64_t wide_tokens = 0;
      for (auto it = std::upper_bound(sizes_.begin(), sizes_.end(), col.width);
           it != sizes_.end() && *it - col.width <= free; ++it) {
        const int64_t c = *it;
        if (!splittable_[free - (c - col.width)]) continue;
        int64_t cost = alpha;
        int64_t tokens = 0;
        bool ok = true;
        for (int32_t i = col.head; i >= 0; i = p.next[i]) {
          const auto at = At(i, c);
          if (!at || at->first / c > o_.max_tokens_per_rank) {
            ok = false;
            break;
          }
          cost += at->second;
          tokens += at->first / c;
        }
        if (ok && cost < before) {
          wide = c;
          wide_cost = cost;
          wide_tokens = tokens;
          break;
        }
      }
      if (split && (wide == 0 || std::max(split_a, split_b) <= wide_cost)) {
        free -= col.width;
        const int32_t b = static_cast<int32_t>(p.all.size());
        p.all.push_back({col.width, alpha, 0, -1, -1, 0});
        Packing::Group& a = p.all[groups[j]];
        a = {col.width, alpha, 0, -1, -1, 0};
        for (size_t t = 0; t < p.items.size(); ++t) {
          Packing::Group& to = p.all[p.side[t] == 0 ? groups[j] : b];
          to.cost += h[p.items[t]];
          to.tokens += tok[p.items[t]];
          p.Append(to, p.items[t]);
        }
        groups.push_back(b);
        by_cost.emplace(p.all[groups[j]].cost, -static_cast<int64_t>(j));
        by_cost.emplace(p.all[b].cost, -static_cast<int64_t>(groups.size() - 1));
      } else if (wide > 0) {
        free -= wide - col.width;
        Packing::Group& g = p.all[groups[j]];
        g.width = wide;
        g.cost = wide_cost;
        g.tokens = wide_tokens;
        by_cost.emplace(g.cost, -static_cast<int64_t>(j));
      } else {
        break;
      }
    }
  }

  absl::Span<const int64_t> lengths_;
  const DynamicCpOptions& o_;
  std::vector<int64_t> sizes_;       // allowed sizes, ascending
  std::vector<bool> splittable_;     // [w]: w ranks split exactly into allowed sizes
  std::vector<int32_t> size_index_;  // [c]: the position of c in sizes_
  std::vector<int32_t> by_length_;   // the sequences by length descending, then input order
};

bool Allowed(CpSizeRule rule, int64_t c, int64_t ranks) {
  switch (rule) {
    case CpSizeRule::kPowersOfTwo:
      return (c & (c - 1)) == 0;
    case CpSizeRule::kDivisors:
      return ranks % c == 0;
    case CpSizeRule::kAny:
      return true;
  }
  return false;
}

absl::Status Validate(absl::Span<const int64_t> lengths, const DynamicCpOptions& o) {
  auto bad = [](absl::string_view field, int64_t v, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("dynamic_cp: ", field, " = ", v, ": ", why));
  };
  if (o.ranks < 1) return bad("ranks", o.ranks, "must be >= 1");
  if (o.ranks > (int64_t{1} << 20)) return bad("ranks", o.ranks, "must be <= 2^20");
  if (o.max_tokens_per_rank < 1) {
    return bad("max_tokens_per_rank", o.max_tokens_per_rank, "must be >= 1");
  }
  if (o.min_cp < 1) return bad("min_cp", o.min_cp, "must be >= 1");
  if (o.max_cp < 0) return bad("max_cp", o.max_cp, "must be >= 0 (0 = ranks)");
  const int64_t max_cp = o.max_cp == 0 ? o.ranks : o.max_cp;
  if (o.ranks % max_cp != 0) {
    return bad("max_cp", max_cp, absl::StrCat("must divide ranks = ", o.ranks));
  }
  if (o.max_tokens_per_rank >= (int64_t{1} << 31) / max_cp) {
    return bad("max_tokens_per_rank", o.max_tokens_per_rank,
               absl::StrCat("times max_cp = ", max_cp, " must stay below 2^31 (int32 offsets)"));
  }
  if (o.min_cp > max_cp) return bad("min_cp", o.min_cp, absl::StrCat("exceeds max_cp = ", max_cp));
  if (o.tensor_parallel < 1) return bad("tensor_parallel", o.tensor_parallel, "must be >= 1");
  if (o.tensor_parallel > (int64_t{1} << 20)) {
    return bad("tensor_parallel", o.tensor_parallel, "must be <= 2^20");
  }
  if (o.divisible_by < 1) return bad("divisible_by", o.divisible_by, "must be >= 1");
  if (o.max_groups < 1 || o.max_groups > kMaxCpGroups) {
    return bad("max_groups", o.max_groups, absl::StrCat("must be in [1, ", kMaxCpGroups, "]"));
  }
  // Every slot lists at least ranks / max_cp groups and a plan has a multiple of divisible_by
  // slots: refused before anything is allocated.
  if (o.divisible_by > o.max_groups / (o.ranks / max_cp)) {
    return bad("divisible_by", o.divisible_by,
               absl::StrCat("times world_size / max_cp = ", o.ranks, " / ", max_cp,
                            " (the fewest CP groups a slot lists) exceeds the plan's limit of ",
                            o.max_groups, " groups (raise max_cp or lower divisible_by)"));
  }
  if (o.divisible_by > kMaxCpRankSlots / o.ranks) {
    return bad("divisible_by", o.divisible_by,
               absl::StrCat("times world_size = ", o.ranks, " exceeds the plan's limit of 2^26 ",
                            "rank-slots (slots x world_size; lower divisible_by)"));
  }
  if (o.sizes == CpSizeRule::kAny && max_cp - o.min_cp >= kMaxCpSizes) {
    return bad("min_cp", o.min_cp,
               absl::StrCat("to max_cp = ", max_cp, " allows more than ", kMaxCpSizes,
                            " CP sizes under sizes = any (narrow the range)"));
  }
  if (o.cost.linear < 0) return bad("cost.linear", o.cost.linear, "must be >= 0");
  if (o.cost.quadratic < 0) return bad("cost.quadratic", o.cost.quadratic, "must be >= 0");
  if (o.cost.comm < 0) return bad("cost.comm", o.cost.comm, "must be >= 0");
  if (o.cost.micro_batch < 0) return bad("cost.micro_batch", o.cost.micro_batch, "must be >= 0");
  if (o.cost.node_ranks < 0) return bad("cost.node_ranks", o.cost.node_ranks, "must be >= 0");
  if (o.cost.comm_across_nodes < 0) {
    return bad("cost.comm_across_nodes", o.cost.comm_across_nodes, "must be >= 0");
  }
  if (lengths.size() > (size_t{1} << 26)) {
    return absl::InvalidArgumentError("dynamic_cp: more than 2^26 sequences");
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1 || lengths[i] >= (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat("dynamic_cp: sequence ", i, " has length ",
                                                     lengths[i], ": must be in [1, 2^31)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int64_t> CpAlignedLength(int64_t length, int64_t cp, int64_t tensor_parallel) {
  const std::optional<int64_t> m = CheckedMul(2 * cp, tensor_parallel);
  if (!m) return std::nullopt;
  return CheckedRoundUp(length, *m);
}

std::optional<int64_t> CpSequenceCost(const CpCostModel& cost, int64_t aligned, int64_t cp) {
  // aligned is a multiple of 2 * cp, so aligned / cp and aligned^2 / cp are exact.
  const int64_t per_rank = aligned / cp;
  const std::optional<int64_t> lin = CheckedMul(cost.linear, per_rank);
  const std::optional<int64_t> sq = CheckedMul(aligned, per_rank);
  if (!lin || !sq) return std::nullopt;
  const std::optional<int64_t> quad = CheckedMul(cost.quadratic, *sq);
  const int64_t weight =
      cost.node_ranks == 0 || cp <= cost.node_ranks ? cost.comm : cost.comm_across_nodes;
  const std::optional<int64_t> comm = CheckedMul(weight, per_rank * (cp - 1));
  if (!quad || !comm) return std::nullopt;
  const std::optional<int64_t> sum = CheckedAdd(*lin, *quad);
  if (!sum) return std::nullopt;
  return CheckedAdd(*sum, *comm);
}

absl::StatusOr<DynamicCpPlan> PlanDynamicCp(absl::Span<const int64_t> lengths,
                                            const DynamicCpOptions& options) {
  if (absl::Status s = Validate(lengths, options); !s.ok()) return s;
  const int64_t R = options.ranks;
  const int64_t max_cp = options.max_cp == 0 ? R : options.max_cp;
  std::vector<int64_t> sizes;
  for (int64_t c = options.min_cp; c <= max_cp; ++c) {
    if (Allowed(options.sizes, c, R)) sizes.push_back(c);
  }
  if (sizes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dynamic_cp: sizes = ", Name(options.sizes),
        " allows no CP size in [min_cp = ", options.min_cp, ", max_cp = ", max_cp, "]"));
  }
  // splittable[w]: some allowed c <= w leaves w - c splittable. Under "any" the sizes are the
  // range [min_cp, max_cp]: a window over a running count of the splittable widths, O(R); else
  // at most 240 sizes (the divisors of R <= 2^20), ascending.
  std::vector<bool> splittable(R + 1, false);
  splittable[0] = true;
  if (options.sizes == CpSizeRule::kAny) {
    std::vector<int64_t> below(R + 2, 0);  // [w]: splittable widths in [0, w)
    below[1] = 1;
    for (int64_t w = 1; w <= R; ++w) {
      const int64_t hi = w - sizes.front();  // w - c over c in [min_cp, max_cp]
      const int64_t lo = std::max<int64_t>(w - sizes.back(), 0);
      splittable[w] = hi >= lo && below[hi + 1] - below[lo] > 0;
      below[w + 1] = below[w] + (splittable[w] ? 1 : 0);
    }
  } else {
    for (int64_t w = 1; w <= R; ++w) {
      for (const int64_t c : sizes) {
        if (c > w) break;
        if (splittable[w - c]) {
          splittable[w] = true;
          break;
        }
      }
    }
  }
  if (!splittable[R]) {
    return absl::InvalidArgumentError(
        absl::StrCat("dynamic_cp: sizes = ", Name(options.sizes), " in [min_cp = ", options.min_cp,
                     ", max_cp = ", max_cp, "] cannot split ranks = ", R, " into CP groups"));
  }
  // A size is usable only when the other ranks of its slot split too.
  sizes.erase(
      std::remove_if(sizes.begin(), sizes.end(), [&](int64_t c) { return !splittable[R - c]; }),
      sizes.end());
  const Packer packer(lengths, options, sizes, splittable);
  const int64_t n = static_cast<int64_t>(lengths.size());

  // The smallest allowed size that fits each sequence, and the lower bound.
  std::vector<int64_t> smallest(n);
  int64_t area = 0;
  int64_t tallest = 0;
  for (int32_t i = 0; i < n; ++i) {
    smallest[i] = 0;
    int64_t best_area = -1;
    int64_t best_h = -1;
    for (const int64_t c : sizes) {
      const std::optional<int64_t> aligned =
          CpAlignedLength(lengths[i], c, options.tensor_parallel);
      if (!aligned || *aligned / c > options.max_tokens_per_rank) continue;
      if (smallest[i] == 0) smallest[i] = c;
      const std::optional<int64_t> h = CpSequenceCost(options.cost, *aligned, c);
      if (!h) return Overflow();
      const std::optional<int64_t> a = CheckedMul(*h, c);
      if (!a) return Overflow();
      if (best_area < 0 || *a < best_area) best_area = *a;
      if (best_h < 0 || *h < best_h) best_h = *h;
    }
    if (smallest[i] == 0) {
      const std::optional<int64_t> aligned =
          CpAlignedLength(lengths[i], sizes.back(), options.tensor_parallel);
      return absl::InvalidArgumentError(
          absl::StrCat("dynamic_cp: sequence ", i, " (length ", lengths[i], ") needs ",
                       aligned ? *aligned / sizes.back() : lengths[i],
                       " rows a rank at the largest allowed CP size ", sizes.back(),
                       ", above max_tokens_per_rank = ", options.max_tokens_per_rank));
    }
    const std::optional<int64_t> sum = CheckedAdd(area, best_area);
    if (!sum) return Overflow();
    area = *sum;
    tallest = std::max(tallest, best_h + options.cost.micro_batch);
  }

  // Floors: the smallest and the largest size (fixed CP), and the powers of two up to twice the
  // largest size a sequence needs (a higher floor only widens every group, which the free-rank
  // pass does where it pays).
  const int64_t needed = n > 0 ? *std::max_element(smallest.begin(), smallest.end()) : 1;
  std::vector<int64_t> floors;
  for (const int64_t c : sizes) {
    if (c == sizes.front() || c == sizes.back() || ((c & (c - 1)) == 0 && c <= 2 * needed)) {
      floors.push_back(c);
    }
  }
  std::optional<std::vector<Level>> best;
  int64_t best_cost = 0;
  Packing packing;
  std::vector<int64_t> cp(n);
  for (const int64_t floor : floors) {
    // A floor is an allowed size, and a size that fits leaves every larger one fitting (the rows
    // a rank do not grow with the size): the smallest allowed size >= floor that fits.
    for (int32_t i = 0; i < n; ++i) cp[i] = std::max(smallest[i], floor);
    absl::StatusOr<Packer::Sized> sized = packer.Prepare(cp);
    if (!sized.ok()) return sized.status();
    // Targets: the height that k slots of equal cost would have, k the fewest slots the cap
    // allows at these sizes (or one more), raised until k slots take every sequence.
    double floor_area = 0;
    double aligned_total = 0;
    for (int32_t i = 0; i < n; ++i) {
      floor_area += static_cast<double>(sized->h[i]) * static_cast<double>(cp[i]);
      aligned_total += static_cast<double>(sized->tok[i]) * static_cast<double>(cp[i]);
    }
    // No plan at these sizes beats the best so far: skip them.
    if (best && floor_area / static_cast<double>(R) >= static_cast<double>(best_cost)) continue;
    const double k_cap = std::max(
        1.0, std::ceil(aligned_total / (static_cast<double>(R) *
                                        static_cast<double>(options.max_tokens_per_rank))));
    // Packs at `target`; returns the slot count, or above `k` slots when more are needed and a
    // plan exists already.
    auto consider = [&](int64_t target, size_t k) -> absl::StatusOr<size_t> {
      absl::StatusOr<bool> packed =
          packer.Pack(*sized, target, best ? k : std::numeric_limits<size_t>::max(), packing);
      if (!packed.ok()) return packed.status();
      if (!*packed) return k + 1;
      const std::optional<int64_t> cost = packing.Cost();
      if (!cost) return Overflow();
      const size_t count = packing.levels;
      if (!best || *cost < best_cost || (*cost == best_cost && count < best->size())) {
        best = packing.Levels();
        best_cost = *cost;
      }
      return count;
    };
    // For k slots, the lowest height at which k slots take every sequence: k slots of equal
    // cost would be floor_area / (R k) high; search up to twice that.
    for (double k = k_cap; k < k_cap + 2; k += 1) {
      const double even = floor_area / (static_cast<double>(R) * k);
      if (!(even < 0x1p61)) break;
      int64_t lo = static_cast<int64_t>(even);
      int64_t hi = 2 * lo + 1;
      for (int step = 0; step < kSearchSteps && lo < hi; ++step) {
        const int64_t mid = lo + (hi - lo) / 2;
        absl::StatusOr<size_t> count = consider(mid, static_cast<size_t>(k));
        if (!count.ok()) return count.status();
        if (static_cast<double>(*count) <= k) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
    }
  }

  // The idle ranks of a slot in the largest sizes that split them: `emit(c)` per group, in that
  // order, until it returns false.
  auto split_idle = [&](int64_t f, auto&& emit) {
    while (f > 0) {
      auto c = std::upper_bound(sizes.begin(), sizes.end(), f);
      do {
        --c;
      } while (!splittable[f - *c]);
      if (!emit(*c)) return;
      f -= *c;
    }
  };
  // The plan's groups, counted before any is made: each packed slot's groups and idle ones, and
  // the trailing idle slots' (all alike). Refused above max_groups.
  const int64_t slots =
      CeilDiv(static_cast<int64_t>(best->size()), options.divisible_by) * options.divisible_by;
  int64_t groups = 0;
  auto count = [&](int64_t) { return ++groups <= options.max_groups; };
  for (const Level& level : *best) {
    groups += static_cast<int64_t>(level.columns.size());
    if (groups <= options.max_groups) split_idle(level.free, count);
  }
  if (groups <= options.max_groups && slots > static_cast<int64_t>(best->size())) {
    int64_t idle = 0;
    split_idle(R, [&](int64_t) { return ++idle <= options.max_groups; });
    const int64_t trailing = slots - static_cast<int64_t>(best->size());
    groups = idle > (options.max_groups - groups) / trailing ? options.max_groups + 1
                                                             : groups + idle * trailing;
  }
  if (slots > kMaxCpRankSlots / R) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dynamic_cp: the plan would span ", slots, " slots x world_size = ", R,
        " ranks, above the limit of 2^26 rank-slots (fewer or shorter sequences, a larger ",
        "max_tokens_per_rank, or a smaller world_size)"));
  }
  if (groups > options.max_groups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dynamic_cp: the plan would list more than max_groups = ", options.max_groups,
        " CP groups (", slots, " slots of world_size = ", R, " ranks in groups of min_cp = ",
        options.min_cp, " to max_cp = ", max_cp, ", divisible_by = ", options.divisible_by,
        "): raise min_cp or max_cp, or lower divisible_by or world_size"));
  }

  DynamicCpPlan plan;
  plan.step_cost = best_cost;
  plan.lower_bound = std::max(CeilDiv(area, R), n > 0 ? tallest : 0);
  plan.cp_of_sequence.assign(n, 0);
  plan.slot_of_sequence.assign(n, 0);
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> names;
  best->resize(std::max<int64_t>(slots, 0));
  plan.slots.reserve(best->size());
  for (Level& level : *best) {
    if (level.columns.empty()) level.free = R;
    // Groups by size descending, then the idle ranks in the largest sizes that split them.
    std::stable_sort(level.columns.begin(), level.columns.end(),
                     [](const Column& a, const Column& b) { return a.width > b.width; });
    split_idle(level.free, [&](int64_t c) {
      level.columns.push_back({c, 0, 0, {}});
      return true;
    });
    CpSlotPlan slot;
    int64_t first = 0;
    for (Column& col : level.columns) {
      CpGroupPlan g;
      g.first_rank = first;
      g.size = col.width;
      first += col.width;
      auto [it, inserted] =
          names.try_emplace(std::make_pair(g.first_rank, g.size), plan.group_names.size());
      if (inserted) plan.group_names.emplace_back(g.first_rank, g.size);
      g.name = it->second;
      std::sort(col.items.begin(), col.items.end());
      g.cu_seqlens.push_back(0);
      for (const int32_t i : col.items) {
        const auto at = packer.At(i, g.size);
        g.sequences.push_back(i);
        g.cu_seqlens.push_back(static_cast<int32_t>(g.cu_seqlens.back() + at->first));
        plan.cp_of_sequence[i] = g.size;
        plan.slot_of_sequence[i] = static_cast<int64_t>(plan.slots.size());
        plan.comm_tokens += at->first * (g.size - 1);
      }
      g.tokens_per_rank = g.cu_seqlens.back() / g.size;
      g.cost = col.items.empty() ? 0 : col.cost;
      slot.cost = std::max(slot.cost, g.cost);
      slot.groups.push_back(std::move(g));
    }
    plan.slots.push_back(std::move(slot));
  }
  return plan;
}

absl::StatusOr<std::vector<double>> DynamicCpLossWeights(absl::Span<const int64_t> loss_tokens,
                                                         const LossOptions& options,
                                                         int64_t ranks) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dynamic_cp: ranks = ", ranks, ": must be >= 1"));
  }
  if (options.mode == LossMode::kSumNorm &&
      !(std::isfinite(options.sum_norm_constant) && options.sum_norm_constant > 0)) {
    return absl::InvalidArgumentError("dynamic_cp: sum_norm_constant must be finite and > 0");
  }
  int64_t tokens = 0;
  int64_t with_loss = 0;
  for (size_t i = 0; i < loss_tokens.size(); ++i) {
    if (loss_tokens[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dynamic_cp: loss_tokens[", i, "] = ", loss_tokens[i], ": must be >= 0"));
    }
    tokens += loss_tokens[i];
    with_loss += loss_tokens[i] > 0 ? 1 : 0;
  }
  const double scale = options.dp_reduction == DpReduction::kMean ? static_cast<double>(ranks) : 1;
  std::vector<double> w(loss_tokens.size(), 0.0);
  for (size_t i = 0; i < loss_tokens.size(); ++i) {
    const double n_s = static_cast<double>(loss_tokens[i]);
    switch (options.mode) {
      case LossMode::kTokenMean:
        w[i] = tokens > 0 ? 1.0 / static_cast<double>(tokens) : 0.0;
        break;
      case LossMode::kSampleMean:
        w[i] = loss_tokens[i] > 0 ? 1.0 / (n_s * static_cast<double>(with_loss)) : 0.0;
        break;
      case LossMode::kSeqSum:
        w[i] = loss_tokens[i] > 0 ? 1.0 / static_cast<double>(with_loss) : 0.0;
        break;
      case LossMode::kSum:
        w[i] = 1.0;
        break;
      case LossMode::kSumNorm:
        w[i] = 1.0 / options.sum_norm_constant;
        break;
    }
    w[i] *= scale;
  }
  return w;
}

absl::StatusOr<int64_t> CpCommWeight(const ModelConfig& config, const ModelCost& cost,
                                     double flops_per_byte, int64_t bytes_per_element) {
  if (!(flops_per_byte >= 0) || !std::isfinite(flops_per_byte)) {
    return absl::InvalidArgumentError("dynamic_cp: flops_per_byte must be finite and >= 0");
  }
  if (bytes_per_element < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dynamic_cp: bytes_per_element = ", bytes_per_element, ": must be >= 1"));
  }
  const double kv_heads =
      static_cast<double>(config.num_kv_heads > 0 ? config.num_kv_heads : config.num_heads);
  const double head_dim = static_cast<double>(
      config.head_dim > 0 ? config.head_dim
                          : (config.num_heads > 0 ? config.hidden_size / config.num_heads : 0));
  // Keys and values, every layer, forward (all-gather) and backward (reduce-scatter).
  const double bytes = static_cast<double>(config.num_layers) * kv_heads * head_dim * 2.0 *
                       static_cast<double>(bytes_per_element) * 2.0;
  const double weight = std::ldexp(bytes * flops_per_byte, -cost.shift);
  if (!(weight < 0x1p62)) return Overflow();
  return static_cast<int64_t>(std::llround(weight));
}

absl::string_view Name(CpSizeRule v) {
  switch (v) {
    case CpSizeRule::kPowersOfTwo:
      return "powers_of_two";
    case CpSizeRule::kDivisors:
      return "divisors";
    case CpSizeRule::kAny:
      return "any";
  }
  return "?";
}

absl::StatusOr<CpSizeRule> ParseCpSizeRule(absl::string_view name) {
  for (const CpSizeRule v : {CpSizeRule::kPowersOfTwo, CpSizeRule::kDivisors, CpSizeRule::kAny}) {
    if (name == Name(v)) return v;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dynamic_cp: sizes = '", name, "': expected powers_of_two, divisors or any"));
}

}  // namespace packsched::planner
