#ifndef PACKSCHED_SERVER_PLANNER_MODEL_COST_H_
#define PACKSCHED_SERVER_PLANNER_MODEL_COST_H_

// The attention cost model's weights from a model description (docs/design.md §2,
// "Cost from the model"): forward + backward FLOPs of one sequence of L tokens are
//   linear * L + quadratic * L^2, plus micro_batch per micro-batch,
// with (2 FLOPs a multiply-add, backward = 2 x forward, so 3 x the forward in all)
//   linear    = 6 x (active parameters a token passes through: per layer the attention
//               projections and the MLP or the routed + shared experts it uses, plus the LM head)
//   quadratic = 3 x layers x heads x (qk head dim + v head dim)   (causal: L^2 / 2 scores,
//               2 FLOPs each, for QK^T and for AV), over the layers that see the whole sequence;
//   windowed, chunked = the same over the sliding-window layers and over the chunked layers, with
//               their window and chunk (AttentionCost's Scores and Chunks, options.h: a token
//               there sees min(p + 1, window) keys, or those of its own chunk of `chunk` tokens)
//   micro_batch = linear x overhead_tokens (a fixed per-micro-batch cost worth that many tokens:
//               FSDP's parameter gather, launch overheads; 2,048 by default)
// then scaled down by one power of two so that each weight is at most kMaxAttentionWeight and
// `max_batch_tokens` tokens (in sequences of at most `longest` tokens, one micro-batch each) cost
// at most 2^62 in all. The ratios, which are all balancing uses, survive the scaling.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/forest.h"
#include "server/planner/options.h"

