// The cost from the model for published architectures, against hand counts written here: per
// token, parameter by parameter, the matrices a token passes through (x 6: 2 FLOPs a multiply-add,
// forward + backward), and per layer kind the attention scores counted position by position (a
// query that sees k keys: 2k - 1, so that a causal sequence counts L^2). The configs are the
// published config.json fields (the text model's, for the multimodal ones), typed in.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/model_cost.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"

namespace packsched::planner {
namespace {

using Ints = absl::flat_hash_map<std::string, int64_t>;
using Strings = absl::flat_hash_map<std::string, std::string>;

// Keys a query at position p sees in a sliding window of w (transformers: kv > q - w) and in
// chunks of c (transformers: the same chunk, causal).
int64_t SlidingKeys(int64_t p, int64_t w) { return p + 1 < w ? p + 1 : w; }
int64_t ChunkKeys(int64_t p, int64_t c) { return p % c + 1; }

// sum over the positions of one sequence of (2 x keys - 1), counted one position at a time.
template <typename Keys>
double Scores(int64_t length, Keys keys) {
  double sum = 0;
  for (int64_t p = 0; p < length; ++p) sum += 2.0 * keys(p) - 1;
  return sum;
}

// The hand count of one model: matrices per token, and per layer kind the layers and the
// per-score FLOPs (3 x heads x (qk dim + v dim): QK^T and AV, 2 FLOPs a pair, L^2 / 2 pairs).
struct HandCount {
  double params = 0;  // multiply-adds per token
  double score_flops = 0;
  int64_t full_layers = 0, sliding_layers = 0, chunked_layers = 0;
  int64_t window = 0, chunk = 0;

