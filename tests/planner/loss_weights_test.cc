// Loss weights: the weighted per-sequence sums over all ranks equal the loss computed directly
// on the whole unpacked batch, for every mode and DP reduction.

#include "server/planner/loss_weights.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "tests/testing/lengths.h"

namespace packsched::planner {
namespace {

struct Rank {
  std::vector<int64_t> lengths;
  std::vector<int64_t> loss_tokens;  // tokens with a label, per sequence
  std::vector<double> loss_sums;     // sum of per-token losses, per sequence
};

// The loss of the whole batch computed directly, without any packing.
double DirectLoss(const std::vector<Rank>& ranks, LossMode mode, double c) {
  double total = 0, token_sum = 0, seq_mean_sum = 0, seq_sum = 0;
  int64_t tokens = 0, seqs = 0;
  for (const Rank& r : ranks) {
    for (size_t s = 0; s < r.lengths.size(); ++s) {
      token_sum += r.loss_sums[s];
      tokens += r.loss_tokens[s];
      if (r.loss_tokens[s] > 0) {
        seq_mean_sum += r.loss_sums[s] / r.loss_tokens[s];
        seq_sum += r.loss_sums[s];
        ++seqs;
      }
      total += r.loss_sums[s];
    }
  }
  switch (mode) {
    case LossMode::kTokenMean:
      return tokens ? token_sum / tokens : 0;
    case LossMode::kSampleMean:
      return seqs ? seq_mean_sum / seqs : 0;
    case LossMode::kSeqSum:
      return seqs ? seq_sum / seqs : 0;
    case LossMode::kSum:
      return total;
    case LossMode::kSumNorm:
      return total / c;
  }
  return NAN;
}

TEST(LossWeights, WeightedSumEqualsDirectLossForEveryModeAndWorldSize) {
  std::mt19937_64 rng(11);
  for (int world : {1, 2, 4}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<Rank> ranks(world);
      for (Rank& r : ranks) {
        r.lengths = packsched::testing::UniformLengths(
            std::uniform_int_distribution<int>(0, 30)(rng), 1, 400, rng());
        for (int64_t length : r.lengths) {
          // Some sequences have no loss tokens at all (fully masked prompts).
          const int64_t t = std::uniform_int_distribution<int64_t>(0, 3)(rng) == 0
                                ? 0
                                : std::uniform_int_distribution<int64_t>(1, length)(rng);
          r.loss_tokens.push_back(t);
          r.loss_sums.push_back(t * std::uniform_real_distribution<double>(0.1, 5.0)(rng));
        }
      }
      for (LossMode mode : {LossMode::kTokenMean, LossMode::kSampleMean, LossMode::kSeqSum,
                            LossMode::kSum, LossMode::kSumNorm}) {
        for (DpReduction dp : {DpReduction::kSum, DpReduction::kMean}) {
          const LossOptions options{mode, dp, 37.5};
          std::vector<MicroBatchPlan> plans;
          LossCounts global;
          PlanOptions po;
          po.max_token_len = 600;
          for (const Rank& r : ranks) {
            plans.push_back(*PlanMicroBatches(r.lengths, po));
            const LossCounts local = *CountLoss(plans.back(), r.loss_tokens);
            global.loss_tokens += local.loss_tokens;
            global.sequences_with_loss += local.sequences_with_loss;
          }
          // Each rank's gradient contribution is sum_s w_s * loss_s; DP mean divides by W.
          double objective = 0;
          for (int r = 0; r < world; ++r) {
            const LossWeights w =
                *ComputeLossWeights(plans[r], ranks[r].loss_tokens, options, global, world);
            for (size_t s = 0; s < ranks[r].lengths.size(); ++s) {
              objective += w.weights[s] * ranks[r].loss_sums[s];
            }
          }
          if (dp == DpReduction::kMean) objective /= world;
          const double direct = DirectLoss(ranks, mode, 37.5);
          EXPECT_NEAR(objective, direct, 1e-12 * std::max(1.0, std::abs(direct)))
              << Name(mode) << "/" << Name(dp) << " W=" << world;
        }
      }
    }
  }
}

TEST(LossWeights, LossScaleIsCommonWeightOrNaN) {
  PlanOptions po;
  po.max_token_len = 100;
  const MicroBatchPlan plan = *PartitionFixedK({10, 20, 30, 40}, 5, po);
  const std::vector<int64_t> tokens = {5, 10, 0, 8};
  const LossCounts counts = *CountLoss(plan, tokens);
  EXPECT_EQ(counts.loss_tokens, 23);
  EXPECT_EQ(counts.sequences_with_loss, 3);
  const LossWeights mean = *ComputeLossWeights(plan, tokens, {LossMode::kTokenMean}, counts, 1);
  for (size_t p = 0; p < plan.parts.size(); ++p) {
    EXPECT_DOUBLE_EQ(mean.loss_scales[p], plan.parts[p].empty ? 0.0 : 1.0 / 23);
  }
  const LossWeights sample = *ComputeLossWeights(plan, tokens, {LossMode::kSampleMean}, counts, 1);
  EXPECT_DOUBLE_EQ(sample.weights[0], 1.0 / (5 * 3));
  EXPECT_DOUBLE_EQ(sample.weights[2], 0.0);
  // The loss-bearing tokens of this plan's kept sequences, whatever the global counts.
  EXPECT_EQ(sample.loss_tokens, 23);
  EXPECT_EQ(ComputeLossWeights(plan, tokens, {LossMode::kSum}, {1000, 50}, 4)->loss_tokens, 23);
  PlanOptions one;
  one.max_token_len = 1000;
  const MicroBatchPlan together = *PlanMicroBatches({10, 20}, one);
  const LossWeights mixed =
      *ComputeLossWeights(together, {3, 4}, {LossMode::kSampleMean}, {7, 2}, 1);
  EXPECT_TRUE(std::isnan(mixed.loss_scales[0]));
}

TEST(LossWeights, DroppedSequencesWeighNothingAndCountNowhere) {
  PlanOptions po;
  po.max_token_len = 100;
  po.overlong = OverlongPolicy::kDrop;
  const MicroBatchPlan plan = *PlanMicroBatches({10, 500, 20}, po);
  const LossCounts counts = *CountLoss(plan, {4, 400, 6});
  EXPECT_EQ(counts.loss_tokens, 10);
  const LossWeights w = *ComputeLossWeights(plan, {4, 400, 6}, {LossMode::kSum}, counts, 1);
  EXPECT_EQ(w.weights[1], 0.0);
}

TEST(LossWeights, CountsBeforeAnyPlanMatchTheCountsOfEveryPlan) {
  std::mt19937_64 rng(5);
  PlanOptions po;
  po.max_token_len = 16384;
  for (OverlongPolicy overlong : {OverlongPolicy::kDrop, OverlongPolicy::kIsolate}) {
    po.overlong = overlong;
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      const std::vector<int64_t> lengths = testing::RealisticRlLengths(300, seed);
      std::vector<int64_t> tokens(lengths.size());
      for (size_t i = 0; i < lengths.size(); ++i) tokens[i] = rng() % 3 == 0 ? 0 : lengths[i] / 2;
      const Problem problem = *Problem::Create(lengths, po);
      const LossCounts before = *CountLoss(problem, tokens);
      for (int64_t k : {problem.local_k(), problem.local_k() + 7}) {
        const LossCounts after = *CountLoss(*problem.Partition(k), tokens);
        EXPECT_EQ(before.loss_tokens, after.loss_tokens) << seed << " k=" << k;
        EXPECT_EQ(before.sequences_with_loss, after.sequences_with_loss) << seed << " k=" << k;
      }
    }
  }
  const Problem dropping = *Problem::Create({10, 500, 20}, [] {
    PlanOptions o;
    o.max_token_len = 100;
    o.overlong = OverlongPolicy::kDrop;
    return o;
  }());
  EXPECT_EQ(CountLoss(dropping, {4, 400, 6})->loss_tokens, 10);
  EXPECT_EQ(CountLoss(dropping, {4, 400}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CountLoss(dropping, {4, -1, 6}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LossWeights, RejectsBadArguments) {
  PlanOptions po;
  po.max_token_len = 100;
  const MicroBatchPlan plan = *PlanMicroBatches({10, 20}, po);
  EXPECT_EQ(CountLoss(plan, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CountLoss(plan, {1, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ComputeLossWeights(plan, {1, 1}, {LossMode::kSumNorm, DpReduction::kSum, 0.0}, {2, 2}, 1)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeLossWeights(plan, {1, 1}, {}, {2, 2}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LossWeights, NamesRoundTrip) {
  for (LossMode m : {LossMode::kTokenMean, LossMode::kSampleMean, LossMode::kSeqSum, LossMode::kSum,
                     LossMode::kSumNorm}) {
    EXPECT_EQ(*ParseLossMode(Name(m)), m);
  }
  EXPECT_EQ(*ParseDpReduction("mean"), DpReduction::kMean);
  EXPECT_FALSE(ParseLossMode("avg").ok());
}

}  // namespace
}  // namespace packsched::planner
