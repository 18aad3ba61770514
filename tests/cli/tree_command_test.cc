// `packsched plan --tree`: the tree JSON read back into a forest, bad input named, and the run
// going to the tree planner's entry points, with the model's cost over the forest.

#include "server/cli/tree_command.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cli/read_tree.h"
#include "server/planner/model_cost.h"

namespace packsched::cli {
namespace {

using ::testing::HasSubstr;

TEST(ReadTree, ParsesTheMembers) {
  const absl::StatusOr<planner::Forest> f = ParseForest(
      R"( {"node_len": [100, 20, 30], "node_parent": [-1, 0, 0],
           "rollout_leaf": [1, 2], "rollout_len": [120, 130]} )",
      "f.json");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->node_len, (std::vector<int64_t>{100, 20, 30}));
  EXPECT_EQ(f->node_parent, (std::vector<int64_t>{-1, 0, 0}));
  EXPECT_EQ(f->rollout_leaf, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(f->rollout_len, (std::vector<int64_t>{120, 130}));
}

TEST(ReadTree, BadJsonIsNamed) {
  const struct {
    const char* text;
    const char* mentions;
  } cases[] = {
      {R"({"node_len": [1], "node_parent": [-1]})", "are required"},
      {R"({"node_len": [1], "node_len": [2]})", "given twice"},
      {R"({"nodes": [1]})", "unknown member \"nodes\""},
      {R"({"node_len": [1.5]})", "not a fraction"},
      {R"({"node_len": [1 2]})", "expected ',' or ']'"},
      {R"({"node_len": [1], "node_parent": [-1], "rollout_leaf": [0]} x)", "content after"},
      {R"([1, 2])", "expected '{'"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<planner::Forest> f = ParseForest(c.text, "f.json");
    ASSERT_FALSE(f.ok()) << c.text;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(c.mentions)) << c.text;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("f.json: byte "));
  }
}

planner::Forest Grpo() {
  return planner::Forest{{100, 20, 30, 40, 5}, {-1, 0, 0, -1, 3}, {1, 2, 0, 4}, {}};
}

