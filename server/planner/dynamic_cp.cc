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
  int64_t height = 0;  // the first (costliest) group's cost: no later group grows past it
  int64_t free = 0;    // ranks in no group
  std::vector<Column> columns;
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
        size_index_(options.ranks + 1, 0) {
    for (size_t j = 0; j < sizes_.size(); ++j) size_index_[sizes_[j]] = static_cast<int32_t>(j);
  }

  // Aligned length and one rank's cost of sequence i at size c; nullopt on overflow.
  std::optional<std::pair<int64_t, int64_t>> At(int32_t i, int64_t c) const {
    const std::optional<int64_t> aligned = CpAlignedLength(lengths_[i], c, o_.tensor_parallel);
    if (!aligned) return std::nullopt;
    const std::optional<int64_t> h = CpSequenceCost(o_.cost, *aligned, c);
    if (!h) return std::nullopt;
    return std::make_pair(*aligned, *h);
  }

  bool Fits(int32_t i, int64_t c) const {
    const std::optional<int64_t> aligned = CpAlignedLength(lengths_[i], c, o_.tensor_parallel);
    return aligned && *aligned / c <= o_.max_tokens_per_rank;
  }

  // Per-sequence facts at sizes `cp` (one per sequence, each fitting the cap): cost, rows a
  // rank, and the packing order (larger groups first, then costlier).
  struct Sized {
    std::vector<int64_t> cp, h, tok;
    std::vector<int32_t> order;
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
    s.order.resize(n);
    std::iota(s.order.begin(), s.order.end(), 0);
    std::stable_sort(s.order.begin(), s.order.end(), [&](int32_t a, int32_t b) {
      return cp[a] != cp[b] ? cp[a] > cp[b] : s.h[a] > s.h[b];
    });
    s.cp = std::move(cp);
    return s;
  }

  // The levels for `sized`, each level at least `target` high; an empty result when more than
  // `max_levels` would be needed.
  absl::StatusOr<std::vector<Level>> Pack(const Sized& sized, int64_t target,
                                          size_t max_levels) const {
    const std::vector<int64_t>& cp = sized.cp;
    const std::vector<int64_t>& h = sized.h;
    const std::vector<int64_t>& tok = sized.tok;
    const std::vector<int32_t>& order = sized.order;
    std::vector<Level> levels;
    // Per level and size, the groups by cost ascending: (cost, column) min-heaps.
    using Heap = std::priority_queue<std::pair<int64_t, int32_t>,
                                     std::vector<std::pair<int64_t, int32_t>>, std::greater<>>;
    std::vector<std::vector<Heap>> heaps;  // [level][index of the size]
    const int64_t alpha = o_.cost.micro_batch;
    for (const int32_t i : order) {
      const int64_t c = cp[i];
      const std::optional<int64_t> need = CheckedAdd(alpha, h[i]);
      if (!need) return Overflow();
      bool placed = false;
      for (size_t l = 0; l < levels.size() && !placed; ++l) {
        Level& level = levels[l];
        Heap& heap = heaps[l][size_index_[c]];
        if (!heap.empty()) {
          const auto [cost, col] = heap.top();
          Column& column = level.columns[col];
          if (cost + h[i] <= level.height && column.tokens + tok[i] <= o_.max_tokens_per_rank) {
            heap.pop();
            column.cost += h[i];
            column.tokens += tok[i];
            column.items.push_back(i);
            heap.emplace(column.cost, col);
            placed = true;
            break;
          }
        }
        if (level.free >= c && splittable_[level.free - c] && *need <= level.height) {
          level.free -= c;
          level.columns.push_back({c, *need, tok[i], {i}});
          heaps[l][size_index_[c]].emplace(*need, static_cast<int32_t>(level.columns.size() - 1));
          placed = true;
        }
      }
      if (placed) continue;
      if (levels.size() == max_levels) return std::vector<Level>();
      Level level;
      level.height = std::max(*need, target);
      level.free = o_.ranks - c;
      level.columns.push_back({c, *need, tok[i], {i}});
      levels.push_back(std::move(level));
      heaps.emplace_back(sizes_.size());
      heaps.back()[size_index_[c]].emplace(*need, 0);
    }
    for (Level& level : levels) Shorten(level, h, tok);
    return levels;
  }

 private:
  // Spends the level's free ranks on its costliest group while that lowers the level's cost.
  void Shorten(Level& level, const std::vector<int64_t>& h, const std::vector<int64_t>& tok) const {
    const int64_t alpha = o_.cost.micro_batch;
    // The columns by cost descending, then index ascending: (cost, -index); only the top one
    // changes, so the heap stays exact.
    std::priority_queue<std::pair<int64_t, int64_t>> by_cost;
    for (size_t j = 0; j < level.columns.size(); ++j) {
      by_cost.emplace(level.columns[j].cost, -static_cast<int64_t>(j));
    }
    while (level.free > 0 && !by_cost.empty()) {
      const size_t j = static_cast<size_t>(-by_cost.top().second);
      by_cost.pop();
      const Column& col = level.columns[j];
      const int64_t before = col.cost;
      // Split: the group's sequences dealt to it and a new group of its size, LPT.
      std::optional<std::pair<Column, Column>> split;
      if (col.items.size() >= 2 && level.free >= col.width && splittable_[level.free - col.width]) {
        Column a{col.width, alpha, 0, {}};
        Column b{col.width, alpha, 0, {}};
        std::vector<int32_t> items = col.items;
        std::stable_sort(items.begin(), items.end(),
                         [&](int32_t x, int32_t y) { return h[x] > h[y]; });
        for (const int32_t i : items) {
          Column& to = (a.cost <= b.cost) ? a : b;
          to.cost += h[i];
          to.tokens += tok[i];
          to.items.push_back(i);
        }
        if (std::max(a.cost, b.cost) < before) split = std::make_pair(a, b);
      }
      // Widen: the same sequences on the smallest larger allowed size that lowers the cost.
      std::optional<Column> wide;
      for (const int64_t c : sizes_) {
        if (c <= col.width || c - col.width > level.free) continue;
        if (!splittable_[level.free - (c - col.width)]) continue;
        Column w{c, alpha, 0, col.items};
        bool ok = true;
        for (const int32_t i : col.items) {
          const auto at = At(i, c);
          if (!at || at->first / c > o_.max_tokens_per_rank) {
            ok = false;
            break;
          }
          w.cost += at->second;
          w.tokens += at->first / c;
        }
        if (ok && w.cost < before) {
          wide = std::move(w);
          break;
        }
      }
      if (split && (!wide || std::max(split->first.cost, split->second.cost) <= wide->cost)) {
        level.free -= col.width;
        level.columns[j] = std::move(split->first);
        level.columns.push_back(std::move(split->second));
        by_cost.emplace(level.columns[j].cost, -static_cast<int64_t>(j));
        by_cost.emplace(level.columns.back().cost, -static_cast<int64_t>(level.columns.size() - 1));
      } else if (wide) {
        level.free -= wide->width - col.width;
        level.columns[j] = std::move(*wide);
        by_cost.emplace(level.columns[j].cost, -static_cast<int64_t>(j));
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
};

int64_t LevelCost(const Level& level) {
  int64_t cost = 0;
  for (const Column& c : level.columns) cost = std::max(cost, c.cost);
  return cost;
}

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
  std::vector<bool> splittable(R + 1, false);
  splittable[0] = true;
  for (int64_t w = 1; w <= R; ++w) {
    for (const int64_t c : sizes) {
      if (c <= w && splittable[w - c]) {
        splittable[w] = true;
        break;
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
      if (!packer.Fits(i, c)) continue;
      if (smallest[i] == 0) smallest[i] = c;
      const auto at = packer.At(i, c);
      if (!at) return Overflow();
      const std::optional<int64_t> a = CheckedMul(at->second, c);
      if (!a) return Overflow();
      if (best_area < 0 || *a < best_area) best_area = *a;
      if (best_h < 0 || at->second < best_h) best_h = at->second;
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
  std::vector<int64_t> cp(n);
  for (const int64_t floor : floors) {
    for (int32_t i = 0; i < n; ++i) {
      cp[i] = smallest[i];
      if (cp[i] < floor) {
        for (const int64_t c : sizes) {
          if (c >= floor && packer.Fits(i, c)) {
            cp[i] = c;
            break;
          }
        }
      }
    }
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
      absl::StatusOr<std::vector<Level>> levels =
          packer.Pack(*sized, target, best ? k : std::numeric_limits<size_t>::max());
      if (!levels.ok()) return levels.status();
      if (levels->empty() && n > 0) return k + 1;
      int64_t cost = 0;
      for (const Level& level : *levels) {
        const std::optional<int64_t> sum = CheckedAdd(cost, LevelCost(level));
        if (!sum) return Overflow();
        cost = *sum;
      }
      const size_t count = levels->size();
      if (!best || cost < best_cost || (cost == best_cost && count < best->size())) {
        best = std::move(*levels);
        best_cost = cost;
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

  DynamicCpPlan plan;
  plan.step_cost = best_cost;
  plan.lower_bound = std::max(CeilDiv(area, R), n > 0 ? tallest : 0);
  plan.cp_of_sequence.assign(n, 0);
  plan.slot_of_sequence.assign(n, 0);
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> names;
  const int64_t slots =
      CeilDiv(static_cast<int64_t>(best->size()), options.divisible_by) * options.divisible_by;
  best->resize(std::max<int64_t>(slots, 0));
  for (Level& level : *best) {
    if (level.columns.empty()) level.free = R;
    // Groups by size descending, then the idle ranks in the largest sizes that split them.
    std::stable_sort(level.columns.begin(), level.columns.end(),
                     [](const Column& a, const Column& b) { return a.width > b.width; });
    for (int64_t f = level.free; f > 0;) {
      for (auto c = sizes.rbegin(); c != sizes.rend(); ++c) {
        if (*c <= f && splittable[f - *c]) {
          level.columns.push_back({*c, 0, 0, {}});
          f -= *c;
          break;
        }
      }
    }
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
