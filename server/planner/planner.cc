#include "server/planner/planner.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/assemble.h"
#include "server/planner/bin_packing.h"
#include "server/planner/karmarkar_karp.h"
#include "server/planner/local_search.h"
#include "server/planner/lpt.h"
#include "server/planner/prepared.h"

namespace packsched::planner {
namespace internal {

// A partition kept beyond the PlanArena it was made in: part p is
// positions[begin[p], begin[p + 1]), in its order. Two allocations instead of one per part.
struct FlatParts {
  std::vector<int32_t> begin{0};
  std::vector<int32_t> positions;

  static FlatParts Of(const Parts& parts) {
    FlatParts flat;
    flat.begin.reserve(parts.size() + 1);
    for (const Part& part : parts) {
      flat.positions.insert(flat.positions.end(), part.begin(), part.end());
      flat.begin.push_back(static_cast<int32_t>(flat.positions.size()));
    }
    return flat;
  }
  // The same parts, in PlanMemory().
  Parts ToParts() const {
    Parts parts(begin.size() - 1, PlanMemory());
    for (size_t p = 0; p + 1 < begin.size(); ++p) {
      parts[p].assign(positions.begin() + begin[p], positions.begin() + begin[p + 1]);
    }
    return parts;
  }
};

struct Prepared {
  Validated v;
  std::vector<int64_t> costs;       // of v.items
  std::vector<int32_t> cost_order;  // v.items by cost descending (ties: position ascending)
  std::vector<int32_t> by_cost;     // v.items by (cost, position) ascending: LocalSearch's order
  int64_t total_cost = 0;           // of v.items
  int64_t max_cost = 0;             // of v.items (0 if none)
  int64_t lower_bound_k = 0;
  int64_t local_k = 0;
  // Best-fit decreasing's packing (repaired and narrowed to the bound), within the capacity:
  // the seed of the plan at local_k. Over v.items, with at most local_k - isolated parts.
  FlatParts witness;
};

namespace {

int64_t NumIsolated(const Validated& v) { return static_cast<int64_t>(v.isolated.size()); }

Parts WithEmptyParts(Parts parts, int64_t k) {
  parts.resize(k);
  return parts;
}

// `parts` brought within the capacity by moves, or nullopt if moves cannot do it.
std::optional<Parts> WithinCapacity(const Prepared& p, Parts parts) {
  LocalSearch search(p.v.items, p.v.capacity, std::move(parts), p.by_cost);
  if (!search.Repair()) return std::nullopt;
  return search.Take();
}

std::vector<int64_t> CountLimits(const Prepared& p, int64_t k) {
  return std::vector<int64_t>(
      k, p.v.capacity.max_seqs() > 0 ? p.v.capacity.max_seqs() : kMaxSequences);
}

// `parts` less its lightest part, whose items go to the parts with the fewest tokens and are
// then repaired into the capacity; nullopt if the repair fails.
std::optional<Parts> WithoutLightestPart(const Prepared& p, Parts parts) {
  std::vector<PartLoad> loads = LoadsOf(parts, p.v.items);
  auto fewest_tokens = [&] {
    return std::min_element(
               loads.begin(), loads.end(),
               [](const PartLoad& a, const PartLoad& b) { return a.aligned < b.aligned; }) -
           loads.begin();
  };
  const ptrdiff_t lightest = fewest_tokens();
  Part homeless = std::move(parts[lightest]);
  parts.erase(parts.begin() + lightest);
  loads.erase(loads.begin() + lightest);
  std::sort(homeless.begin(), homeless.end(),
            [&](int32_t a, int32_t b) { return p.v.items[a].aligned > p.v.items[b].aligned; });
  for (int32_t item : homeless) {
    const ptrdiff_t target = fewest_tokens();
    parts[target].push_back(item);
    loads[target].Add(p.v.items[item]);
  }
  return WithinCapacity(p, std::move(parts));
}

// The fewest item parts the planner finds, with a plan of that many parts within the
// capacity. Best-fit decreasing is the start: on realistic RL mixes it lands on the volume
// bound `lo` or within a fraction of a percent of it (sequences longer than half the cap need
// parts of their own, so `lo` is often out of reach). LPT at `lo`, repaired by moves and swaps,
// gets one try at the bound itself; then whole parts are dissolved into the others while the
// repair keeps succeeding.
std::pair<int64_t, Parts> FewestParts(const Prepared& p, int64_t lo) {
  // Under the tokens cost model a cost is the aligned length, so the cost order Create already
  // sorted is BFD's visiting order (both: descending, ties by position).
  Parts best = p.v.options.cost == CostModel::kTokens
                   ? BestFitDecreasing(p.v.items, p.v.capacity, p.cost_order)
                   : BestFitDecreasing(p.v.items, p.v.capacity);
  if (static_cast<int64_t>(best.size()) > lo) {
    if (std::optional<Parts> lpt =
            WithinCapacity(p, Lpt(p.costs, p.cost_order, CountLimits(p, lo)))) {
      return {lo, std::move(*lpt)};
    }
  }
  while (static_cast<int64_t>(best.size()) > lo) {
    std::optional<Parts> fewer = WithoutLightestPart(p, Parts(best, PlanMemory()));
    if (!fewer) break;
    best = std::move(*fewer);
  }
  const int64_t k = static_cast<int64_t>(best.size());
  return {k, std::move(best)};
}

// The best plan into k_items parts the configured algorithm finds, seeded with a plan known to
// be within the capacity (`make_seed()`, with at most k_items parts). Candidates: Karmarkar–Karp
// (kk only), LPT and the seed, each brought within the capacity and rebalanced; the smallest
// largest cost wins (ties: the earlier candidate). kk's candidates include lpt's, so kk is
// never worse than lpt.
//
// The seed (padded with empty parts) guarantees a candidate within the capacity whose largest
// cost is no higher than the seed's. When the seed is mostly empty parts (a fixed k far above
// the bound, e.g. --num_parts without a cap) and LPT already meets both guarantees, it is
// skipped: rebalancing it is one single-item move per sequence that rebuilds what LPT did.
// The test reads LPT's candidate alone, so kk and lpt make the same choice and kk's
// candidates still include all of lpt's.
//
// `seed_floor`: a lower bound on the seed's largest cost, or -1. When KK or LPT already ends
// at or below it, it is no worse than the seed could make it, so the seed is never made (it
// may be costly: above the bound it is the plan at the bound).
Parts BestPlan(const Prepared& p, int64_t k_items, const std::function<Parts()>& make_seed,
               int64_t seed_floor) {
  if (k_items == 0) return Parts(PlanMemory());
  // One part: every candidate is the same set of items, the seed (within the capacity).
  if (k_items == 1) return WithEmptyParts(make_seed(), 1);
  // No partition of the items into k_items parts has a largest cost below `floor`: the largest
  // item's cost, or the mean part cost rounded up (costs are additive and >= 0). Every candidate
  // is such a partition (repair and rebalance only move and swap items), so once one reaches
  // `floor` no later candidate can be strictly better, and ties go to the earlier: the rest are
  // skipped without changing the choice.
  const int64_t floor = std::max(p.max_cost, CeilDiv(p.total_cost, k_items));
  Parts best(PlanMemory());
  std::optional<int64_t> best_cost;
  auto consider = [&](Parts parts) -> std::optional<int64_t> {
    LocalSearch search(p.v.items, p.v.capacity, std::move(parts), p.by_cost);
    if (!search.Repair()) return std::nullopt;
    search.Rebalance(/*keep_counts=*/false);
    const int64_t cost = search.max_cost();
    if (!best_cost || cost < *best_cost) {  // ties: the earlier candidate
      best = search.Take();
      best_cost = cost;
    }
    return cost;
  };
  auto settled = [&] { return best_cost && *best_cost <= floor; };
  if (p.v.options.algorithm == Algorithm::kKarmarkarKarp) {
    consider(KarmarkarKarp(p.costs, p.cost_order, k_items));
  }
  if (settled()) return best;
  const std::optional<int64_t> lpt = consider(Lpt(p.costs, p.cost_order, CountLimits(p, k_items)));
  if (settled() || (best_cost && *best_cost <= seed_floor)) return best;
  Parts seed = make_seed();
  const bool mostly_empty = 2 * static_cast<int64_t>(seed.size()) < k_items;
  if (!mostly_empty || !lpt || *lpt > MaxCost(seed, p.v.items)) {
    consider(WithEmptyParts(std::move(seed), k_items));
  }
  return best;
}

// The plan into k_items parts. At the bound (local_k) the seed is the witness. Above it, the
// seed is the plan at the bound, so that a larger k is never balanced worse; it is made only
// when KK and LPT do not already end at or below that plan's floor (its largest item, or its
// mean part cost rounded up), which on trainers' mixes is most of the time: a rank whose k was
// raised by its peers plans once, not twice.
Parts PlanFor(const Prepared& p, int64_t k_items) {
  const int64_t at_bound = p.local_k - NumIsolated(p.v);
  auto witness = [&p] { return p.witness.ToParts(); };
  if (k_items == at_bound) return BestPlan(p, k_items, witness, /*seed_floor=*/-1);
  const int64_t bound_floor =
      at_bound > 0 ? std::max(p.max_cost, CeilDiv(p.total_cost, at_bound)) : -1;
  return BestPlan(
      p, k_items, [&] { return BestPlan(p, at_bound, witness, /*seed_floor=*/-1); }, bound_floor);
}

// equal_size: n / k sequences per part, cost balanced by LPT under exact counts and swaps.
Parts EqualSizePlan(const Prepared& p, int64_t k) {
  const int64_t n = static_cast<int64_t>(p.v.items.size());
  const std::vector<int64_t> limits(k, n / k);
  LocalSearch search(p.v.items, Capacity(), Lpt(p.costs, p.cost_order, limits), p.by_cost);
  search.Rebalance(/*keep_counts=*/true);
  return search.Take();
}

absl::Status CheckTotalFitsOffsets(const Validated& v) {
  int64_t aligned = 0;
  for (const Item& item : v.items) aligned += item.aligned;
  const std::optional<int64_t> total = CheckedRoundUp(aligned, v.options.align_total_to);
  if (!total || *total > kMaxLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "without a cap guarantee a micro-batch may hold the whole batch of ", aligned,
        " aligned tokens, over the int32 offset limit ", kMaxLength, "; set max_token_len"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace internal

using internal::Parts;
using internal::Prepared;

Problem::Problem(std::shared_ptr<const Prepared> prepared) : prepared_(std::move(prepared)) {}

absl::StatusOr<Problem> Problem::Create(absl::Span<const int64_t> lengths,
                                        const PlanOptions& options, bool cap_optional,
                                        absl::Span<const int64_t> costs) {
  // The witness outlives it: it is kept flat, on the heap (Prepared::witness).
  internal::PlanArena arena;
  auto p = std::make_shared<Prepared>();
  ASSIGN_OR_RETURN(p->v,
                   internal::Validate(lengths, options, !cap_optional, /*balancing=*/true, costs));
  const internal::Validated& v = p->v;
  if (!v.capacity.has_cap() || options.equal_size) {
    RETURN_IF_ERROR(internal::CheckTotalFitsOffsets(v));
  }
  const int64_t n_items = static_cast<int64_t>(v.items.size());
  p->costs.reserve(n_items);
  int64_t aligned_total = 0;
  for (const internal::Item& item : v.items) {
    p->costs.push_back(item.cost);
    aligned_total += item.aligned;
    p->total_cost += item.cost;  // Validate checked that the total fits int64
    p->max_cost = std::max(p->max_cost, item.cost);
  }
  p->cost_order = internal::OrderByCostDesc(p->costs);
  // cost_order reversed is cost ascending with ties by position descending: each run of equal
  // costs is reversed back.
  p->by_cost.assign(p->cost_order.rbegin(), p->cost_order.rend());
  for (size_t run = 0; run < p->by_cost.size();) {
    size_t end = run + 1;
    while (end < p->by_cost.size() && p->costs[p->by_cost[end]] == p->costs[p->by_cost[run]]) ++end;
    std::reverse(p->by_cost.begin() + run, p->by_cost.begin() + end);
    run = end;
  }

  int64_t lb_items = n_items > 0 ? 1 : 0;
  if (n_items > 0 && v.capacity.has_cap() && !options.equal_size) {
    lb_items = std::max(lb_items, CeilDiv(aligned_total, v.capacity.cap()));
  }
  if (n_items > 0 && v.capacity.max_seqs() > 0) {
    lb_items = std::max(lb_items, CeilDiv(n_items, v.capacity.max_seqs()));
  }
  const int64_t n_isolated = internal::NumIsolated(v);
  p->lower_bound_k = std::max<int64_t>({lb_items + n_isolated, options.min_micro_batches, 1});
  if (p->lower_bound_k > options.max_micro_batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch needs at least ", p->lower_bound_k,
                     " micro-batches, more than max_micro_batches = ", options.max_micro_batches));
  }

  int64_t k_items = lb_items;
  if (!options.equal_size && n_items > 0) {
    auto [fewest, witness] = internal::FewestParts(*p, lb_items);
    k_items = fewest;
    p->witness = internal::FlatParts::Of(witness);
  }
  const std::optional<int64_t> local_k =
      CheckedRoundUp(std::max<int64_t>({k_items + n_isolated, options.min_micro_batches, 1}),
                     options.divisible_by);
  if (!local_k || *local_k > options.max_micro_batches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the batch needs ", k_items + n_isolated, " micro-batches (rounded up to divisible_by = ",
        options.divisible_by, "), more than max_micro_batches = ", options.max_micro_batches));
  }
  p->local_k = *local_k;
  return Problem(std::move(p));
}

int64_t Problem::local_k() const { return prepared_->local_k; }
int64_t Problem::lower_bound_k() const { return prepared_->lower_bound_k; }
int64_t Problem::num_sequences() const { return prepared_->v.num_sequences; }
int64_t Problem::num_kept() const {
  return static_cast<int64_t>(prepared_->v.items.size() + prepared_->v.isolated.size());
}
int64_t Problem::total_tokens() const { return prepared_->v.total_tokens; }
const std::vector<int64_t>& Problem::dropped() const { return prepared_->v.dropped; }
const PlanOptions& Problem::options() const { return prepared_->v.options; }

absl::StatusOr<MicroBatchPlan> Problem::Partition(int64_t k) const {
  internal::PlanArena arena;  // every Parts here is gone before it (Assemble copies out)
  const Prepared& p = *prepared_;
  const PlanOptions& o = p.v.options;
  if (k < p.local_k || k > o.max_micro_batches) {
    return absl::InvalidArgumentError(absl::StrCat("k = ", k, ": must be in [local bound ",
                                                   p.local_k, ", max_micro_batches ",
                                                   o.max_micro_batches, "]"));
  }
  if (k % o.divisible_by != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("k = ", k, " is not a multiple of divisible_by = ", o.divisible_by));
  }
  const int64_t n_items = static_cast<int64_t>(p.v.items.size());
  if (o.equal_size) {
    if (n_items % k != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "equal_size: ", n_items, " sequences do not split into k = ", k, " equal parts"));
    }
    return internal::Assemble(p.v, internal::EqualSizePlan(p, k), p.lower_bound_k, p.local_k);
  }
  return internal::Assemble(p.v, internal::PlanFor(p, k - internal::NumIsolated(p.v)),
                            p.lower_bound_k, p.local_k);
}

