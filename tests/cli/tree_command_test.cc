// `packsched plan --tree`: the tree JSON read back into a forest, bad input named, and the run
// going to the tree planner's entry points.

#include "server/cli/tree_command.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cli/read_tree.h"

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

  request.world_size = 2;
  const absl::StatusOr<TreePlanRun> batch = RunTreePlan(Grpo(), request);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_TRUE(batch->batch.has_value());
  EXPECT_EQ(batch->batch->ranks.size(), 2u);
  EXPECT_THAT(TreePlanJson(*batch), HasSubstr("\"ranks\":["));
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

}  // namespace
}  // namespace packsched::cli