namespace packsched::planner {

struct ModelConfig {
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0 = num_heads (GQA / MQA when fewer)
  int64_t head_dim = 0;      // 0 = hidden_size / num_heads
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  bool gated_mlp = true;  // SwiGLU-style: three matrices, else two
  // Mixture of experts: experts a token uses (0 = dense), their MLP size, shared experts, and
  // the first layers that stay dense.
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_experts = 0;
  int64_t num_experts = 0;  // the router's width
  // Which layers use the experts, by Hugging Face's rules together: layer i (from 0) does when
  // i >= first_dense_layers (DeepSeek's first_k_dense_replace), i % moe_layer_freq == 0
  // (DeepSeek's moe_layer_freq), (i + 1) % moe_layer_step == 0 (Qwen-MoE's
  // decoder_sparse_step, Llama 4's interleave_moe_layer_step), i is not in mlp_only_layers
  // (Qwen-MoE's) and, when moe_layers_listed, i is in moe_layers (Llama 4's); the others are
  // dense, of dense_intermediate_size (Llama 4's intermediate_size_mlp; 0 = intermediate_size).
  int64_t first_dense_layers = 0;
  int64_t moe_layer_freq = 1;
  int64_t moe_layer_step = 1;
  std::vector<int64_t> mlp_only_layers;
  std::vector<int64_t> moe_layers;
  bool moe_layers_listed = false;
  int64_t dense_intermediate_size = 0;
  // Multi-head latent attention (kv_lora_rank > 0): ranks and head dims.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // The shared experts' MLP size in all (Qwen-MoE's shared_expert_intermediate_size); 0 =
  // shared_experts x moe_intermediate_size (DeepSeek's n_shared_experts, Llama 4's one).
  int64_t shared_intermediate_size = 0;
  // What each layer's attention sees (ModelConfigFromFields reads it as transformers builds it):
  // empty = every layer the whole sequence. A sliding layer sees `sliding_window` keys back
  // (itself included), a chunked one its chunk of `attention_chunk` tokens; with that size 0 the
  // layer sees the whole sequence. A recurrent layer (linear attention) has no scores: its cost
  // grows linearly with the sequence.
  enum class Attention { kFull, kSliding, kChunked, kRecurrent };
  std::vector<Attention> layer_attention;
  int64_t sliding_window = 0;
  int64_t attention_chunk = 0;
};

struct ModelCost {
  int64_t linear = 0;
  int64_t quadratic = 0;
  int64_t micro_batch = 0;
  int shift = 0;  // the FLOPs are these x 2^shift
  // The sliding-window and chunked layers' weights and sizes (AttentionCost, options.h); 0 when
  // the model has none.
  int64_t windowed = 0;
  int64_t window = 0;
  int64_t chunked = 0;
  int64_t chunk = 0;
};

// A ModelConfig from the top-level fields of a Hugging Face config.json: its integers
// (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// intermediate_size, vocab_size, num_experts_per_tok, moe_intermediate_size, n_shared_experts /
// shared_expert_intermediate_size, n_routed_experts / num_experts / num_local_experts,
// first_k_dense_replace, moe_layer_freq, decoder_sparse_step / interleave_moe_layer_step,
// intermediate_size_mlp, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
// v_head_dim) and its strings (model_type: gpt2, gpt_neox, opt, bloom, falcon, phi and
// starcoder2 have an ungated MLP; mlp_only_layers and moe_layers: JSON lists of layer indices,
// as their text). InvalidArgument naming the field for: a missing or non-positive
// required field (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
// vocab_size); an integer field that came as a string (a non-whole or too large number, which
// the readers, `packsched plan --model_config` and the Python client, pass on as its text); a
// negative one; and a model that does
// not hold together: num_experts_per_tok above the router's width (or with none),
// num_key_value_heads above num_attention_heads or not dividing it, hidden_size not a multiple
// of num_attention_heads without head_dim, first_k_dense_replace above num_hidden_layers,
// moe_layer_freq or decoder_sparse_step below 1, mlp_only_layers or moe_layers not a list of
// layer indices, or kv_lora_rank > 0 (MLA) with qk_nope_head_dim + qk_rope_head_dim or
// v_head_dim 0.
//
// Shared experts: n_shared_experts (DeepSeek) of moe_intermediate_size each,
// shared_expert_intermediate_size (Qwen2-MoE: one MLP of that size, plus its one-output gate),
// and for model_type llama4 / llama4_text one of intermediate_size on every MoE layer (no field
// names it: transformers' Llama4TextMoe always builds it).
//
// Attention per layer, as transformers' config classes derive it: a `layer_types` list
// ("sliding_attention", "chunked_attention", "linear_attention": Qwen3-Next's recurrent layers,
// no scores; any other type sees the whole sequence) of
// num_hidden_layers entries wins, except for mistral / mixtral (whose classes ignore it: every
// layer is sliding). Without it, by model_type: llama4 / llama4_text chunked where
// no_rope_layers is 1 (default: every layer but each no_rope_layer_interval-th, 4), gemma2 and
// gpt_oss sliding on even layers (i % 2 == 0), gemma3 / gemma3_text sliding except each
// sliding_window_pattern-th (6), qwen3_moe every layer and qwen2 / qwen3 the layers from
// max_window_layers (28) on when use_sliding_window is true, qwen2_moe the even layers below
// max_window_layers when it is. The window is sliding_window (transformers' default where the
// field is missing: 4,096; gpt_oss 128; mixtral none), the chunk attention_chunk_size (8,192);
// null means none (the layers then see the whole sequence). JSON null, true and false come as
// the strings "null", "true", "false" (an integer field that is "null" counts as missing).
// InvalidArgument naming the field for a layer_types or no_rope_layers list of the wrong length
// or kind, a window, chunk or pattern below 1, and use_sliding_window not a bool.
absl::StatusOr<ModelConfig> ModelConfigFromFields(
    const absl::flat_hash_map<std::string, int64_t>& ints,
    const absl::flat_hash_map<std::string, std::string>& strings);

// The weights for `config` (see the top of this file). InvalidArgument for a field out of range
// (negative, or sizes whose FLOPs pass 2^100; moe_layer_freq or moe_layer_step below 1;
// mlp_only_layers unsorted), max_batch_tokens < 1, longest < 1 or overhead_tokens < 0.
absl::StatusOr<ModelCost> CostOfModel(const ModelConfig& config, int64_t max_batch_tokens,
                                      int64_t longest, int64_t overhead_tokens = 2048);

// CostOfModel for a batch of `lengths` (each rounded up to align_to; InvalidArgument for a
// length < 1 or align_to < 1): the largest batch is this one. What `packsched plan
// --model_config` and packsched.planner.balance(model_config=) use.
absl::StatusOr<ModelCost> CostOfModelForBatch(const ModelConfig& config,
                                              absl::Span<const int64_t> lengths, int64_t align_to,
                                              int64_t overhead_tokens = 2048);

// CostOfModel for a forest of rollouts (tree packing, tree_plan.h): the batch is the forest's
// rollouts flat, each aligned to align_to, in sequences of at most
//   min(its largest tree's tokens, aligned; its longest aligned rollout + 2 x (align_to - 1)).
// A piece forwards at most its rollouts' aligned tokens, is no longer than its tree, and its
// attention term (tree_plan.h) is at most the sum of its rollouts' squared lengths plus its
// padding's, below 2 x (align_to - 1) x its aligned tokens: so the pieces' costs stay within the
// bound (2^62) however the cap cuts the trees. With align_to = 1, and for a forest of chains (one
// rollout per tree) at any align_to, the weights are CostOfModelForBatch's over the rollouts'
// lengths: a forest costs what its rollouts cost flat. InvalidArgument for align_to out of
// [1, kMaxAlign] and as IndexForest (forest.h) for a bad forest.
absl::StatusOr<ModelCost> CostOfModelForForest(const ModelConfig& config, const Forest& forest,
                                               int64_t align_to, int64_t overhead_tokens = 2048);

// The cost from the model for this batch, as every entry point uses it (`packsched plan
// --model_config`, packsched.planner.balance(model_config=), BalanceBatch's model_config): the
// ModelConfig of a config.json's top-level integer and string fields (ModelConfigFromFields),
// costed over `lengths` aligned as `options` aligns them (CostOfModelForBatch with the default
// overhead). Sets `options` to the attention cost model with the model's weights, whatever it
// had, and returns the per-micro-batch cost (BalanceOptions::micro_batch_cost). InvalidArgument
// as those two say.
absl::StatusOr<int64_t> UseModelCost(const absl::flat_hash_map<std::string, int64_t>& ints,
                                     const absl::flat_hash_map<std::string, std::string>& strings,
                                     absl::Span<const int64_t> lengths, PlanOptions& options);

// UseModelCost for a forest (tree packing): the model costed over `forest` as
// CostOfModelForForest says, aligned as `options` aligns it. What BalanceBatch's model_config,
// `packsched plan --tree --model_config` and packsched.planner.balance(forest, model_config=)
// use. InvalidArgument as ModelConfigFromFields and CostOfModelForForest say.
absl::StatusOr<int64_t> UseModelCost(const absl::flat_hash_map<std::string, int64_t>& ints,
                                     const absl::flat_hash_map<std::string, std::string>& strings,
                                     const Forest& forest, PlanOptions& options);

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_MODEL_COST_H_
