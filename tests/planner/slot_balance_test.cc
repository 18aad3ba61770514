// Coordinator mode's sync objective: sync = micro_batch balances every slot over the
// ranks; both syncs keep k within the FFD bound and report their step. Expected values are
// recomputed here from the plans and the lengths alone (a first-fit-decreasing of our own, a
// brute-force optimum on tiny inputs).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "tests/planner/plan_checks.h"
#include "tests/testing/lengths.h"

namespace packsched::planner {
namespace {

using testing::CapMeasure;
using testing::CheckPlan;
using testing::CostOf;
using testing::RoundUp;

std::vector<int64_t> LongContext(int64_t n, int64_t cap, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> length(9.0, 1.2);
  std::vector<int64_t> out(n);
  for (int64_t& l : out) l = static_cast<int64_t>(std::clamp(length(rng), 64.0, double(cap)));
  return out;
}

// Our own first-fit decreasing over aligned lengths under the tokens cap (with align_total_to
// and the per-part sequence limit), counting bins.
int64_t FfdBins(const std::vector<int64_t>& lengths, const PlanOptions& o) {
  const int64_t cap = o.max_token_len / o.align_total_to * o.align_total_to;
  std::vector<int64_t> aligned;
  for (int64_t l : lengths) aligned.push_back(RoundUp(l, o.align_to));
  std::sort(aligned.rbegin(), aligned.rend());
  std::vector<int64_t> fill, count;
  for (int64_t a : aligned) {
    size_t b = 0;
    while (b < fill.size() && (fill[b] + a > cap || (o.max_seqs_per_micro_batch > 0 &&
                                                     count[b] >= o.max_seqs_per_micro_batch))) {
      ++b;
    }
    if (b == fill.size()) {
      fill.push_back(0);
      count.push_back(0);
    }
    fill[b] += a;
    ++count[b];
  }
  return static_cast<int64_t>(fill.size());
}

int64_t KBound(const std::vector<int64_t>& lengths, const PlanOptions& o, int64_t w) {
  const int64_t bins = FfdBins(lengths, o);
  return RoundUp(std::max({(bins + w - 1) / w, o.min_micro_batches, int64_t{1}}), o.divisible_by);
}

struct Steps {
  int64_t step_sync = 0;
  int64_t micro_batch_sync = 0;
};

// The step of a batch, from its parts' sequences' lengths.
Steps StepsOf(const std::vector<int64_t>& lengths, const PlanOptions& o, const BalancedBatch& b,
              int64_t alpha) {
  Steps s;
  std::vector<int64_t> slot_max(b.num_micro_batches, 0);
  for (const RankBatch& rank : b.ranks) {
    int64_t total = 0;
    for (size_t i = 0; i < rank.plan.parts.size(); ++i) {
      const MicroBatch& part = rank.plan.parts[i];
      int64_t cost = part.indices.empty() ? 0 : alpha;
      for (int64_t local : part.indices) cost += CostOf(lengths[rank.indices[local]], o);
      total += cost;
      slot_max[i] = std::max(slot_max[i], cost);
    }
    s.step_sync = std::max(s.step_sync, total);
  }
  for (int64_t c : slot_max) s.micro_batch_sync += c;
  return s;
}

// Every kept index on one rank, every rank k valid parts within the cap.
void ExpectValid(const std::vector<int64_t>& lengths, const PlanOptions& o,
                 const BalancedBatch& batch, int64_t w) {
  ASSERT_EQ(static_cast<int64_t>(batch.ranks.size()), w);
  std::vector<int> seen(lengths.size(), 0);
  for (const RankBatch& rank : batch.ranks) {
    std::vector<int64_t> local;
    int64_t cost = 0;
    for (int64_t index : rank.indices) {
      ++seen[index];
      local.push_back(lengths[index]);
      cost += CostOf(lengths[index], o);
    }
    EXPECT_TRUE(std::is_sorted(rank.indices.begin(), rank.indices.end()));
    EXPECT_EQ(rank.cost, cost);
    EXPECT_EQ(static_cast<int64_t>(rank.plan.parts.size()), batch.num_micro_batches);
    EXPECT_EQ(CheckPlan(local, o, rank.plan, o.overlong != OverlongPolicy::kIsolate), "");
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    const bool dropped =
        std::binary_search(batch.dropped.begin(), batch.dropped.end(), static_cast<int64_t>(i));
    EXPECT_EQ(seen[i], dropped ? 0 : 1) << "index " << i;
  }
  EXPECT_EQ(batch.num_micro_batches % o.divisible_by, 0);
  EXPECT_GE(batch.num_micro_batches, o.min_micro_batches);
}

struct Case {
  int64_t w;
  int64_t cap;
  PlanOptions o;
  std::vector<int64_t> lengths;
};

std::vector<Case> RandomCases() {
  std::vector<Case> cases;
  for (uint64_t seed = 0; seed < 24; ++seed) {
    Case c;
    c.w = std::vector<int64_t>{1, 2, 3, 8, 16}[seed % 5];
    c.cap = seed % 2 ? 16384 : 65536;
    c.o.max_token_len = c.cap;
    c.o.cost = seed % 3 ? CostModel::kAttention : CostModel::kTokens;
    if (seed % 4 == 1) c.o.divisible_by = 2;
    if (seed % 6 == 2) c.o.min_micro_batches = 3;
    if (seed % 5 == 3) c.o.align_to = 64;
    if (seed % 7 == 4) c.o.align_total_to = 128;
    if (seed % 8 == 5) c.o.max_seqs_per_micro_batch = 3;
    if (seed % 9 == 6) c.o.order = PartOrder::kIndex;
    if (seed % 9 == 7) c.o.order = PartOrder::kInterleave;
    const int64_t n = 20 + static_cast<int64_t>(seed) * 23;
    c.lengths =
        seed % 2 ? packsched::testing::RealisticRlLengths(n, seed) : LongContext(n, c.cap, seed);
    if (seed % 2) {
      for (int64_t& l : c.lengths) l = std::min(l, c.cap);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(SlotBalance, PropertiesUnderBothSyncs) {
  for (const Case& c : RandomCases()) {
    for (Sync sync : {Sync::kStep, Sync::kMicroBatch}) {
      const int64_t alpha = c.o.cost == CostModel::kTokens ? 512 : 2048 * 24576;
      const absl::StatusOr<BalancedBatch> b =
          BalanceBatch(c.lengths, c.w, c.o, {}, BalanceOptions{sync, alpha});
      ASSERT_TRUE(b.ok()) << b.status();
      SCOPED_TRACE(absl::StrCat("w=", c.w, " n=", c.lengths.size(), " sync=", Name(sync)));
      ExpectValid(c.lengths, c.o, *b, c.w);
      // Under step sync one step of divisible_by more may be taken (when it shortens the step).
      EXPECT_LE(b->num_micro_batches,
                KBound(c.lengths, c.o, c.w) + (sync == Sync::kStep ? c.o.divisible_by : 0));
      // The stats agree with a recomputation from the plans.
      const Steps s = StepsOf(c.lengths, c.o, *b, alpha);
      EXPECT_EQ(b->step.step_sync_cost, s.step_sync);
      EXPECT_EQ(b->step.micro_batch_sync_cost, s.micro_batch_sync);
      EXPECT_LE(b->step.lower_bound, std::min(s.step_sync, s.micro_batch_sync));
      const double actual = sync == Sync::kStep ? s.step_sync : s.micro_batch_sync;
      EXPECT_NEAR(b->step.efficiency * actual, b->step.ideal, 1e-6 * b->step.ideal);
      // Slots in the common order: by their costliest micro-batch, descending.
      if (sync == Sync::kMicroBatch && c.o.order == PartOrder::kCostDesc) {
        int64_t previous = INT64_MAX;
        for (int64_t i = 0; i < b->num_micro_batches; ++i) {
          int64_t slot = 0;
          for (const RankBatch& rank : b->ranks) slot = std::max(slot, rank.plan.parts[i].cost);
          EXPECT_LE(slot, previous) << "slot " << i;
          previous = slot;
        }
      }
      if (sync == Sync::kMicroBatch && c.o.order == PartOrder::kIndex) {
        // Slots by their smallest global index; empty slots last.
        int64_t previous = -1;
        for (int64_t i = 0; i < b->num_micro_batches; ++i) {
          int64_t first = INT64_MAX;
          for (const RankBatch& rank : b->ranks) {
            for (int64_t local : rank.plan.parts[i].indices) {
              first = std::min(first, rank.indices[local]);
            }
          }
          EXPECT_GE(first, previous) << "slot " << i;
          previous = first;
        }
      }
    }
  }
}

// A slot: every rank's micro-batch in it, as sorted global indices.
using Slot = std::vector<std::vector<int64_t>>;
std::vector<Slot> SlotsOf(const BalancedBatch& b) {
  std::vector<Slot> slots(b.num_micro_batches);
  for (int64_t i = 0; i < b.num_micro_batches; ++i) {
    for (const RankBatch& rank : b.ranks) {
      std::vector<int64_t> cell;
      for (int64_t local : rank.plan.parts[i].indices) cell.push_back(rank.indices[local]);
      std::sort(cell.begin(), cell.end());
      slots[i].push_back(cell);
    }
  }
  return slots;
}

// The order only permutes the slots, the same way on every rank: the same slots (each a column
// of W micro-batches) under every order.
TEST(SlotBalance, OrdersPermuteWholeSlots) {
  for (uint64_t seed = 0; seed < 6; ++seed) {
    PlanOptions o;
    o.max_token_len = 32768;
    o.cost = CostModel::kAttention;
    const std::vector<int64_t> lengths = LongContext(200, o.max_token_len, seed);
    std::vector<Slot> reference;
    for (PartOrder order : {PartOrder::kCostDesc, PartOrder::kIndex, PartOrder::kInterleave}) {
      o.order = order;
      const absl::StatusOr<BalancedBatch> b =
          BalanceBatch(lengths, 4, o, {}, BalanceOptions{Sync::kMicroBatch, 1000});
      ASSERT_TRUE(b.ok()) << b.status();
      std::vector<Slot> slots = SlotsOf(*b);
      std::sort(slots.begin(), slots.end());
      if (reference.empty()) reference = slots;
      EXPECT_EQ(slots, reference) << "seed " << seed << " order " << Name(order);
    }
  }
}

TEST(SlotBalance, StepSyncStaysWithinOneStepOfTheKBound) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    PlanOptions o;
    o.max_token_len = 131072;
    o.cost = CostModel::kAttention;
    const std::vector<int64_t> lengths = LongContext(256, o.max_token_len, seed);
    const absl::StatusOr<BalancedBatch> b = BalanceBatch(lengths, 8, o);
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectValid(lengths, o, *b, 8);
    EXPECT_LE(b->num_micro_batches, KBound(lengths, o, 8) + 1) << "seed " << seed;
  }
}

// Many short sequences and a few (5%) near the cap.
std::vector<int64_t> Bimodal(int64_t n, int64_t cap, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int64_t> shorter(64, 2048);
  std::vector<int64_t> out(n);
  for (int64_t& l : out) {
    l = unit(rng) < 0.05 ? static_cast<int64_t>((0.8 + 0.2 * unit(rng)) * double(cap))
                         : shorter(rng);
  }
  return out;
}

// Under sync = step no single sequence of the largest rank can move to a micro-batch of another
// rank that has room for it and shorten the step (the rank totals include alpha per non-empty
// micro-batch): the ranks are balanced as far as one move can tell.
TEST(SlotBalance, StepSyncNoMoveFromTheLargestRankHelps) {
  for (uint64_t seed = 0; seed < 12; ++seed) {
    PlanOptions o;
    o.max_token_len = 32768;
    o.cost = CostModel::kAttention;
    o.attention = AttentionCost{24576, 1};
    BalanceOptions balance;
    balance.sync = Sync::kStep;
    balance.micro_batch_cost = int64_t{2048} * 24576;
    const int64_t w = seed % 2 == 0 ? 8 : 32;
    const std::vector<int64_t> lengths = Bimodal(64 * w, o.max_token_len, seed);
    const absl::StatusOr<BalancedBatch> b = BalanceBatch(lengths, w, o, {}, balance);
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectValid(lengths, o, *b, w);
    std::vector<int64_t> totals;
    for (const RankBatch& rank : b->ranks) {
      int64_t total = 0;
      for (const MicroBatch& part : rank.plan.parts) {
        if (!part.indices.empty()) total += balance.micro_batch_cost;
        for (int64_t local : part.indices) total += CostOf(lengths[rank.indices[local]], o);
      }
      totals.push_back(total);
    }
    const int64_t top = std::max_element(totals.begin(), totals.end()) - totals.begin();
    EXPECT_EQ(totals[top], b->step.step_sync_cost);
    for (const MicroBatch& from : b->ranks[top].plan.parts) {
      for (int64_t local : from.indices) {
        const int64_t length = lengths[b->ranks[top].indices[local]];
        const int64_t c = CostOf(length, o);
        const int64_t left =
            totals[top] - c - (from.indices.size() == 1 ? balance.micro_batch_cost : 0);
        for (int64_t r = 0; r < w; ++r) {
          if (r == top) continue;
          for (const MicroBatch& to : b->ranks[r].plan.parts) {
            if (to.tokens + length > o.max_token_len) continue;
            const int64_t grown =
                totals[r] + c + (to.indices.empty() ? balance.micro_batch_cost : 0);
            EXPECT_GE(std::max(left, grown), totals[top])
                << "seed " << seed << ": length " << length << " from rank " << top << " to " << r;
          }
        }
      }
    }
  }
}

TEST(SlotBalance, GroupsStayOnOneRank) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    PlanOptions o;
    o.max_token_len = 32768;
    o.cost = CostModel::kAttention;
    const std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(256, seed);
    std::vector<int64_t> groups(lengths.size());
    for (size_t i = 0; i < groups.size(); ++i) groups[i] = static_cast<int64_t>(i / 8) * 7 + 3;
    const absl::StatusOr<BalancedBatch> b =
        BalanceBatch(lengths, 4, o, groups, BalanceOptions{Sync::kMicroBatch, 1 << 20});
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectValid(lengths, o, *b, 4);
    std::vector<int64_t> rank_of(lengths.size(), -1);
    for (size_t r = 0; r < b->ranks.size(); ++r) {
      for (int64_t index : b->ranks[r].indices) rank_of[index] = static_cast<int64_t>(r);
    }
    for (size_t i = 0; i < lengths.size(); ++i) {
      EXPECT_EQ(rank_of[i], rank_of[i / 8 * 8]) << "index " << i;
    }
    // Never worse than the step-sync plan's slots (its micro-batches by cost descending).
    const absl::StatusOr<BalancedBatch> step =
        BalanceBatch(lengths, 4, o, groups, BalanceOptions{Sync::kStep, 1 << 20});
    ASSERT_TRUE(step.ok());
    EXPECT_LE(b->step.micro_batch_sync_cost, step->step.micro_batch_sync_cost);
  }
}

TEST(SlotBalance, OverlongPolicies) {
  PlanOptions o;
  o.max_token_len = 4096;
  std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(60, 7);
  for (int64_t& l : lengths) l = std::min<int64_t>(l, 4096);
  lengths[3] = 9000;
  lengths[40] = 5000;
  o.overlong = OverlongPolicy::kIsolate;
  absl::StatusOr<BalancedBatch> b = BalanceBatch(lengths, 4, o, {}, {Sync::kMicroBatch, 0});
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectValid(lengths, o, *b, 4);
  int overlong = 0;
  for (const RankBatch& rank : b->ranks) {
    for (const MicroBatch& part : rank.plan.parts) {
      if (part.overlong) {
        ++overlong;
        EXPECT_EQ(part.indices.size(), 1u);
      } else {
        EXPECT_LE(CapMeasure(part, o), o.max_token_len);
      }
    }
  }
  EXPECT_EQ(overlong, 2);
  o.overlong = OverlongPolicy::kDrop;
  b = BalanceBatch(lengths, 4, o, {}, {Sync::kMicroBatch, 0});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dropped, (std::vector<int64_t>{3, 40}));
  ExpectValid(lengths, o, *b, 4);
  o.overlong = OverlongPolicy::kReject;
  EXPECT_FALSE(BalanceBatch(lengths, 4, o, {}, {Sync::kMicroBatch, 0}).ok());
}