TEST(TreeCommand, PlansAndPrints) {
  PlanRequest request;
  request.options.max_token_len = 160;
  const absl::StatusOr<TreePlanRun> run = RunTreePlan(Grpo(), request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_STREQ(run->run.mode, "balance");
  ASSERT_TRUE(run->plan.has_value());
  EXPECT_EQ(run->plan->forwarded_tokens, 195);
  EXPECT_EQ(run->unique_tokens, 195);
  const std::string json = TreePlanJson(*run);
  EXPECT_THAT(json, HasSubstr("\"forwarded_tokens\":195"));
  EXPECT_THAT(json, HasSubstr("\"subtree_end\":["));
  EXPECT_THAT(TreePlanTable(*run), HasSubstr("195 tokens forwarded (flat packing: 395"));
  // Token accounting: the rollouts' 395 tokens, 195 forwarded (no alignment: 195 rows).
  EXPECT_THAT(TreePlanTable(*run),
              HasSubstr("tokens: logical 395, executed 195 (rows, padding included), forwarded "
                        "195, tree token ratio 0.4937"));
  EXPECT_THAT(json, HasSubstr("\"tree_token_ratio\":0.4936"));
  EXPECT_THAT(json, HasSubstr("\"packed_tokens\":195"));

  request.world_size = 2;
  const absl::StatusOr<TreePlanRun> batch = RunTreePlan(Grpo(), request);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_TRUE(batch->batch.has_value());
  EXPECT_EQ(batch->batch->ranks.size(), 2u);
  EXPECT_THAT(TreePlanJson(*batch), HasSubstr("\"ranks\":["));
}

// --model_config with --tree: the model costed over the forest (planner::UseModelCost), so a
// forest of chains plans as its lengths do.
TEST(TreeCommand, ModelConfigCostsTheForest) {
  ModelFields model;
  model.ints = {{"hidden_size", 4096},
                {"num_hidden_layers", 32},
                {"num_attention_heads", 32},
                {"intermediate_size", 11008},
                {"vocab_size", 32000}};
  PlanRequest request;
  request.options.max_token_len = 3000;
  request.options.align_to = 8;
  request.model = model;
  const std::vector<int64_t> lengths = {700, 1800, 90, 2500, 1300, 40, 2900, 610, 950, 1111};
  planner::Forest chains;
  for (size_t i = 0; i < lengths.size(); ++i) {
    chains.node_len.push_back(lengths[i]);
    chains.node_parent.push_back(-1);
    chains.rollout_leaf.push_back(static_cast<int64_t>(i));
  }
  for (int64_t world_size : {0, 3}) {
    request.world_size = world_size;
    const absl::StatusOr<TreePlanRun> tree = RunTreePlan(chains, request);
    const absl::StatusOr<PlanRun> flat = RunPlan(lengths, request);
    ASSERT_TRUE(tree.ok() && flat.ok()) << tree.status() << flat.status();
    EXPECT_EQ(tree->run.request.options.cost, planner::CostModel::kAttention);
    EXPECT_EQ(tree->run.request.options.attention.linear, flat->request.options.attention.linear);
    EXPECT_EQ(tree->run.request.options.attention.quadratic,
              flat->request.options.attention.quadratic);
    EXPECT_EQ(tree->run.request.balance.micro_batch_cost, flat->request.balance.micro_batch_cost);
    if (world_size == 0) {
      ASSERT_EQ(tree->plan->parts.size(), flat->plan.parts.size());
      for (size_t p = 0; p < flat->plan.parts.size(); ++p) {
        EXPECT_EQ(tree->plan->parts[p].batch.cost, flat->plan.parts[p].cost);
        EXPECT_EQ(tree->plan->parts[p].layout.rollouts, flat->plan.parts[p].indices);
      }
    } else {
      EXPECT_GT(tree->run.request.balance.micro_batch_cost, 0);
      EXPECT_EQ(tree->batch->num_micro_batches, flat->batch->num_micro_batches);
      EXPECT_EQ(tree->batch->step.step_sync_cost, flat->batch->step.step_sync_cost);
    }
  }

  // A GRPO forest: the weights the model gives the forest, not those of its tokens flat.
  request.world_size = 0;
  const planner::Forest grpo = Grpo();
  const absl::StatusOr<TreePlanRun> run = RunTreePlan(grpo, request);
  ASSERT_TRUE(run.ok()) << run.status();
  planner::PlanOptions want = request.options;
  ASSERT_TRUE(planner::UseModelCost(model.ints, model.strings, grpo, want).ok());
  EXPECT_EQ(run->run.request.options.attention.linear, want.attention.linear);
  EXPECT_EQ(run->run.request.options.attention.quadratic, want.attention.quadratic);
  EXPECT_EQ(run->plan->forwarded_tokens, 195);
}

TEST(TreeCommand, BadForestAndRequestAreErrors) {
  PlanRequest request;
  request.options.max_token_len = 160;
  planner::Forest bad = Grpo();
  bad.node_parent[1] = 4;
  const absl::StatusOr<TreePlanRun> run = RunTreePlan(bad, request);
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("node 1 has node_parent = 4"));
  request.options.max_token_len = 0;
  EXPECT_EQ(RunTreePlan(Grpo(), request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TreeCommand, AForestWithNoRolloutsIsNothingToPlan) {
  // As an input with no lengths: in every mode (plan, pack, fixed k, coordinator).
  const planner::Forest empty;
  for (int mode = 0; mode < 4; ++mode) {
    PlanRequest request;
    request.options.max_token_len = 160;
    if (mode == 1) request.options.algorithm = planner::Algorithm::kFirstFitDecreasing;
    if (mode == 2) request.num_parts = 2;
    if (mode == 3) request.world_size = 2;
    const absl::StatusOr<TreePlanRun> run = RunTreePlan(empty, request);
    EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument) << "mode " << mode;
    EXPECT_THAT(std::string(run.status().message()), HasSubstr("nothing to plan"));
  }
}

}  // namespace
}  // namespace packsched::cli
