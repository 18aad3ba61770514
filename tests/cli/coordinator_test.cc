// `packsched plan --world_size`: coordinator mode through RunPlan, its JSON, its refusals, and
// --model_config's reader.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cli/json_output.h"
#include "server/cli/plan_command.h"
#include "server/cli/read_model_config.h"
#include "server/cli/table_output.h"
#include "server/planner/model_cost.h"
#include "server/planner/planner.h"

namespace packsched::cli {
namespace {

using ::testing::HasSubstr;

const std::vector<int64_t> kLengths = {3000, 8000, 2000, 5000, 1000, 7000, 9000, 500};

TEST(CoordinatorTest, WorldSizeGoesToBalanceBatchWithItsSync) {
  for (planner::Sync sync : {planner::Sync::kStep, planner::Sync::kMicroBatch}) {
    PlanRequest request;
    request.options.max_token_len = 10240;
    request.world_size = 2;
    request.balance.sync = sync;
    request.balance.micro_batch_cost = 100;
    absl::StatusOr<PlanRun> run = RunPlan(kLengths, request);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_STREQ(run->mode, "coordinator");
    ASSERT_TRUE(run->batch.has_value());
    // The same as the planner called directly.
    const absl::StatusOr<planner::BalancedBatch> direct =
        planner::BalanceBatch(kLengths, 2, request.options, {}, request.balance);
    ASSERT_TRUE(direct.ok());
    EXPECT_EQ(run->batch->num_micro_batches, direct->num_micro_batches);
    EXPECT_EQ(run->batch->step.micro_batch_sync_cost, direct->step.micro_batch_sync_cost);
    const std::string json = PlanJson(*run);
    EXPECT_THAT(json, HasSubstr("\"ranks\":[{\"indices\":"));
    EXPECT_THAT(json, HasSubstr("\"micro_batch_sync_cost\":"));
    EXPECT_THAT(json, HasSubstr(absl::StrCat("\"sync\":\"", planner::Name(sync), "\"")));
    EXPECT_THAT(PlanTable(*run), HasSubstr("lower bound"));
  }
}

TEST(CoordinatorTest, Refusals) {
  PlanRequest request;
  request.options.max_token_len = 10240;
  request.balance.sync = planner::Sync::kMicroBatch;
  EXPECT_THAT(CheckRequest(request).message(), HasSubstr("coordinator mode"));
  request.world_size = 2;
  request.num_parts = 3;
  EXPECT_THAT(CheckRequest(request).message(), HasSubstr("--num_parts"));
  request.num_parts = 0;
  request.world_size = -1;
  EXPECT_FALSE(CheckRequest(request).ok());
}

TEST(CoordinatorTest, ModelConfigSetsTheCost) {
  absl::StatusOr<ModelFields> fields = ParseModelConfig(
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "rope_scaling": {"type":
      "linear", "factor": 2.0}, "intermediate_size": 5632, "model_type": "llama",
      "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
      "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "vocab_size": 32000, "name": "a\"b"})",
      "config.json");
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(fields->ints.at("hidden_size"), 2048);
  EXPECT_EQ(fields->strings.at("model_type"), "llama");
  EXPECT_EQ(fields->strings.at("name"), "a\"b");
  EXPECT_FALSE(fields->ints.contains("rms_norm_eps"));
  EXPECT_FALSE(fields->ints.contains("factor"));  // nested: skipped
  PlanRequest request;
  request.options.max_token_len = 10240;
  request.world_size = 2;
  request.model = *fields;
  absl::StatusOr<PlanRun> run = RunPlan(kLengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->request.options.cost, planner::CostModel::kAttention);
  EXPECT_GT(run->request.options.attention.quadratic, 0);
  EXPECT_EQ(run->request.balance.micro_batch_cost, run->request.options.attention.linear * 2048);

  for (const char* bad : {"[1, 2]", "{\"a\": }", "{\"a\": 1", "{\"a\": 1} x", "{\"a\": tru}"}) {
    absl::StatusOr<ModelFields> f = ParseModelConfig(bad, "bad.json");
    EXPECT_FALSE(f.ok()) << bad;
    if (!f.ok()) {
      EXPECT_THAT(f.status().message(), HasSubstr("bad.json"));
    }
  }
}

