// The attention cost's weights from a model: checked against FLOPs counted here in float64
// from the formula's parts (docs/design.md §2, "Cost from the model").

#include "server/planner/model_cost.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"

namespace packsched::planner {
namespace {

ModelConfig Llama7b() {
  ModelConfig m;
  m.hidden_size = 4096;
  m.num_layers = 32;
  m.num_heads = 32;
  m.intermediate_size = 11008;
  m.vocab_size = 32000;
  return m;
}

// Forward + backward FLOPs of a dense (optionally GQA) decoder, counted matrix by matrix.
double DenseLinearFlops(double h, double layers, double heads, double kv, double d, double inter,
                        double vocab, bool gated) {
  const double q = h * heads * d, k = h * kv * d, v = h * kv * d, o = heads * d * h;
  const double mlp = (gated ? 3 : 2) * h * inter;
  return 3 * 2 * (layers * (q + k + v + o + mlp) + h * vocab);
}

TEST(ModelCost, DenseMatchesTheFlopCount) {
  const ModelConfig m = Llama7b();
  const absl::StatusOr<ModelCost> c = CostOfModel(m, 1'000'000, 65536);
  ASSERT_TRUE(c.ok()) << c.status();
  const double scale = std::ldexp(1.0, c->shift);
  const double linear = DenseLinearFlops(4096, 32, 32, 32, 128, 11008, 32000, true);
  // Causal attention: L^2 / 2 query-key pairs, QK^T and AV at 2 FLOPs a pair and head dim, x 3.
  const double quadratic = 3 * 32 * 32 * (128 + 128);
  EXPECT_NEAR(c->linear * scale, linear, scale);
  EXPECT_NEAR(c->quadratic * scale, quadratic, scale);
  EXPECT_EQ(c->micro_batch, c->linear * 2048);
  EXPECT_LE(c->linear, kMaxAttentionWeight);
  // The whole batch fits: 1e6 tokens in sequences of 65,536.
  const double batch = (c->linear + c->micro_batch) * 1e6 + c->quadratic * 1e6 * 65536.0;
  EXPECT_LE(batch, std::ldexp(1.0, 62));
  // A larger batch needs a coarser scale.
  const absl::StatusOr<ModelCost> big = CostOfModel(m, int64_t{1} << 40, 1 << 20);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GT(big->shift, c->shift);
}

TEST(ModelCost, GqaAndUngatedAndMoeAndMla) {
  ModelConfig gqa = Llama7b();
  gqa.num_kv_heads = 8;
  const ModelCost dense = *CostOfModel(Llama7b(), 1'000'000, 65536);
  const ModelCost fewer = *CostOfModel(gqa, 1'000'000, 65536);
  const double expected = DenseLinearFlops(4096, 32, 32, 8, 128, 11008, 32000, true);
  EXPECT_NEAR(fewer.linear * std::ldexp(1.0, fewer.shift), expected, std::ldexp(1.0, fewer.shift));
  // The scores do not shrink with KV heads.
  EXPECT_EQ(std::ldexp(double(fewer.quadratic), fewer.shift),
            std::ldexp(double(dense.quadratic), dense.shift));

  ModelConfig ungated = Llama7b();
  ungated.gated_mlp = false;
  const ModelCost two = *CostOfModel(ungated, 1'000'000, 65536);
  EXPECT_NEAR(two.linear * std::ldexp(1.0, two.shift),
              DenseLinearFlops(4096, 32, 32, 32, 128, 11008, 32000, false),
              std::ldexp(1.0, two.shift));

  // MoE: 2 of 8 experts of size 14336 and a 8-way router, every layer (Mixtral-like).
  ModelConfig moe = Llama7b();
  moe.num_kv_heads = 8;
  moe.intermediate_size = 14336;
  moe.moe_intermediate_size = 14336;
  moe.experts_per_token = 2;
  moe.num_experts = 8;
  const ModelCost mix = *CostOfModel(moe, 1'000'000, 65536);
  const double attention = 4096.0 * 32 * 128 * 2 + 4096.0 * 8 * 128 * 2;
  const double experts = 3.0 * 4096 * 14336 * 2 + 4096.0 * 8;
  const double moe_flops = 6 * (32 * (attention + experts) + 4096.0 * 32000);
  EXPECT_NEAR(mix.linear * std::ldexp(1.0, mix.shift), moe_flops, std::ldexp(1.0, mix.shift));

  // MLA (DeepSeek-V2-Lite-like dims): scores over qk = nope + rope and v head dims.
  ModelConfig mla = Llama7b();
  mla.kv_lora_rank = 512;
  mla.qk_nope_head_dim = 128;
  mla.qk_rope_head_dim = 64;
  mla.v_head_dim = 128;
  const ModelCost latent = *CostOfModel(mla, 1'000'000, 65536);
  EXPECT_NEAR(latent.quadratic * std::ldexp(1.0, latent.shift), 3.0 * 32 * 32 * (192 + 128),
              std::ldexp(1.0, latent.shift));
  const double q = 4096.0 * 32 * 192;
  const double kv = 4096.0 * (512 + 64) + 512.0 * 32 * (128 + 128);
  const double o = 32.0 * 128 * 4096;
  const double mla_flops = 6 * (32 * (q + kv + o + 3.0 * 4096 * 11008) + 4096.0 * 32000);
  EXPECT_NEAR(latent.linear * std::ldexp(1.0, latent.shift), mla_flops,
              std::ldexp(1.0, latent.shift));
}

TEST(ModelCost, FieldsOfAConfigJson) {
  absl::flat_hash_map<std::string, int64_t> ints = {
      {"hidden_size", 2048},       {"num_hidden_layers", 24},   {"num_attention_heads", 16},
      {"num_key_value_heads", 16}, {"intermediate_size", 5504}, {"vocab_size", 151936}};
  absl::flat_hash_map<std::string, std::string> strings = {{"model_type", "qwen2"}};
  absl::StatusOr<ModelConfig> m = ModelConfigFromFields(ints, strings);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_layers, 24);
  EXPECT_TRUE(m->gated_mlp);
  strings["model_type"] = "gpt_neox";
  EXPECT_FALSE(ModelConfigFromFields(ints, strings)->gated_mlp);
  ints.erase("vocab_size");
  m = ModelConfigFromFields(ints, strings);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("vocab_size is missing"), std::string::npos);
  ints["vocab_size"] = -3;
  EXPECT_FALSE(ModelConfigFromFields(ints, strings).ok());
}