TEST(SlotBalance, RejectsBadMicroBatchCost) {
  PlanOptions o;
  o.max_token_len = 100;
  EXPECT_FALSE(BalanceBatch({10, 20}, 2, o, {}, {Sync::kMicroBatch, -1}).ok());
  EXPECT_FALSE(BalanceBatch({10, 20}, 2, o, {}, {Sync::kMicroBatch, kMaxMicroBatchCost + 1}).ok());
  o.max_micro_batches = int64_t{1} << 40;
  EXPECT_FALSE(
      BalanceBatch({10, 20}, 1 << 20, o, {}, {Sync::kMicroBatch, kMaxMicroBatchCost}).ok());
}

// On long-context inputs the micro-batch sync is what it is for: a shorter slot-by-slot step
// than the step-sync plan's (its micro-batches ordered by cost, the best alignment of its slots).
TEST(SlotBalance, MicroBatchSyncShortensTheSlotStep) {
  int64_t better = 0;
  double sum_step = 0, sum_mb = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    PlanOptions o;
    o.max_token_len = 65536;
    o.cost = CostModel::kAttention;
    const std::vector<int64_t> lengths = LongContext(512, o.max_token_len, seed);
    const BalanceOptions step{Sync::kStep, 2048 * 24576};
    const BalanceOptions mb{Sync::kMicroBatch, 2048 * 24576};
    const absl::StatusOr<BalancedBatch> a = BalanceBatch(lengths, 32, o, {}, step);
    const absl::StatusOr<BalancedBatch> b = BalanceBatch(lengths, 32, o, {}, mb);
    ASSERT_TRUE(a.ok() && b.ok());
    better += b->step.micro_batch_sync_cost < a->step.micro_batch_sync_cost;
    sum_step += a->step.ideal / a->step.micro_batch_sync_cost;
    sum_mb += b->step.efficiency;
  }
  EXPECT_EQ(better, 6);
  EXPECT_GT(sum_mb, sum_step);
}

