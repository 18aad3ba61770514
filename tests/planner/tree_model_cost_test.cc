// The cost from the model over a forest (model_cost.h, CostOfModelForForest and UseModelCost's
// forest overload): chains get the weights and the plans of their rollouts' lengths, a GRPO
// forest is balanced within the cap under the model's weights, and trees the cap splits still fit
// the scale.

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/forest.h"
#include "server/planner/model_cost.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"
#include "server/planner/tree_plan.h"
#include "tests/planner/forest_fixtures.h"

namespace packsched::planner {
namespace {

using testing_forests::Groups;

using ::testing::HasSubstr;

// A Llama-7B-shaped config.json's fields.
absl::flat_hash_map<std::string, int64_t> Llama7bFields() {
  return {{"hidden_size", 4096},
          {"num_hidden_layers", 32},
          {"num_attention_heads", 32},
          {"intermediate_size", 11008},
          {"vocab_size", 32000}};
}
const absl::flat_hash_map<std::string, std::string> kNoStrings;

PlanOptions Capped(int64_t cap, int64_t align_to = 1) {
  PlanOptions o;
  o.max_token_len = cap;
  o.align_to = align_to;
  return o;
}

Forest Chains(const std::vector<int64_t>& lengths) {
  Forest f;
  for (size_t i = 0; i < lengths.size(); ++i) {
    f.node_len.push_back(lengths[i]);
    f.node_parent.push_back(-1);
    f.rollout_leaf.push_back(static_cast<int64_t>(i));
  }
  return f;
}

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

TEST(TreeModelCost, ChainsGetTheWeightsOfTheirLengths) {
  const ModelConfig model = *ModelConfigFromFields(Llama7bFields(), kNoStrings);
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> lengths(1 + rng() % 50);
    // Short ones, and long ones that make the quadratic term set the scale.
    for (int64_t& len : lengths)
      len = 1 + static_cast<int64_t>(rng() % (trial < 10 ? 900 : 1 << 28));
    const int64_t align_to = trial % 3 == 0 ? 64 : 1;
    const absl::StatusOr<ModelCost> flat = CostOfModelForBatch(model, lengths, align_to);
    const absl::StatusOr<ModelCost> tree = CostOfModelForForest(model, Chains(lengths), align_to);
    ASSERT_TRUE(flat.ok() && tree.ok()) << flat.status() << " " << tree.status();
    EXPECT_EQ(tree->linear, flat->linear);
    EXPECT_EQ(tree->quadratic, flat->quadratic);
    EXPECT_EQ(tree->micro_batch, flat->micro_batch);
    EXPECT_EQ(tree->shift, flat->shift);
  }
}

TEST(TreeModelCost, ChainsPlanAndBalanceAsTheirLengths) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<int64_t> lengths(30 + rng() % 30);
    for (int64_t& len : lengths) len = 1 + static_cast<int64_t>(rng() % 1500);
    const Forest chains = Chains(lengths);
    PlanOptions flat_options = Capped(4096, trial % 2 == 0 ? 8 : 1);
    PlanOptions tree_options = flat_options;
    const absl::StatusOr<int64_t> flat_micro =
        UseModelCost(Llama7bFields(), kNoStrings, lengths, flat_options);
    const absl::StatusOr<int64_t> tree_micro =
        UseModelCost(Llama7bFields(), kNoStrings, chains, tree_options);
    ASSERT_TRUE(flat_micro.ok() && tree_micro.ok());
    EXPECT_EQ(*tree_micro, *flat_micro);
    EXPECT_EQ(tree_options.cost, CostModel::kAttention);
    EXPECT_EQ(tree_options.attention.linear, flat_options.attention.linear);
    EXPECT_EQ(tree_options.attention.quadratic, flat_options.attention.quadratic);

    // One rank: the same micro-batches, holding the same rollouts at the same costs.
    const absl::StatusOr<MicroBatchPlan> flat = PlanMicroBatches(lengths, flat_options);
    const absl::StatusOr<TreePlan> tree = PlanForest(chains, tree_options);
    ASSERT_TRUE(flat.ok() && tree.ok()) << flat.status() << tree.status();
    ASSERT_EQ(tree->parts.size(), flat->parts.size());
    for (size_t p = 0; p < flat->parts.size(); ++p) {
      EXPECT_EQ(tree->parts[p].batch.cost, flat->parts[p].cost);
      EXPECT_EQ(tree->parts[p].layout.rollouts, flat->parts[p].indices);
    }