using Ints = absl::flat_hash_map<std::string, int64_t>;
using Strings = absl::flat_hash_map<std::string, std::string>;

Ints SmallDense() {
  return {{"hidden_size", 2048},
          {"num_hidden_layers", 24},
          {"num_attention_heads", 16},
          {"intermediate_size", 5504},
          {"vocab_size", 151936}};
}

// The message of ModelConfigFromFields' error ("" when it accepts the fields).
std::string ErrorOf(const Ints& ints, const Strings& strings = {}) {
  const absl::StatusOr<ModelConfig> m = ModelConfigFromFields(ints, strings);
  if (m.ok()) return "";
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(m.status().message());
}

TEST(ModelCost, RejectsModelsThatDoNotHoldTogether) {
  ASSERT_EQ(ErrorOf(SmallDense()), "");
  struct Case {
    Ints extra;
    Strings strings;
    std::vector<std::string> named;  // what the message must name
  };
  const std::vector<Case> cases = {
      {{{"num_experts_per_tok", 8}}, {}, {"num_experts_per_tok = 8", "n_routed_experts"}},
      {{{"num_experts_per_tok", 8}, {"num_experts", 0}},
       {},
       {"num_experts_per_tok", "num_experts = 0"}},
      {{{"num_experts_per_tok", 8}, {"num_local_experts", 4}},
       {},
       {"num_experts_per_tok = 8", "num_local_experts = 4"}},
      {{{"num_key_value_heads", 32}}, {}, {"num_key_value_heads = 32", "num_attention_heads = 16"}},
      {{{"num_key_value_heads", 6}}, {}, {"num_key_value_heads = 6", "num_attention_heads"}},
      {{{"num_attention_heads", 15}}, {}, {"hidden_size = 2048", "num_attention_heads = 15"}},
      {{{"first_k_dense_replace", 25}},
       {},
       {"first_k_dense_replace = 25", "num_hidden_layers = 24"}},
      {{{"kv_lora_rank", 512}}, {}, {"kv_lora_rank", "qk_nope_head_dim", "v_head_dim"}},
      {{{"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}},
       {},
       {"v_head_dim"}},
      {{{"decoder_sparse_step", 0}}, {}, {"decoder_sparse_step = 0"}},
      {{{"moe_layer_freq", 0}}, {}, {"moe_layer_freq = 0"}},
      {{{"head_dim", -128}}, {}, {"head_dim = -128"}},
      {{}, {{"mlp_only_layers", "[3, 24]"}}, {"mlp_only_layers", "num_hidden_layers = 24"}},
      {{}, {{"mlp_only_layers", "[1.5]"}}, {"mlp_only_layers"}},
      {{}, {{"mlp_only_layers", "3"}}, {"mlp_only_layers"}},
      // Non-integers where an integer is read reach the planner as their text.
      {{}, {{"num_key_value_heads", "8.5"}}, {"num_key_value_heads = 8.5", "integer"}},
      {{}, {{"hidden_size", "4096"}}, {"hidden_size = 4096", "integer"}},
      {{}, {{"num_experts_per_tok", "1e30"}}, {"num_experts_per_tok"}},
  };
  for (const Case& c : cases) {
    Ints ints = SmallDense();
    for (const auto& [key, value] : c.extra) ints[key] = value;
    const std::string error = ErrorOf(ints, c.strings);
    for (const std::string& name : c.named) {
      EXPECT_NE(error.find(name), std::string::npos) << "want " << name << " in: " << error;
    }
  }
  // Consistent ones pass: GQA, a MoE with its router, MLA with its dims, DeepSeek-like spacing.
  Ints fine = SmallDense();
  fine.insert({{"num_key_value_heads", 4},
               {"num_experts_per_tok", 8},
               {"num_experts", 64},
               {"first_k_dense_replace", 24},
               {"kv_lora_rank", 512},
               {"qk_nope_head_dim", 128},
               {"qk_rope_head_dim", 64},
               {"v_head_dim", 128},
               {"moe_layer_freq", 2},
               {"decoder_sparse_step", 1}});
  EXPECT_EQ(ErrorOf(fine, {{"mlp_only_layers", " [ 0 ,3 ] "}, {"rope_theta", "1e6"}}), "");
}

// Layers whose MLP is dense and layers that use the experts alternate: Qwen-MoE's
// decoder_sparse_step and mlp_only_layers, DeepSeek's moe_layer_freq. Each is costed as the
// matching count of dense and MoE layers of an otherwise equal model.
TEST(ModelCost, DenseAndMoeLayersAlternate) {
  Ints base = SmallDense();
  base.insert({{"num_experts_per_tok", 4}, {"num_experts", 60}, {"moe_intermediate_size", 1408}});
  auto linear_of = [](const Ints& ints, const Strings& strings = {}) {
    const absl::StatusOr<ModelConfig> m = ModelConfigFromFields(ints, strings);
    EXPECT_TRUE(m.ok()) << m.status();
    const absl::StatusOr<ModelCost> c = CostOfModel(*m, 1'000'000, 65536);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::ldexp(double(c->linear), c->shift);
  };
  // Per layer, in FLOPs: attention, the dense MLP and the MoE MLP (4 experts + the router).
  const double h = 2048, attention = 4 * h * h;
  const double dense = 3 * h * 5504, moe = 3 * h * 1408 * 4 + h * 60, head = h * 151936;
  auto expected = [&](double moe_layers) {
    return 6 * (24 * attention + (24 - moe_layers) * dense + moe_layers * moe + head);
  };
  const double scale = linear_of(base) / expected(24);
  EXPECT_NEAR(scale, 1.0, 1e-6);
  Ints every_second = base;
  every_second["decoder_sparse_step"] = 2;  // layers 1, 3, ..., 23
  EXPECT_NEAR(linear_of(every_second) / expected(12), 1.0, 1e-6);
  EXPECT_NEAR(linear_of(base, {{"mlp_only_layers", "[0, 5, 23]"}}) / expected(21), 1.0, 1e-6);
  // Both: odd layers, less 5 and 23.
  EXPECT_NEAR(linear_of(every_second, {{"mlp_only_layers", "[0, 5, 23]"}}) / expected(10), 1.0,
              1e-6);
  Ints deepseek = base;
  deepseek["first_k_dense_replace"] = 3;
  deepseek["moe_layer_freq"] = 2;  // layers 4, 6, ..., 22
  EXPECT_NEAR(linear_of(deepseek) / expected(10), 1.0, 1e-6);
  deepseek["moe_layer_freq"] = 1;
  EXPECT_NEAR(linear_of(deepseek) / expected(21), 1.0, 1e-6);
  // Llama 4: interleave_moe_layer_step as Qwen's step, or an explicit moe_layers list.
  Ints llama4 = base;
  llama4["interleave_moe_layer_step"] = 2;
  EXPECT_NEAR(linear_of(llama4) / expected(12), 1.0, 1e-6);
  EXPECT_NEAR(linear_of(base, {{"moe_layers", "[1, 2, 3]"}}) / expected(3), 1.0, 1e-6);
  // Its dense layers' MLP: intermediate_size_mlp (the experts keep moe_intermediate_size).
  Ints wide = llama4;
  wide["intermediate_size_mlp"] = 2 * 5504;
  EXPECT_NEAR(linear_of(wide) / (expected(12) + 6 * 12 * dense), 1.0, 1e-6);
  EXPECT_NE(ErrorOf(base, {{"moe_layers", "[24]"}}).find("moe_layers"), std::string::npos);
}

TEST(ModelCost, RejectsOutOfRange) {
  ModelConfig m = Llama7b();
  EXPECT_FALSE(CostOfModel(m, 0, 10).ok());
  EXPECT_FALSE(CostOfModel(m, 10, 10, -1).ok());
  m.hidden_size = int64_t{1} << 30;
  EXPECT_FALSE(CostOfModel(m, 10, 10).ok());
}

}  // namespace
}  // namespace packsched::planner
