// Dynamic context parallelism (server/planner/dynamic_cp.h): every plan keeps the cap on every
// rank, runs every sequence exactly once, splits every slot's ranks into allowed groups, and
// costs what it says; bad input is InvalidArgument naming the sequence or option.

#include "server/planner/dynamic_cp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packsched::planner {
namespace {

using ::testing::HasSubstr;

bool SizeAllowed(const DynamicCpOptions& o, int64_t c) {
  const int64_t max_cp = o.max_cp == 0 ? o.ranks : o.max_cp;
  if (c < o.min_cp || c > max_cp) return false;
  switch (o.sizes) {
    case CpSizeRule::kPowersOfTwo:
      return (c & (c - 1)) == 0;
    case CpSizeRule::kDivisors:
      return o.ranks % c == 0;
    case CpSizeRule::kAny:
      return true;
  }
  return false;
}

// Checks the plan against its contract, recomputing every figure from the groups; returns the
// step cost recomputed.
int64_t CheckPlan(const std::vector<int64_t>& lengths, const DynamicCpOptions& o,
                  const DynamicCpPlan& plan) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  std::vector<int> seen(n, 0);
  int64_t step = 0;
  int64_t comm = 0;
  std::map<std::pair<int64_t, int64_t>, int64_t> names;
  EXPECT_EQ(plan.slots.size() % o.divisible_by, 0u);
  for (size_t s = 0; s < plan.slots.size(); ++s) {
    const CpSlotPlan& slot = plan.slots[s];
    int64_t next_rank = 0;
    int64_t slot_cost = 0;
    for (const CpGroupPlan& g : slot.groups) {
      EXPECT_EQ(g.first_rank, next_rank) << "slot " << s;
      EXPECT_TRUE(SizeAllowed(o, g.size)) << "size " << g.size;
      next_rank += g.size;
      const auto key = std::make_pair(g.first_rank, g.size);
      auto [it, inserted] = names.emplace(key, g.name);
      EXPECT_EQ(it->second, g.name);
      EXPECT_EQ(plan.group_names.at(g.name), key);
      EXPECT_EQ(g.cu_seqlens.size(), g.sequences.size() + 1);
      int64_t cost = g.sequences.empty() ? 0 : o.cost.micro_batch;
      for (size_t b = 0; b < g.sequences.size(); ++b) {
        const int64_t i = g.sequences[b];
        EXPECT_TRUE(i >= 0 && i < n);
        ++seen[i];
        const int64_t len = g.cu_seqlens[b + 1] - g.cu_seqlens[b];
        EXPECT_GE(len, lengths[i]);
        EXPECT_LT(len, lengths[i] + 2 * g.size * o.tensor_parallel);
        EXPECT_EQ(len % (2 * g.size * o.tensor_parallel), 0);
        EXPECT_EQ(plan.cp_of_sequence[i], g.size);
        EXPECT_EQ(plan.slot_of_sequence[i], static_cast<int64_t>(s));
        // h(L, c) by its definition.
        const int64_t comm_weight = o.cost.node_ranks == 0 || g.size <= o.cost.node_ranks
                                        ? o.cost.comm
                                        : o.cost.comm_across_nodes;
        cost += (o.cost.linear * len + o.cost.quadratic * len * len) / g.size +
                comm_weight * len * (g.size - 1) / g.size;
        comm += len * (g.size - 1);
      }
      EXPECT_EQ(g.cu_seqlens.back() % g.size, 0);
      EXPECT_EQ(g.tokens_per_rank, g.cu_seqlens.back() / g.size);
      EXPECT_LE(g.tokens_per_rank, o.max_tokens_per_rank) << "a rank over the cap";
      EXPECT_EQ(g.cost, cost);
      slot_cost = std::max(slot_cost, cost);
    }
    EXPECT_EQ(next_rank, o.ranks) << "slot " << s << " does not cover the ranks";
    EXPECT_EQ(slot.cost, slot_cost);
    step += slot_cost;
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "sequence " << i;
  EXPECT_EQ(plan.step_cost, step);
  EXPECT_EQ(plan.comm_tokens, comm);
  EXPECT_LE(plan.lower_bound, plan.step_cost);
  return step;
}

DynamicCpOptions Llamaish(int64_t ranks, int64_t cap) {
  DynamicCpOptions o;
  o.ranks = ranks;
  o.max_tokens_per_rank = cap;
  o.cost = {.linear = 4096, .quadratic = 1, .comm = 512, .micro_batch = int64_t{4096} * 256};
  return o;
}

TEST(DynamicCpTest, LongSequencesGetTheGroupsTheyNeedAndShortOnesRunAlone) {
  const std::vector<int64_t> lengths = {30000, 1000, 900, 7000, 800, 1200, 700, 600};
  const DynamicCpOptions o = Llamaish(8, 4096);
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp(lengths, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(lengths, o, *plan);
  EXPECT_GE(plan->cp_of_sequence[0], 8);  // 30,000 tokens need 8 ranks of 4,096
  EXPECT_GE(plan->cp_of_sequence[3], 2);
  // When communication costs more than the compute a wider group saves, short ones stay alone.
  DynamicCpOptions costly = o;
  costly.cost.comm = 1 << 20;
  plan = PlanDynamicCp(lengths, costly);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(lengths, costly, *plan);
  for (int i : {1, 2, 4, 5, 6, 7}) EXPECT_EQ(plan->cp_of_sequence[i], 1) << "sequence " << i;
}

TEST(DynamicCpTest, NeverSlowerThanFixedCpAtCpMaxAndMovesLessData) {
  std::mt19937_64 rng(11);
  int faster = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t ranks = int64_t{8} << (trial % 3);
    std::vector<int64_t> lengths;
    for (int i = 0; i < 64; ++i) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      lengths.push_back(1024 + static_cast<int64_t>(std::pow(u, 6) * 120000));
    }
    DynamicCpOptions o = Llamaish(ranks, 16384);
    o.cost.comm = 4096;  // keys and values over a slow link: CP costs as much as the MLPs
    o.max_cp = 8;
    absl::StatusOr<DynamicCpPlan> dynamic = PlanDynamicCp(lengths, o);
    ASSERT_TRUE(dynamic.ok()) << dynamic.status();
    DynamicCpOptions fixed = o;
    fixed.min_cp = 8;
    absl::StatusOr<DynamicCpPlan> fixed_plan = PlanDynamicCp(lengths, fixed);
    ASSERT_TRUE(fixed_plan.ok()) << fixed_plan.status();
    const int64_t d = CheckPlan(lengths, o, *dynamic);
    const int64_t f = CheckPlan(lengths, fixed, *fixed_plan);
    EXPECT_LE(d, f) << "trial " << trial;
    if (d < f) {
      ++faster;
      EXPECT_LT(dynamic->comm_tokens, fixed_plan->comm_tokens) << "trial " << trial;
    }
    for (int64_t c : fixed_plan->cp_of_sequence) EXPECT_EQ(c, 8);
  }
  // Where a few sequences need cp_max and fill whole slots, fixed CP is as good as any plan.
  EXPECT_GE(faster, 10);
}