    // Coordinator mode, with the model's per-micro-batch cost: the same ranks.
    BalanceOptions flat_balance, tree_balance;
    flat_balance.sync = tree_balance.sync = trial % 3 == 0 ? Sync::kMicroBatch : Sync::kStep;
    flat_balance.micro_batch_cost = *flat_micro;
    tree_balance.micro_batch_cost = *tree_micro;
    const absl::StatusOr<BalancedBatch> flat_batch =
        BalanceBatch(lengths, 4, flat_options, {}, flat_balance);
    const absl::StatusOr<BalancedForest> tree_batch =
        BalanceForest(chains, 4, tree_options, tree_balance);
    ASSERT_TRUE(flat_batch.ok() && tree_batch.ok()) << flat_batch.status() << tree_batch.status();
    EXPECT_EQ(tree_batch->num_micro_batches, flat_batch->num_micro_batches);
    EXPECT_EQ(tree_batch->step.step_sync_cost, flat_batch->step.step_sync_cost);
    EXPECT_EQ(tree_batch->step.micro_batch_sync_cost, flat_batch->step.micro_batch_sync_cost);
    ASSERT_EQ(tree_batch->ranks.size(), flat_batch->ranks.size());
    for (size_t r = 0; r < flat_batch->ranks.size(); ++r) {
      const RankBatch& want = flat_batch->ranks[r];
      const TreePlan& got = tree_batch->ranks[r];
      ASSERT_EQ(got.parts.size(), want.plan.parts.size());
      for (size_t p = 0; p < want.plan.parts.size(); ++p) {
        // The flat rank's indices are local: map them to the batch's sequences.
        std::vector<int64_t> rollouts;
        for (int64_t local : want.plan.parts[p].indices) rollouts.push_back(want.indices[local]);
        std::sort(rollouts.begin(), rollouts.end());
        EXPECT_EQ(got.parts[p].layout.rollouts, rollouts) << "rank " << r << " part " << p;
        EXPECT_EQ(got.parts[p].batch.cost, want.plan.parts[p].cost);
      }
    }
  }
}

// With align_to = 1 any forest gets the weights of its rollouts flat, not those of its trees:
// here a tree far longer than its rollouts, whose own length would scale the weights coarser.
TEST(TreeModelCost, AForestCostsWhatItsRolloutsCostFlat) {
  const ModelConfig model = *ModelConfigFromFields(Llama7bFields(), kNoStrings);
  const int64_t prompt = int64_t{1} << 20;
  std::vector<std::vector<int64_t>> completions(2);
  for (int64_t c = 0; c < 200; ++c) completions[0].push_back(prompt - c);
  completions[1] = {5, 6, 7};
  const Forest f = Groups({prompt, 100}, completions);
  const ForestIndex index = *IndexForest(f);
  const absl::StatusOr<ModelCost> tree = CostOfModelForForest(model, f, 1);
  const absl::StatusOr<ModelCost> flat = CostOfModelForBatch(model, index.rollout_len, 1);
  ASSERT_TRUE(tree.ok() && flat.ok()) << tree.status() << flat.status();
  EXPECT_EQ(tree->linear, flat->linear);
  EXPECT_EQ(tree->quadratic, flat->quadratic);
  EXPECT_EQ(tree->shift, flat->shift);
  const absl::StatusOr<ModelCost> by_tree =
      CostOfModel(model, index.rollout_tokens, index.unique_tokens);
  ASSERT_TRUE(by_tree.ok());
  EXPECT_GT(by_tree->shift, tree->shift);  // the longest tree would have mattered

  // With align_to > 1 the longest sequence gains 2 x (align_to - 1) for the pieces' padding:
  // seen with a small model, whose quadratic term sets the scale at these lengths.
  const ModelConfig small = *ModelConfigFromFields({{"hidden_size", 64},
                                                    {"num_hidden_layers", 8},
                                                    {"num_attention_heads", 1},
                                                    {"intermediate_size", 64},
                                                    {"vocab_size", 1}},
                                                   kNoStrings);
  const int64_t align_to = prompt;
  int64_t total = 0, longest = 0;
  for (int64_t length : index.rollout_len) {
    total += RoundUp(length, align_to);
    longest = std::max(longest, RoundUp(length, align_to));
  }
  const absl::StatusOr<ModelCost> aligned = CostOfModelForForest(small, f, align_to);
  const absl::StatusOr<ModelCost> padded = CostOfModel(small, total, longest + 2 * (align_to - 1));
  const absl::StatusOr<ModelCost> unpadded = CostOfModel(small, total, longest);
  ASSERT_TRUE(aligned.ok() && padded.ok() && unpadded.ok());
  EXPECT_EQ(aligned->shift, padded->shift);
  EXPECT_EQ(aligned->linear, padded->linear);
  EXPECT_EQ(aligned->quadratic, padded->quadratic);
  EXPECT_GT(padded->shift, unpadded->shift);  // the slack mattered here
}