// Whole numbers written as reals are integers; other numbers and lists reach the model cost as
// their text, which refuses them where it reads an integer, naming the field.
TEST(CoordinatorTest, ModelConfigNumbersAndLists) {
  absl::StatusOr<ModelFields> fields = ParseModelConfig(
      R"({"hidden_size": 4096.0, "num_key_value_heads": 8.0, "num_attention_heads": 3.2e1,
      "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000,
      "rms_norm_eps": 1e-05, "big": 1e30, "mlp_only_layers": [0, 31]})",
      "config.json");
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(fields->ints.at("hidden_size"), 4096);
  EXPECT_EQ(fields->ints.at("num_key_value_heads"), 8);
  EXPECT_EQ(fields->ints.at("num_attention_heads"), 32);
  EXPECT_EQ(fields->strings.at("rms_norm_eps"), "1e-05");
  EXPECT_EQ(fields->strings.at("big"), "1e30");
  EXPECT_EQ(fields->strings.at("mlp_only_layers"), "[0, 31]");
  absl::StatusOr<planner::ModelConfig> model =
      planner::ModelConfigFromFields(fields->ints, fields->strings);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->num_kv_heads, 8);  // GQA, not MHA
  EXPECT_EQ(model->mlp_only_layers, (std::vector<int64_t>{0, 31}));

  fields = ParseModelConfig(
      R"({"hidden_size": 4096, "num_key_value_heads": 7.5, "num_attention_heads": 32,
      "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000})",
      "config.json");
  ASSERT_TRUE(fields.ok()) << fields.status();
  absl::Status status = planner::ModelConfigFromFields(fields->ints, fields->strings).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("num_key_value_heads = 7.5"));
}

// JSON true, false and null and lists of strings reach the model cost as their text: a Gemma 3
// config's sliding layers (layer_types), a null rope_scaling or head_dim that is not an integer
// field's value, and the plan's costs count the window.
TEST(CoordinatorTest, ModelConfigLayerTypesAndLiterals) {
  std::string types;
  for (int i = 0; i < 6; ++i) {
    absl::StrAppend(&types, i ? ", " : "", i == 5 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  absl::StatusOr<ModelFields> fields = ParseModelConfig(
      absl::StrCat(R"({"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 6,
      "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size":
      6912, "vocab_size": 262144, "sliding_window": 512, "rope_scaling": null, "final_logit_softcapping":
      null, "use_bidirectional_attention": false, "attention_bias": false, "layer_types": [)",
                   types, "]}"),
      "config.json");
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(fields->strings.at("rope_scaling"), "null");
  EXPECT_EQ(fields->strings.at("attention_bias"), "false");
  absl::StatusOr<planner::ModelConfig> model =
      planner::ModelConfigFromFields(fields->ints, fields->strings);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->sliding_window, 512);
  EXPECT_EQ(std::count(model->layer_attention.begin(), model->layer_attention.end(),
                       planner::ModelConfig::Attention::kSliding),
            5);
  PlanRequest request;
  request.options.max_token_len = 10240;
  request.world_size = 2;
  request.model = *fields;
  absl::StatusOr<PlanRun> run = RunPlan(kLengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->request.options.attention.window, 512);
  EXPECT_GT(run->request.options.attention.windowed, 0);
  EXPECT_EQ(run->request.options.attention.windowed, 5 * run->request.options.attention.quadratic);
}

// A vision-language config: the language model's fields come from text_config, whose values win
// over the top level's; other nested objects are skipped.
TEST(CoordinatorTest, ModelConfigTextConfig) {
  absl::StatusOr<ModelFields> fields = ParseModelConfig(
      R"({"model_type": "llava", "hidden_size": 1024, "vision_config": {"hidden_size": 1152,
      "num_hidden_layers": 27}, "text_config": {"model_type": "llama", "hidden_size": 4096.0,
      "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "intermediate_size": 14336, "vocab_size": 128256, "rope_scaling": {"factor": 8.0}}})",
      "config.json");
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(fields->ints.at("hidden_size"), 4096);
  EXPECT_EQ(fields->ints.at("num_hidden_layers"), 32);
  EXPECT_EQ(fields->strings.at("model_type"), "llama");
  EXPECT_FALSE(fields->ints.contains("factor"));
  absl::StatusOr<planner::ModelConfig> model =
      planner::ModelConfigFromFields(fields->ints, fields->strings);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->num_kv_heads, 8);
  EXPECT_EQ(model->vocab_size, 128256);
  // A text_config nested deeper is not the language model's.
  fields = ParseModelConfig(R"({"a": {"text_config": {"hidden_size": 1}}})", "config.json");
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_FALSE(fields->ints.contains("hidden_size"));
}

}  // namespace
}  // namespace packsched::cli