TEST(DynamicCpTest, AnySizeAndDivisorsUseNonPowersOfTwo) {
  // 12 ranks, sizes dividing 12: a sequence needing 3 ranks of 1,000 gets 3, not 4.
  const std::vector<int64_t> lengths = {2900, 2900, 2900, 2900};
  DynamicCpOptions o = Llamaish(12, 1000);
  o.sizes = CpSizeRule::kDivisors;
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp(lengths, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(lengths, o, *plan);
  EXPECT_EQ(plan->slots.size(), 1u);
  for (int64_t c : plan->cp_of_sequence) EXPECT_EQ(c, 3);
  o.sizes = CpSizeRule::kAny;
  o.ranks = 7;
  o.max_cp = 7;
  plan = PlanDynamicCp({2900, 2900, 900}, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan({2900, 2900, 900}, o, *plan);
}

TEST(DynamicCpTest, SlotCountFollowsDivisibleByAndGroupsAreNamedOnce) {
  const std::vector<int64_t> lengths = {9000, 9000, 9000, 500, 500, 500, 500};
  DynamicCpOptions o = Llamaish(4, 4096);
  o.divisible_by = 4;
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp(lengths, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(lengths, o, *plan);
  EXPECT_EQ(plan->slots.size() % 4, 0u);
  EXPECT_LE(plan->group_names.size(), 4u + 2u + 1u);  // at most the buddy groups of 4 ranks
}

TEST(DynamicCpTest, TensorParallelAlignsToTwoCpTp) {
  const std::vector<int64_t> lengths = {5001, 17, 333};
  DynamicCpOptions o = Llamaish(4, 2048);
  o.tensor_parallel = 2;
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp(lengths, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(lengths, o, *plan);
}

TEST(DynamicCpTest, BadInputNamesTheSequenceOrOption) {
  DynamicCpOptions o = Llamaish(8, 1000);
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp({100, 200, 9000}, o);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("sequence 2 (length 9000)"));
  plan = PlanDynamicCp({100, 0}, o);
  EXPECT_THAT(plan.status().message(), HasSubstr("sequence 1 has length 0"));

  DynamicCpOptions bad = o;
  bad.max_cp = 3;
  EXPECT_THAT(PlanDynamicCp({1}, bad).status().message(), HasSubstr("max_cp = 3: must divide"));
  bad = o;
  bad.ranks = 6;
  bad.min_cp = 4;
  EXPECT_THAT(PlanDynamicCp({1}, bad).status().message(), HasSubstr("cannot split ranks = 6"));
  bad = o;
  bad.min_cp = 3;
  bad.max_cp = 4;
  bad.ranks = 12;
  bad.sizes = CpSizeRule::kPowersOfTwo;
  EXPECT_TRUE(PlanDynamicCp({1}, bad).ok());  // 4 + 4 + 4
  bad.max_cp = 3;
  EXPECT_THAT(PlanDynamicCp({1}, bad).status().message(), HasSubstr("allows no CP size"));
  bad = o;
  bad.max_tokens_per_rank = 0;
  EXPECT_THAT(PlanDynamicCp({1}, bad).status().message(), HasSubstr("max_tokens_per_rank = 0"));
  bad = o;
  bad.divisible_by = 0;
  EXPECT_THAT(PlanDynamicCp({1}, bad).status().message(), HasSubstr("divisible_by = 0"));
  bad = o;
  bad.cost.comm = -1;
  EXPECT_THAT(PlanDynamicCp({1}, bad).status().message(), HasSubstr("cost.comm = -1"));
  bad = o;
  bad.cost.quadratic = int64_t{1} << 40;
  bad.max_tokens_per_rank = int64_t{1} << 27;
  EXPECT_THAT(PlanDynamicCp({int64_t{1} << 30}, bad).status().message(), HasSubstr("overflow"));
}

TEST(DynamicCpTest, EmptyStepIsOneDivisibleSetOfIdleSlots) {
  DynamicCpOptions o = Llamaish(4, 100);
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp({}, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->slots.empty());
  EXPECT_EQ(plan->step_cost, 0);
}

TEST(DynamicCpTest, RandomInputsGiveValidPlansOrAJustifiedError) {
  std::mt19937_64 rng(2026);
  int ok = 0;
  for (int trial = 0; trial < 400; ++trial) {
    DynamicCpOptions o;
    o.ranks = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    std::vector<int64_t> divisors;
    for (int64_t c = 1; c <= o.ranks; ++c) {
      if (o.ranks % c == 0) divisors.push_back(c);
    }
    o.max_cp = divisors[std::uniform_int_distribution<size_t>(0, divisors.size() - 1)(rng)];
    o.min_cp = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    o.sizes = static_cast<CpSizeRule>(std::uniform_int_distribution<int>(0, 2)(rng));
    o.tensor_parallel = std::uniform_int_distribution<int64_t>(1, 2)(rng);
    o.divisible_by = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    o.max_tokens_per_rank = std::uniform_int_distribution<int64_t>(8, 3000)(rng);
    o.cost = {.linear = std::uniform_int_distribution<int64_t>(0, 100)(rng),
              .quadratic = std::uniform_int_distribution<int64_t>(0, 3)(rng),
              .comm = std::uniform_int_distribution<int64_t>(0, 200)(rng),
              .micro_batch = std::uniform_int_distribution<int64_t>(0, 10000)(rng),
              .node_ranks = std::uniform_int_distribution<int64_t>(0, 8)(rng),
              .comm_across_nodes = std::uniform_int_distribution<int64_t>(0, 2000)(rng)};
    std::vector<int64_t> lengths(std::uniform_int_distribution<int>(0, 60)(rng));
    for (int64_t& l : lengths) l = std::uniform_int_distribution<int64_t>(1, 4000)(rng);
    absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp(lengths, o);
    if (plan.ok()) {
      CheckPlan(lengths, o, *plan);
      ++ok;
      continue;
    }
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    // Justified: min_cp above max_cp, no split of the ranks, or a sequence that fits no
    // allowed size.
    bool fits_all = true;
    for (int64_t l : lengths) {
      bool fits = false;
      for (int64_t c = 1; c <= o.ranks; ++c) {
        const int64_t m = 2 * c * o.tensor_parallel;
        fits = fits || (SizeAllowed(o, c) && (l + m - 1) / m * m / c <= o.max_tokens_per_rank);
      }
      fits_all = fits_all && fits;
    }
    const std::string message(plan.status().message());
    EXPECT_TRUE(!fits_all || message.find("cannot split") != std::string::npos ||
                message.find("allows no CP size") != std::string::npos ||
                message.find("exceeds max_cp") != std::string::npos)
        << message;
  }
  EXPECT_GT(ok, 100);
}

TEST(DynamicCpTest, TinyRequestsForHugePlansAreRefusedNamingTheOptions) {
  // One sequence over 2^20 ranks in groups of one, 1000 slots: 10^9 groups.
  DynamicCpOptions o = Llamaish(int64_t{1} << 20, 1000);
  o.max_cp = 1;
  o.divisible_by = 1000;
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp({100}, o);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("divisible_by = 1000"));
  EXPECT_THAT(plan.status().message(), HasSubstr("world_size / max_cp = 1048576 / 1"));
  // The options alone are refused (as a sidecar's and the CLI's validation ask them).
  EXPECT_EQ(PlanDynamicCp({}, o).status(), plan.status());
  // Few groups but 2^20 ranks in each of 2^7 slots: too many rank-slots.
  o.max_cp = 0;
  o.divisible_by = 128;
  EXPECT_THAT(PlanDynamicCp({100}, o).status().message(), HasSubstr("2^26 rank-slots"));
  // Every size in [1, 2^20].
  o.divisible_by = 1;
  o.sizes = CpSizeRule::kAny;
  EXPECT_THAT(PlanDynamicCp({100}, o).status().message(),
              HasSubstr("min_cp = 1: to max_cp = 1048576 allows more than 4096 CP sizes"));
  o.max_groups = kMaxCpGroups + 1;
  EXPECT_THAT(PlanDynamicCp({100}, o).status().message(), HasSubstr("max_groups = "));
  // A plan whose packed slots list more groups than allowed: refused after packing.
  DynamicCpOptions few = Llamaish(8, 1000);
  few.max_groups = 8;
  const std::vector<int64_t> many(40, 900);
  plan = PlanDynamicCp(many, few);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("more than max_groups = 8 CP groups"));
  few.max_groups = kMaxCpGroups;
  plan = PlanDynamicCp(many, few);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t groups = 0;
  for (const CpSlotPlan& slot : plan->slots) groups += static_cast<int64_t>(slot.groups.size());
  EXPECT_GT(groups, 8);
}

// Adversarial options for small steps: up to 2^20 ranks, divisible_by up to the most the
// rank-slot limit allows and past it, any size rule. Each plan lists at most max_groups groups
// and 2^26 rank-slots, or the error names what refuses it.
TEST(DynamicCpTest, AdversarialOptionsGiveBoundedPlansOrANamedError) {
  std::mt19937_64 rng(7);
  int ok = 0;
  int refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    DynamicCpOptions o;
    const int log_r = std::uniform_int_distribution<int>(0, 20)(rng);
    o.ranks = std::uniform_int_distribution<int>(0, 1)(rng) == 0
                  ? int64_t{1} << log_r
                  : std::uniform_int_distribution<int64_t>(1, int64_t{1} << log_r)(rng);
    std::vector<int64_t> divisors;
    for (int64_t c = 1; c * c <= o.ranks; ++c) {
      if (o.ranks % c != 0) continue;
      divisors.push_back(c);
      if (c * c != o.ranks) divisors.push_back(o.ranks / c);
    }
    std::sort(divisors.begin(), divisors.end());
    auto pick = [&](size_t below) {
      return divisors[std::uniform_int_distribution<size_t>(0, below - 1)(rng)];
    };
    o.max_cp = pick(divisors.size());
    o.min_cp = std::uniform_int_distribution<int>(0, 1)(rng) == 0
                   ? 1
                   : std::uniform_int_distribution<int64_t>(1, o.max_cp)(rng);
    o.sizes = static_cast<CpSizeRule>(std::uniform_int_distribution<int>(0, 2)(rng));
    // divisible_by around the rank-slot limit's, log-uniform.
    const double most =
        std::log2(static_cast<double>(kMaxCpRankSlots) / static_cast<double>(o.ranks) * 4);
    o.divisible_by = static_cast<int64_t>(
        std::exp2(std::uniform_real_distribution<double>(0, std::max(most, 0.0))(rng)));
    o.max_groups = std::uniform_int_distribution<int>(0, 1)(rng) == 0
                       ? kMaxCpGroups
                       : std::uniform_int_distribution<int64_t>(1, 1 << 16)(rng);
    o.max_tokens_per_rank =
        std::uniform_int_distribution<int64_t>(2, (int64_t{1} << 31) / o.max_cp - 1)(rng);
    o.max_tokens_per_rank = std::min<int64_t>(o.max_tokens_per_rank, 1 << 16);
    o.cost = {.linear = 1, .quadratic = 1, .comm = 1, .micro_batch = 1};
    std::vector<int64_t> lengths(std::uniform_int_distribution<int>(0, 4)(rng));
    for (int64_t& l : lengths) l = std::uniform_int_distribution<int64_t>(1, 1 << 20)(rng);
    absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp(lengths, o);
    if (plan.ok()) {
      ++ok;
      int64_t groups = 0;
      for (const CpSlotPlan& slot : plan->slots) {
        groups += static_cast<int64_t>(slot.groups.size());
        int64_t covered = 0;
        for (const CpGroupPlan& g : slot.groups) covered += g.size;
        EXPECT_EQ(covered, o.ranks);
      }
      EXPECT_LE(groups, o.max_groups);
      EXPECT_LE(static_cast<int64_t>(plan->slots.size()) * o.ranks, kMaxCpRankSlots);
      EXPECT_EQ(plan->slots.size() % o.divisible_by, 0u);
      continue;
    }
    ++refused;
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    const std::string message(plan.status().message());
    bool named = false;
    for (const char* why : {"divisible_by = ", "more than max_groups", "rank-slots",
                            "CP sizes under sizes = any", "cannot split", "allows no CP size",
                            "exceeds max_cp", "rows a rank", "max_tokens_per_rank = "}) {
      named = named || message.find(why) != std::string::npos;
    }
    EXPECT_TRUE(named) << message;
  }
  EXPECT_GT(ok, 30);
  EXPECT_GT(refused, 30);
}

TEST(DynamicCpLossWeightsTest, PerTokenLossAcrossGroupsSumsToTheMean) {
  const std::vector<int64_t> tokens = {10, 0, 30};
  absl::StatusOr<std::vector<double>> w = DynamicCpLossWeights(tokens, {}, 8);
  ASSERT_TRUE(w.ok());
  EXPECT_DOUBLE_EQ((*w)[0] * 10 + (*w)[2] * 30, 1.0);
  LossOptions sample{.mode = LossMode::kSampleMean, .dp_reduction = DpReduction::kMean};
  w = DynamicCpLossWeights(tokens, sample, 8);
  ASSERT_TRUE(w.ok());
  EXPECT_DOUBLE_EQ((*w)[0] * 10, 8.0 / 2);  // two sequences with loss, averaged over 8 ranks
  EXPECT_EQ((*w)[1], 0.0);
  EXPECT_EQ(DynamicCpLossWeights({-1}, {}, 8).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched::planner