// Tiny inputs: every assignment of the sequences to the plan's W x k micro-batches within the
// cap, by exhaustive search. lower bound <= optimum <= the plan's step.
int64_t BruteForceSlotStep(const std::vector<int64_t>& lengths, const PlanOptions& o, int64_t w,
                           int64_t k, int64_t alpha) {
  const int64_t cells = w * k;
  std::vector<int64_t> fill(cells, 0), cost(cells, 0), count(cells, 0);
  int64_t best = INT64_MAX;
  std::function<void(size_t)> place = [&](size_t j) {
    if (j == lengths.size()) {
      int64_t step = 0;
      for (int64_t i = 0; i < k; ++i) {
        int64_t m = 0;
        for (int64_t r = 0; r < w; ++r) {
          const int64_t c = r * k + i;
          m = std::max(m, count[c] ? alpha + cost[c] : 0);
        }
        step += m;
      }
      best = std::min(best, step);
      return;
    }
    const int64_t a = RoundUp(lengths[j], o.align_to);
    for (int64_t c = 0; c < cells; ++c) {
      if (fill[c] + a > o.max_token_len) continue;
      fill[c] += a;
      cost[c] += CostOf(lengths[j], o);
      ++count[c];
      place(j + 1);
      fill[c] -= a;
      cost[c] -= CostOf(lengths[j], o);
      --count[c];
    }
  };
  place(0);
  return best;
}

TEST(SlotBalance, TinyInputsAgainstBruteForce) {
  std::mt19937_64 rng(20);
  for (int trial = 0; trial < 60; ++trial) {
    PlanOptions o;
    o.max_token_len = 100;
    o.cost = trial % 2 ? CostModel::kAttention : CostModel::kTokens;
    o.attention = AttentionCost{50, 1};
    const int64_t n = 2 + static_cast<int64_t>(rng() % 7);  // 2..8
    std::vector<int64_t> lengths(n);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 100);
    const int64_t alpha = trial % 3 == 0 ? 0 : 40;
    const absl::StatusOr<BalancedBatch> b =
        BalanceBatch(lengths, 2, o, {}, BalanceOptions{Sync::kMicroBatch, alpha});
    ASSERT_TRUE(b.ok()) << b.status();
    if (b->num_micro_batches > 3) continue;  // (2 k)^8 stays small
    const int64_t optimum = BruteForceSlotStep(lengths, o, 2, b->num_micro_batches, alpha);
    EXPECT_LE(b->step.lower_bound, optimum) << "trial " << trial;
    EXPECT_LE(optimum, b->step.micro_batch_sync_cost) << "trial " << trial;
  }
}

}  // namespace
}  // namespace packsched::planner