absl::StatusOr<MicroBatchPlan> PlanMicroBatches(absl::Span<const int64_t> lengths,
                                                const PlanOptions& options) {
  if (options.equal_size) {
    return absl::InvalidArgumentError(
        "equal_size needs a fixed number of micro-batches (PartitionFixedK, --num_parts)");
  }
  ASSIGN_OR_RETURN(Problem problem, Problem::Create(lengths, options));
  return problem.Partition(problem.local_k());
}

absl::StatusOr<MicroBatchPlan> PartitionFixedK(absl::Span<const int64_t> lengths, int64_t k,
                                               const PlanOptions& options,
                                               absl::Span<const int64_t> costs) {
  ASSIGN_OR_RETURN(Problem problem,
                   Problem::Create(lengths, options, /*cap_optional=*/true, costs));
  if (k < 1 || k < problem.local_k()) {
    return absl::InvalidArgumentError(
        absl::StrCat("k = ", k, " is below ", problem.local_k(),
                     ", the fewest micro-batches that meet the cap and the other constraints"));
  }
  return problem.Partition(k);
}

absl::StatusOr<MicroBatchPlan> PackDataset(absl::Span<const int64_t> lengths,
                                           const PlanOptions& options,
                                           absl::Span<const int64_t> costs) {
  internal::PlanArena arena;
  ASSIGN_OR_RETURN(
      internal::Validated v,
      internal::Validate(lengths, options, /*cap_required=*/true, /*balancing=*/false, costs));
  Parts parts(internal::PlanMemory());
  switch (options.algorithm) {
    case Algorithm::kFirstFitDecreasing:
      parts = internal::FirstFitDecreasing(v.items, v.capacity);
      break;
    case Algorithm::kBestFitDecreasing:
      parts = internal::BestFitDecreasing(v.items, v.capacity);
      break;
    default:
      parts = internal::Sequential(v.items, v.capacity);
      break;
  }
  int64_t aligned_total = 0;
  for (const internal::Item& item : v.items) aligned_total += item.aligned;
  const int64_t bins = static_cast<int64_t>(parts.size() + v.isolated.size());
  const int64_t lower =
      std::max<int64_t>(1, (v.items.empty() ? 0 : CeilDiv(aligned_total, v.capacity.cap())) +
                               static_cast<int64_t>(v.isolated.size()));
  return internal::Assemble(v, parts, lower, bins);
}

}  // namespace packsched::planner