  double Linear() const { return 6 * params; }
  // Forward + backward FLOPs of one sequence of `length` tokens.
  double Sequence(int64_t length) const {
    double scores = full_layers * Scores(length, [](int64_t p) { return p + 1; });
    if (sliding_layers > 0) {
      scores += sliding_layers * Scores(length, [&](int64_t p) { return SlidingKeys(p, window); });
    }
    if (chunked_layers > 0) {
      scores += chunked_layers * Scores(length, [&](int64_t p) { return ChunkKeys(p, chunk); });
    }
    return Linear() * length + score_flops * scores;
  }
};

ModelCost CostOf(const Ints& ints, const Strings& strings) {
  const absl::StatusOr<ModelConfig> m = ModelConfigFromFields(ints, strings);
  EXPECT_TRUE(m.ok()) << m.status();
  const absl::StatusOr<ModelCost> c = CostOfModel(*m, 1'000'000, 131072);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// The weights agree with the hand count to within their rounding (half a unit of 2^shift).
void ExpectMatches(const ModelCost& c, const HandCount& hand) {
  const double unit = std::ldexp(1.0, c.shift);
  EXPECT_NEAR(c.linear * unit, hand.Linear(), unit);
  EXPECT_NEAR(c.quadratic * unit, hand.score_flops * hand.full_layers, unit);
  EXPECT_NEAR(c.windowed * unit, hand.score_flops * hand.sliding_layers, unit);
  EXPECT_NEAR(c.chunked * unit, hand.score_flops * hand.chunked_layers, unit);
  EXPECT_EQ(c.window, hand.sliding_layers > 0 ? hand.window : 0);
  EXPECT_EQ(c.chunk, hand.chunked_layers > 0 ? hand.chunk : 0);
}

// One sequence of `length` tokens planned under the model's cost: its micro-batch's cost, in
// FLOPs.
double PlannedFlops(const Ints& ints, const Strings& strings, int64_t length) {
  PlanOptions o;
  o.max_token_len = length;
  const std::vector<int64_t> lengths = {length};
  const absl::StatusOr<int64_t> overhead = UseModelCost(ints, strings, lengths, o);
  EXPECT_TRUE(overhead.ok()) << overhead.status();
  const absl::StatusOr<ModelCost> c =
      CostOfModelForBatch(*ModelConfigFromFields(ints, strings), lengths, /*align_to=*/1);
  const absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches(lengths, o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return std::ldexp(double(plan->parts[0].cost), c->shift);
}

// Attention parameters per token of a GQA layer.
double Gqa(double h, double heads, double kv, double d) {
  return 2 * h * heads * d + 2 * h * kv * d;
}

Ints Llama4Scout() {
  return {{"hidden_size", 5120},
          {"intermediate_size", 8192},
          {"intermediate_size_mlp", 16384},
          {"num_attention_heads", 40},
          {"num_key_value_heads", 8},
          {"head_dim", 128},
          {"num_hidden_layers", 48},
          {"num_local_experts", 16},
          {"num_experts_per_tok", 1},
          {"interleave_moe_layer_step", 1},
          {"vocab_size", 202048},
          {"attention_chunk_size", 8192}};
}

HandCount Llama4Hand(int64_t experts, int64_t step) {
  const double h = 5120;
  HandCount hand;
  const int64_t moe_layers = 48 / step, dense_layers = 48 - moe_layers;
  const double routed = 3 * h * 8192, shared = 3 * h * 8192, router = h * experts;
  hand.params = 48 * Gqa(h, 40, 8, 128) + moe_layers * (routed + shared + router) +
                dense_layers * 3 * h * 16384 + h * 202048;
  hand.score_flops = 3.0 * 40 * (128 + 128);
  // No RoPE (and full attention) on every 4th layer, chunks of 8,192 on the others.
  hand.full_layers = 12;
  hand.chunked_layers = 36;
  hand.chunk = 8192;
  return hand;
}

const Strings kLlama4 = {{"model_type", "llama4_text"}, {"no_rope_layers", "[]"}};

TEST(ModelAttentionCost, Llama4ScoutAndMaverick) {
  ExpectMatches(CostOf(Llama4Scout(), kLlama4), Llama4Hand(16, 1));
  Ints maverick = Llama4Scout();
  maverick["num_local_experts"] = 128;
  maverick["interleave_moe_layer_step"] = 2;
  ExpectMatches(CostOf(maverick, kLlama4), Llama4Hand(128, 2));
  // The multimodal config's model_type (text_config fields) is costed the same way.
  ExpectMatches(CostOf(Llama4Scout(), {{"model_type", "llama4"}}), Llama4Hand(16, 1));
  // An explicit no_rope_layers list: only its 1s are chunked.
  std::string flags = "[";
  for (int i = 0; i < 48; ++i) flags += std::string(i ? ", " : "") + (i < 8 ? "1" : "0");
  HandCount eight = Llama4Hand(16, 1);
  eight.full_layers = 40;
  eight.chunked_layers = 8;
  ExpectMatches(
      CostOf(Llama4Scout(), {{"model_type", "llama4_text"}, {"no_rope_layers", flags + "]"}}),
      eight);
}

TEST(ModelAttentionCost, Llama4ScoutLongSequencesCostWhatTheChunksSay) {
  const HandCount hand = Llama4Hand(16, 1);
  const double by_hand = hand.Sequence(131072) / hand.Sequence(1024);
  EXPECT_NEAR(by_hand, 201, 1);  // the figure counted on paper for the issue
  const double planned =
      PlannedFlops(Llama4Scout(), kLlama4, 131072) / PlannedFlops(Llama4Scout(), kLlama4, 1024);
  EXPECT_NEAR(planned / by_hand, 1.0, 1e-6);
  for (int64_t length : {1, 8191, 8192, 8193, 20000, 131072}) {
    EXPECT_NEAR(PlannedFlops(Llama4Scout(), kLlama4, length) / hand.Sequence(length), 1.0, 1e-6)
        << length;
  }
}

TEST(ModelAttentionCost, Gemma3) {
  const Ints gemma = {{"hidden_size", 5376},
                      {"intermediate_size", 21504},
                      {"num_attention_heads", 32},
                      {"num_key_value_heads", 16},
                      {"head_dim", 128},
                      {"num_hidden_layers", 62},
                      {"vocab_size", 262208},
                      {"sliding_window", 1024},
                      {"sliding_window_pattern", 6}};
  const double h = 5376;
  HandCount hand;
  hand.params = 62 * (Gqa(h, 32, 16, 128) + 3 * h * 21504) + h * 262208;
  hand.score_flops = 3.0 * 32 * 256;
  hand.full_layers = 10;  // layers 5, 11, ..., 59
  hand.sliding_layers = 52;
  hand.window = 1024;
  ExpectMatches(CostOf(gemma, {{"model_type", "gemma3_text"}}), hand);
  for (int64_t length : {1000, 1024, 1025, 50000}) {
    EXPECT_NEAR(
        PlannedFlops(gemma, {{"model_type", "gemma3_text"}}, length) / hand.Sequence(length), 1.0,
        1e-6);
  }
  // An explicit layer_types list wins over the pattern.
  std::string types = "[";
  for (int i = 0; i < 62; ++i) {
    types += std::string(i ? ", " : "") + (i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  HandCount alternate = hand;
  alternate.full_layers = 31;
  alternate.sliding_layers = 31;
  ExpectMatches(CostOf(gemma, {{"model_type", "gemma3_text"}, {"layer_types", types + "]"}}),
                alternate);
  // Gemma 2: every other layer, from the first.
  HandCount gemma2 = alternate;
  ExpectMatches(CostOf(gemma, {{"model_type", "gemma2"}}), gemma2);
}

TEST(ModelAttentionCost, MistralSlidingWindow) {
  const Ints mistral = {{"hidden_size", 4096},       {"intermediate_size", 14336},
                        {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                        {"num_hidden_layers", 32},   {"vocab_size", 32000},
                        {"sliding_window", 4096}};
  const double h = 4096;
  HandCount hand;
  hand.params = 32 * (Gqa(h, 32, 8, 128) + 3 * h * 14336) + h * 32000;
  hand.score_flops = 3.0 * 32 * 256;
  hand.sliding_layers = 32;
  hand.window = 4096;
  ExpectMatches(CostOf(mistral, {{"model_type", "mistral"}}), hand);
  EXPECT_NEAR(PlannedFlops(mistral, {{"model_type", "mistral"}}, 32768) / hand.Sequence(32768), 1.0,
              1e-6);
  // sliding_window null (Mistral v0.2 on): every layer sees the whole sequence.
  HandCount full = hand;
  full.full_layers = 32;
  full.sliding_layers = 0;
  ExpectMatches(CostOf(mistral, {{"model_type", "mistral"}, {"sliding_window", "null"}}), full);
}

TEST(ModelAttentionCost, Qwen3Moe) {
  Ints qwen = {
      {"hidden_size", 2048},       {"intermediate_size", 6144}, {"moe_intermediate_size", 768},
      {"num_attention_heads", 32}, {"num_key_value_heads", 4},  {"head_dim", 128},
      {"num_hidden_layers", 48},   {"num_experts", 128},        {"num_experts_per_tok", 8},
      {"decoder_sparse_step", 1},  {"vocab_size", 151936},      {"max_window_layers", 48}};
  const double h = 2048;
  HandCount hand;
  hand.params = 48 * (Gqa(h, 32, 4, 128) + 3 * h * 768 * 8 + h * 128) + h * 151936;
  hand.score_flops = 3.0 * 32 * 256;
  hand.full_layers = 48;
  const Strings published = {{"model_type", "qwen3_moe"},
                             {"mlp_only_layers", "[]"},
                             {"use_sliding_window", "false"},
                             {"sliding_window", "null"}};
  ExpectMatches(CostOf(qwen, published), hand);
  // With use_sliding_window, every layer slides.
  qwen["sliding_window"] = 4096;
  HandCount windowed = hand;
  windowed.full_layers = 0;
  windowed.sliding_layers = 48;
  windowed.window = 4096;
  ExpectMatches(CostOf(qwen, {{"model_type", "qwen3_moe"}, {"use_sliding_window", "true"}}),
                windowed);
  ExpectMatches(CostOf(qwen, {{"model_type", "qwen3_moe"}, {"use_sliding_window", "false"}}), hand);
}

TEST(ModelAttentionCost, DeepSeekV3) {
  const Ints deepseek = {
      {"hidden_size", 7168},        {"intermediate_size", 18432}, {"moe_intermediate_size", 2048},
      {"num_attention_heads", 128}, {"num_key_value_heads", 128}, {"num_hidden_layers", 61},
      {"n_routed_experts", 256},    {"n_shared_experts", 1},      {"num_experts_per_tok", 8},
      {"first_k_dense_replace", 3}, {"moe_layer_freq", 1},        {"q_lora_rank", 1536},
      {"kv_lora_rank", 512},        {"qk_nope_head_dim", 128},    {"qk_rope_head_dim", 64},
      {"v_head_dim", 128},          {"vocab_size", 129280}};
  const double h = 7168;
  const double q = h * 1536 + 1536.0 * 128 * (128 + 64);
  const double kv = h * (512 + 64) + 512.0 * 128 * (128 + 128);
  const double o = 128.0 * 128 * h;
  const double moe = 3 * h * 2048 * (8 + 1) + h * 256;
  HandCount hand;
  hand.params = 61 * (q + kv + o) + 3 * (3 * h * 18432) + 58 * moe + h * 129280;
  hand.score_flops = 3.0 * 128 * (192 + 128);
  hand.full_layers = 61;
  ExpectMatches(CostOf(deepseek, {{"model_type", "deepseek_v3"}}), hand);
}

TEST(ModelAttentionCost, GptOss) {
  const Ints gpt = {{"hidden_size", 2880},
                    {"intermediate_size", 2880},
                    {"num_attention_heads", 64},
                    {"num_key_value_heads", 8},
                    {"head_dim", 64},
                    {"num_hidden_layers", 36},
                    {"num_local_experts", 128},
                    {"num_experts_per_tok", 4},
                    {"vocab_size", 201088},
                    {"sliding_window", 128}};
  std::string types = "[";
  for (int i = 0; i < 36; ++i) {
    types += std::string(i ? ", " : "") + (i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  const double h = 2880;
  HandCount hand;
  hand.params = 36 * (Gqa(h, 64, 8, 64) + 3 * h * 2880 * 4 + h * 128) + h * 201088;
  hand.score_flops = 3.0 * 64 * 128;
  hand.full_layers = 18;
  hand.sliding_layers = 18;
  hand.window = 128;
  ExpectMatches(CostOf(gpt, {{"model_type", "gpt_oss"}, {"layer_types", types + "]"}}), hand);
  ExpectMatches(CostOf(gpt, {{"model_type", "gpt_oss"}}), hand);  // the class's default types
  EXPECT_NEAR(PlannedFlops(gpt, {{"model_type", "gpt_oss"}}, 4000) / hand.Sequence(4000), 1.0,
              1e-6);
}

TEST(ModelAttentionCost, Qwen2MoeSharedExpert) {
  const Ints qwen = {{"hidden_size", 2048},           {"intermediate_size", 5632},
                     {"moe_intermediate_size", 1408}, {"shared_expert_intermediate_size", 5632},
                     {"num_attention_heads", 16},     {"num_key_value_heads", 16},
                     {"num_hidden_layers", 24},       {"num_experts", 60},
                     {"num_experts_per_tok", 4},      {"vocab_size", 151936}};
  const double h = 2048;
  HandCount hand;
  // The shared expert's MLP and its one-output sigmoid gate beside the routed ones.
  hand.params =
      24 * (Gqa(h, 16, 16, 128) + 3 * h * 1408 * 4 + h * 60 + 3 * h * 5632 + h) + h * 151936;
  hand.score_flops = 3.0 * 16 * 256;
  hand.full_layers = 24;
  ExpectMatches(CostOf(qwen, {{"model_type", "qwen2_moe"}}), hand);
}

// Qwen3-Next's linear-attention layers are recurrent: no scores, whatever the sequence's length.
TEST(ModelAttentionCost, LinearAttentionLayersHaveNoScores) {
  const Ints dense = {{"hidden_size", 2048},       {"intermediate_size", 5120},
                      {"num_attention_heads", 16}, {"num_key_value_heads", 2},
                      {"head_dim", 256},           {"num_hidden_layers", 8},
                      {"vocab_size", 151936}};
  std::string types = "[";
  for (int i = 0; i < 8; ++i) {
    types +=
        std::string(i ? ", " : "") + ((i + 1) % 4 ? "\"linear_attention\"" : "\"full_attention\"");
  }
  const ModelCost c = CostOf(dense, {{"model_type", "qwen3_next"}, {"layer_types", types + "]"}});
  EXPECT_NEAR(c.quadratic * std::ldexp(1.0, c.shift), 2 * 3.0 * 16 * (256 + 256),
              std::ldexp(1.0, c.shift));
  EXPECT_EQ(c.windowed, 0);
  EXPECT_EQ(c.chunked, 0);
}

TEST(ModelAttentionCost, RejectsBadLayerFields) {
  const Ints base = {{"hidden_size", 2048},
                     {"num_hidden_layers", 4},
                     {"num_attention_heads", 16},
                     {"intermediate_size", 5504},
                     {"vocab_size", 1000}};
  struct Case {
    Ints extra;
    Strings strings;
    std::string named;
  };
  const std::vector<Case> cases = {
      {{}, {{"layer_types", "[\"full_attention\"]"}}, "layer_types"},
      {{}, {{"layer_types", "[1, 2, 3, 4]"}}, "layer_types[0]"},
      {{}, {{"model_type", "llama4_text"}, {"no_rope_layers", "[1, 1]"}}, "no_rope_layers"},
      {{},
       {{"model_type", "llama4_text"}, {"no_rope_layers", "[1, 1, 2, 0]"}},
       "no_rope_layers[2]"},
      {{{"sliding_window", 0}}, {{"model_type", "mistral"}}, "sliding_window = 0"},
      {{}, {{"model_type", "mistral"}, {"sliding_window", "4096.5"}}, "sliding_window"},
      {{{"sliding_window_pattern", 0}}, {{"model_type", "gemma3_text"}}, "sliding_window_pattern"},
      {{}, {{"model_type", "qwen3_moe"}, {"use_sliding_window", "2"}}, "use_sliding_window"},
  };
  for (const Case& c : cases) {
    Ints ints = base;
    for (const auto& [key, value] : c.extra) ints[key] = value;
    const absl::StatusOr<ModelConfig> m = ModelConfigFromFields(ints, c.strings);
    ASSERT_FALSE(m.ok()) << c.named;
    EXPECT_NE(m.status().message().find(c.named), std::string::npos) << m.status();
  }
}

}  // namespace
}  // namespace packsched::planner