// The batch of a forest: its rollouts' aligned tokens, in sequences of its longest aligned
// rollout (plus the padding's slack, below its largest tree); the pieces planned under those
// weights, within the cap.
TEST(TreeModelCost, GrpoForestIsBalancedUnderTheModelWeights) {
  std::mt19937_64 rng(8);
  std::vector<int64_t> prompts;
  std::vector<std::vector<int64_t>> completions;
  for (int g = 0; g < 16; ++g) {
    prompts.push_back(200 + static_cast<int64_t>(rng() % 3000));
    completions.emplace_back(8);
    for (int64_t& c : completions.back()) c = 1 + static_cast<int64_t>(rng() % 2000);
  }
  const Forest f = Groups(prompts, completions);
  const int64_t cap = 16384, align_to = 16;
  PlanOptions o = Capped(cap, align_to);
  o.overlong = OverlongPolicy::kIsolate;
  const absl::StatusOr<int64_t> micro = UseModelCost(Llama7bFields(), kNoStrings, f, o);
  ASSERT_TRUE(micro.ok()) << micro.status();

  // The weights are the model's over that batch.
  int64_t total = 0, rollout = 0, tree = 0;
  for (size_t g = 0; g < prompts.size(); ++g) {
    int64_t tokens = prompts[g];
    for (int64_t c : completions[g]) {
      total += RoundUp(prompts[g] + c, align_to);
      rollout = std::max(rollout, RoundUp(prompts[g] + c, align_to));
      tokens += c;
    }
    tree = std::max(tree, RoundUp(tokens, align_to));
  }
  const ModelConfig model = *ModelConfigFromFields(Llama7bFields(), kNoStrings);
  const absl::StatusOr<ModelCost> want =
      CostOfModel(model, total, std::min(tree, rollout + 2 * (align_to - 1)));
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(o.cost, CostModel::kAttention);
  EXPECT_EQ(o.attention.linear, want->linear);
  EXPECT_EQ(o.attention.quadratic, want->quadratic);
  EXPECT_EQ(*micro, want->micro_batch);

  BalanceOptions balance;
  balance.sync = Sync::kMicroBatch;
  balance.micro_batch_cost = *micro;
  const absl::StatusOr<BalancedForest> batch = BalanceForest(f, 4, o, balance);
  ASSERT_TRUE(batch.ok()) << batch.status();
  // The same plan as the attention cost with those weights given by hand.
  PlanOptions by_hand = Capped(cap, align_to);
  by_hand.overlong = OverlongPolicy::kIsolate;
  by_hand.cost = CostModel::kAttention;
  by_hand.attention = {.linear = want->linear, .quadratic = want->quadratic};
  const absl::StatusOr<BalancedForest> same = BalanceForest(f, 4, by_hand, balance);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->num_micro_batches, batch->num_micro_batches);
  EXPECT_EQ(same->step.micro_batch_sync_cost, batch->step.micro_batch_sync_cost);

  // Every micro-batch within the cap; every piece costed with the model's weights.
  const ForestIndex index = *IndexForest(f);
  std::vector<int> seen(f.rollout_leaf.size(), 0);
  for (size_t r = 0; r < batch->ranks.size(); ++r) {
    const TreePlan& rank = batch->ranks[r];
    ASSERT_EQ(rank.parts.size(), same->ranks[r].parts.size());
    for (size_t p = 0; p < rank.parts.size(); ++p) {
      const TreeMicroBatch& part = rank.parts[p];
      EXPECT_EQ(part.batch.cost, same->ranks[r].parts[p].batch.cost);
      EXPECT_EQ(part.layout.rollouts, same->ranks[r].parts[p].layout.rollouts);
      EXPECT_LE(part.batch.aligned_tokens, cap);
      int64_t cost = 0;
      const TreeEntries entries = Entries(part, f);
      for (size_t b = 0; b + 1 < entries.piece_begin.size(); ++b) {
        int64_t tokens = 0, quadratic = 0;
        for (int64_t e = entries.piece_begin[b]; e < entries.piece_begin[b + 1]; ++e) {
          const int64_t node = entries.nodes[e];
          const int64_t d = index.depth[node], l = f.node_len[node];
          tokens += l;
          quadratic += l * (2 * d + l);
        }
        const int64_t aligned = RoundUp(tokens, align_to);
        cost += want->linear * aligned +
                want->quadratic * (quadratic + aligned * aligned - tokens * tokens);
      }
      EXPECT_EQ(part.batch.cost, cost);
      for (int64_t rollout : part.layout.rollouts) ++seen[rollout];
    }
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

// A tree the cap cuts forwards its prefix once per piece: the scale must count that. One prompt
// of 2^28 tokens with 16 one-token completions and a cap of one rollout: 16 pieces of 2^28 + 1
// tokens. Weights fitted to the tree's own tokens would overflow the pieces' total cost.
TEST(TreeModelCost, SplitTreesStillFitTheScale) {
  const int64_t prompt = int64_t{1} << 28;
  const Forest f = Groups({prompt}, {std::vector<int64_t>(16, 1)});
  PlanOptions o = Capped(prompt + 1);
  const absl::StatusOr<int64_t> micro = UseModelCost(Llama7bFields(), kNoStrings, f, o);
  ASSERT_TRUE(micro.ok()) << micro.status();
  const absl::StatusOr<TreeProblem> problem = TreeProblem::Create(f, o);
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_EQ(problem->pieces().size(), 16u);
  int64_t total = 0;
  for (const TreePiece& piece : problem->pieces()) {
    EXPECT_EQ(piece.tokens, prompt + 1);
    total += piece.cost;  // each at most 2^62: no overflow for two
    ASSERT_LE(total, int64_t{1} << 62);
  }

  // The tree's unique tokens as the batch: a finer scale, under which the pieces overflow.
  PlanOptions naive = Capped(prompt + 1);
  ASSERT_TRUE(
      UseModelCost(Llama7bFields(), kNoStrings, std::vector<int64_t>{prompt + 16}, naive).ok());
  EXPECT_GT(naive.attention.quadratic, o.attention.quadratic);
  const absl::StatusOr<TreeProblem> overflow = TreeProblem::Create(f, naive);
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overflow.status().message()), HasSubstr("overflows int64"));
}

TEST(TreeModelCost, BadForestAndAlignAreNamed) {
  const ModelConfig model = *ModelConfigFromFields(Llama7bFields(), kNoStrings);
  Forest bad = Groups({10}, {{5, 6}});
  bad.node_parent[2] = 7;
  const absl::StatusOr<ModelCost> cost = CostOfModelForForest(model, bad, 1);
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cost.status().message()), HasSubstr("node 2"));
  const absl::StatusOr<ModelCost> align = CostOfModelForForest(model, Groups({10}, {{5}}), 0);
  EXPECT_THAT(std::string(align.status().message()), HasSubstr("align_to = 0"));
  PlanOptions o = Capped(100);
  const absl::StatusOr<int64_t> missing =
      UseModelCost({{"hidden_size", 8}}, kNoStrings, Groups({10}, {{5}}), o);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("num_hidden_layers is missing"));
  EXPECT_EQ(o.cost, CostModel::kTokens);  // untouched on failure
}

}  // namespace
}  // namespace packsched::planner
