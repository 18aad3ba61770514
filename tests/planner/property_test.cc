// Randomised property tests: thousands of seeded inputs, every guarantee of planner.h checked
// from the outside (tests/planner/plan_checks.h recomputes everything from the lengths).

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "tests/planner/plan_checks.h"
#include "tests/testing/lengths.h"
#include "tests/testing/soak.h"

namespace packsched::planner {
namespace {

using testing::CheckPlan;
using testing::RoundUp;

struct Case {
  std::vector<int64_t> lengths;
  PlanOptions options;
};

// A random input and option set; about a third have sequences over the cap.
Case RandomCase(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  const int64_t n = pick(0, 300);
  switch (pick(0, 2)) {
    case 0:
      c.lengths = packsched::testing::UniformLengths(n, 1, pick(1, 4000), seed);
      break;
    case 1:
      c.lengths = packsched::testing::RealisticRlLengths(n, seed);
      break;
    default:  // heavy tail: mostly short, a few long
      for (int64_t i = 0; i < n; ++i)
        c.lengths.push_back(pick(0, 9) == 0 ? pick(2000, 20000) : pick(1, 300));
  }
  PlanOptions& o = c.options;
  const int64_t longest =
      c.lengths.empty() ? 1 : *std::max_element(c.lengths.begin(), c.lengths.end());
  o.align_to = std::vector<int64_t>{1, 1, 2, 8, 64}[pick(0, 4)];
  o.align_total_to = std::vector<int64_t>{1, 1, 4, 128}[pick(0, 3)];
  o.cap_mode = pick(0, 3) == 0 ? CapMode::kPadded : CapMode::kTokens;
  const int64_t fit = RoundUp(RoundUp(longest, o.align_to), o.align_total_to);
  o.max_token_len = pick(0, 2) == 0 ? pick(std::max<int64_t>(o.align_total_to, fit / 2), fit)
                                    : pick(fit, fit * 6);
  o.overlong = pick(0, 1) == 0 ? OverlongPolicy::kIsolate : OverlongPolicy::kDrop;
  o.max_seqs_per_micro_batch = pick(0, 2) == 0 ? pick(1, 12) : 0;
  o.min_micro_batches = pick(0, 3) == 0 ? pick(1, 40) : 1;
  o.divisible_by = pick(0, 3) == 0 ? pick(1, 6) : 1;
  o.algorithm = pick(0, 1) == 0 ? Algorithm::kKarmarkarKarp : Algorithm::kLpt;
  o.cost = pick(0, 2) == 0 ? CostModel::kAttention : CostModel::kTokens;
  o.attention = AttentionCost{pick(0, 5000), pick(1, 3)};
  o.order = static_cast<PartOrder>(pick(0, 2));
  return c;
}

// Seeds [first, end): 3,000 from 0 by default (tests/testing/soak.h moves and widens the range).
const uint64_t kFirst = packsched::testing::SoakSeed();
const uint64_t kEnd = kFirst + static_cast<uint64_t>(packsched::testing::SoakTrials(3000));

TEST(PlannerProperties, EveryPlanIsConsistentAndWithinTheCap) {
  for (uint64_t seed = kFirst; seed < kEnd; ++seed) {
    const Case c = RandomCase(seed);
    const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches(c.lengths, c.options);
    ASSERT_TRUE(plan.ok()) << "seed " << seed << ": " << plan.status();
    ASSERT_EQ(CheckPlan(c.lengths, c.options, *plan, /*cap_guaranteed=*/true), "")
        << "seed " << seed;
    EXPECT_EQ(plan->stats.over_cap_parts,
              std::count_if(plan->parts.begin(), plan->parts.end(),
                            [](const MicroBatch& p) { return p.overlong; }))
        << "seed " << seed;
  }
}

TEST(PlannerProperties, CountIsNeverBelowAnyBoundNorAboveBestFitDecreasing) {
  for (uint64_t seed = kFirst; seed < kEnd; ++seed) {
    const Case c = RandomCase(seed);
    const PlanOptions& o = c.options;
    const absl::StatusOr<Problem> problem = Problem::Create(c.lengths, o);
    ASSERT_TRUE(problem.ok()) << problem.status();
    const int64_t k = problem->local_k();
    // Lower bounds from the kept, non-overlong sequences plus one part per isolated sequence.
    const int64_t cap = o.cap_mode == CapMode::kTokens
                            ? o.max_token_len / o.align_total_to * o.align_total_to
                            : o.max_token_len;
    int64_t aligned = 0, fitting = 0, isolated = 0;
    for (int64_t length : c.lengths) {
      const int64_t a = RoundUp(length, o.align_to);
      if (a > cap) {
        isolated += o.overlong == OverlongPolicy::kIsolate;
        continue;
      }
      aligned += a;
      ++fitting;
    }
    EXPECT_GE(k, (aligned + cap - 1) / cap + isolated) << "seed " << seed;
    if (o.max_seqs_per_micro_batch > 0) {
      EXPECT_GE(k,
                (fitting + o.max_seqs_per_micro_batch - 1) / o.max_seqs_per_micro_batch + isolated);
    }
    EXPECT_GE(k, o.min_micro_batches);
    EXPECT_EQ(k % o.divisible_by, 0);
    EXPECT_GE(k, problem->lower_bound_k());
    // Never more than best-fit-decreasing needs (its bins, isolated parts included).
    PlanOptions packing = o;
    packing.algorithm = Algorithm::kBestFitDecreasing;
    const absl::StatusOr<MicroBatchPlan> bfd = PackDataset(c.lengths, packing);
    ASSERT_TRUE(bfd.ok()) << bfd.status();
    const int64_t bfd_k =
        std::max<int64_t>({static_cast<int64_t>(bfd->parts.size()), o.min_micro_batches, 1});
    EXPECT_LE(k, RoundUp(bfd_k, o.divisible_by)) << "seed " << seed;
  }
}

TEST(PlannerProperties, LargerAgreedCountStaysWithinCapAndIsNeverWorse) {
  for (uint64_t seed = kFirst; seed < kEnd; seed += 3) {
    const Case c = RandomCase(seed);
    const absl::StatusOr<Problem> problem = Problem::Create(c.lengths, c.options);
    ASSERT_TRUE(problem.ok()) << problem.status();
    const absl::StatusOr<MicroBatchPlan> at_local = problem->Partition(problem->local_k());
    ASSERT_TRUE(at_local.ok());
    for (int64_t extra : {1, 2, 7, 40}) {
      const int64_t k = problem->local_k() + extra * c.options.divisible_by;
      const absl::StatusOr<MicroBatchPlan> plan = problem->Partition(k);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(static_cast<int64_t>(plan->parts.size()), k);
      ASSERT_EQ(CheckPlan(c.lengths, c.options, *plan, true), "") << "seed " << seed;
      EXPECT_LE(plan->stats.max_part_cost, at_local->stats.max_part_cost) << "seed " << seed;
    }
  }
}

TEST(PlannerProperties, KarmarkarKarpIsNeverWorseThanLpt) {
  for (uint64_t seed = kFirst; seed < kEnd; ++seed) {
    Case c = RandomCase(seed);
    c.options.algorithm = Algorithm::kKarmarkarKarp;
    const absl::StatusOr<MicroBatchPlan> kk = PlanMicroBatches(c.lengths, c.options);
    c.options.algorithm = Algorithm::kLpt;
    const absl::StatusOr<MicroBatchPlan> lpt = PlanMicroBatches(c.lengths, c.options);
    ASSERT_TRUE(kk.ok() && lpt.ok());
    ASSERT_EQ(kk->parts.size(), lpt->parts.size()) << "seed " << seed;
    EXPECT_LE(kk->stats.max_part_cost, lpt->stats.max_part_cost) << "seed " << seed;
  }
}

TEST(PlannerProperties, SameInputSamePlan) {
  for (uint64_t seed = kFirst; seed < kEnd; seed += 7) {
    const Case c = RandomCase(seed);
    const absl::StatusOr<MicroBatchPlan> a = PlanMicroBatches(c.lengths, c.options);
    const absl::StatusOr<MicroBatchPlan> b = PlanMicroBatches(c.lengths, c.options);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->parts.size(), b->parts.size());
    for (size_t p = 0; p < a->parts.size(); ++p) {
      EXPECT_EQ(a->parts[p].indices, b->parts[p].indices) << "seed " << seed;
    }
    EXPECT_EQ(a->reorder, b->reorder);
  }
}

}  // namespace
}  // namespace packsched::planner
