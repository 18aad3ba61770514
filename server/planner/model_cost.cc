#include "server/planner/model_cost.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/base/status_macros.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"

namespace packsched::planner {
namespace {

using U128 = unsigned __int128;
constexpr U128 kSaturated = ~U128{0} >> 1;
constexpr int64_t kMaxField = int64_t{1} << 24;
constexpr int64_t kMaxOverheadTokens = int64_t{1} << 18;

// Saturating products and sums: a FLOP count too large to matter stays too large.
U128 Mul(U128 a, U128 b) { return a != 0 && b > kSaturated / a ? kSaturated : a * b; }
U128 Mul(std::initializer_list<U128> factors) {
  U128 out = 1;
  for (U128 f : factors) out = Mul(out, f);
  return out;
}
U128 Add(U128 a, U128 b) { return a + b > kSaturated ? kSaturated : a + b; }

int64_t Get(const absl::flat_hash_map<std::string, int64_t>& ints, const std::string& key,
            int64_t fallback = 0) {
  auto it = ints.find(key);
  return it == ints.end() ? fallback : it->second;
}

// x / 2^shift, rounded to nearest; at least 1 when x > 0.
U128 Scaled(U128 x, int shift) {
  if (shift == 0) return x;
  const U128 out = (x + (U128{1} << (shift - 1))) >> shift;
  return out == 0 && x > 0 ? 1 : out;
}

// A list of layers (mlp_only_layers, moe_layers) as its JSON text: "[]" or "[i, j, ...]", each in
// [0, layers), sorted and without repeats.
absl::StatusOr<std::vector<int64_t>> LayerList(absl::string_view field, absl::string_view text,
                                               int64_t layers) {
  auto invalid = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", field, " = ", text.substr(0, 40),
                     ": must be a list of layer indices in [0, num_hidden_layers = ", layers, ")"));
  };
  text = absl::StripAsciiWhitespace(text);
  if (!absl::ConsumePrefix(&text, "[") || !absl::ConsumeSuffix(&text, "]")) return invalid();
  std::vector<int64_t> out;
  if (absl::StripAsciiWhitespace(text).empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t layer = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &layer) || layer < 0 ||
        layer >= layers) {
      return invalid();
    }
    out.push_back(layer);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The items of a JSON list's text "[a, b, ...]", stripped; nullopt when it is not a list.
std::optional<std::vector<absl::string_view>> ListItems(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (!absl::ConsumePrefix(&text, "[") || !absl::ConsumeSuffix(&text, "]")) return std::nullopt;
  std::vector<absl::string_view> out;
  if (absl::StripAsciiWhitespace(text).empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    out.push_back(absl::StripAsciiWhitespace(part));
  }
  return out;
}

using Attention = ModelConfig::Attention;

// Every layer `kind` where `pick(i)` holds, else full.
template <typename Pick>
std::vector<Attention> LayersWhere(int64_t layers, Attention kind, Pick pick) {
  std::vector<Attention> out(layers, Attention::kFull);
  for (int64_t i = 0; i < layers; ++i) {
    if (pick(i)) out[i] = kind;
  }
  return out;
}

// A field that may be an integer, missing (`fallback`) or null (0: none).
absl::StatusOr<int64_t> SizeOrNone(const absl::flat_hash_map<std::string, int64_t>& ints,
                                   const absl::flat_hash_map<std::string, std::string>& strings,
                                   const char* key, int64_t fallback) {
  if (auto it = strings.find(key); it != strings.end()) {
    if (it->second == "null") return 0;
    return absl::InvalidArgumentError(absl::StrCat("model config: ", key, " = ",
                                                   it->second.substr(0, 40),
                                                   ": must be a positive integer or null"));
  }
  auto it = ints.find(key);
  if (it == ints.end()) return fallback;
  if (it->second < 1 || it->second > kMaxLength) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", key, " = ", it->second,
                                                   ": must be in [1, ", kMaxLength, "] or null"));
  }
  return it->second;
}

// What each layer's attention sees (ModelConfigFromFields' rules), with its window and chunk.
absl::Status ReadLayerAttention(const absl::flat_hash_map<std::string, int64_t>& ints,
                                const absl::flat_hash_map<std::string, std::string>& strings,
                                ModelConfig& m) {
  auto string_of = [&](const char* key) -> std::string {
    auto it = strings.find(key);
    return it == strings.end() ? "" : it->second;
  };
  const std::string type = string_of("model_type");
  auto is = [&](std::initializer_list<const char*> types) {
    return std::any_of(types.begin(), types.end(), [&](const char* t) { return type == t; });
  };
  auto positive = [&](const char* key, int64_t fallback) -> absl::StatusOr<int64_t> {
    const int64_t value = Get(ints, key, fallback);
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", key, " = ", value, ": must be >= 1"));
    }
    return value;
  };
  const std::string use_text = string_of("use_sliding_window");
  if (!use_text.empty() && use_text != "true" && use_text != "false" && use_text != "null") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: use_sliding_window = ", use_text.substr(0, 40), ": must be true or false"));
  }
  const bool use_sliding = use_text == "true";
  const int64_t layers = m.num_layers;
  const bool mistral = is({"mistral", "mixtral"});
  if (strings.contains("layer_types") && !mistral) {
    const std::string& text = strings.at("layer_types");
    const std::optional<std::vector<absl::string_view>> items = ListItems(text);
    if (!items || static_cast<int64_t>(items->size()) != layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: layer_types = ", text.substr(0, 40),
                       ": must be a list of num_hidden_layers = ", layers, " layer types"));
    }
    m.layer_attention.assign(layers, Attention::kFull);
    for (int64_t i = 0; i < layers; ++i) {
      absl::string_view item = (*items)[i];
      if (!absl::ConsumePrefix(&item, "\"") || !absl::ConsumeSuffix(&item, "\"")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model config: layer_types[", i, "] = ", (*items)[i].substr(0, 40), ": not a string"));
      }
      if (item == "sliding_attention") m.layer_attention[i] = Attention::kSliding;
      if (item == "chunked_attention") m.layer_attention[i] = Attention::kChunked;
      if (item == "linear_attention") m.layer_attention[i] = Attention::kRecurrent;
    }
  } else if (is({"llama4", "llama4_text"})) {
    const std::string text = string_of("no_rope_layers");
    const std::optional<std::vector<absl::string_view>> items = ListItems(text);
    if (!text.empty() && text != "null" &&
        (!items || (!items->empty() && static_cast<int64_t>(items->size()) != layers))) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: no_rope_layers = ", text.substr(0, 40),
                       ": must be a list of num_hidden_layers = ", layers, " flags (0 or 1)"));
    }
    if (items && !items->empty()) {
      m.layer_attention.assign(layers, Attention::kFull);
      for (int64_t i = 0; i < layers; ++i) {
        int64_t flag = 0;
        if (!absl::SimpleAtoi((*items)[i], &flag) || (flag != 0 && flag != 1)) {
          return absl::InvalidArgumentError(absl::StrCat("model config: no_rope_layers[", i,
                                                         "] = ", (*items)[i].substr(0, 40),
                                                         ": must be 0 or 1"));
        }
        if (flag == 1) m.layer_attention[i] = Attention::kChunked;
      }
    } else {
      ASSIGN_OR_RETURN(const int64_t interval, positive("no_rope_layer_interval", 4));
      m.layer_attention =
          LayersWhere(layers, Attention::kChunked, [&](int64_t i) { return (i + 1) % interval; });
    }
  } else if (is({"gemma2", "gpt_oss"})) {
    m.layer_attention =
        LayersWhere(layers, Attention::kSliding, [](int64_t i) { return i % 2 == 0; });
  } else if (is({"gemma3", "gemma3_text"})) {
    ASSIGN_OR_RETURN(const int64_t pattern, positive("sliding_window_pattern", 6));
    m.layer_attention =
        LayersWhere(layers, Attention::kSliding, [&](int64_t i) { return (i + 1) % pattern; });
  } else if (mistral) {
    m.layer_attention = LayersWhere(layers, Attention::kSliding, [](int64_t) { return true; });
  } else if (use_sliding && is({"qwen3_moe"})) {
    m.layer_attention = LayersWhere(layers, Attention::kSliding, [](int64_t) { return true; });
  } else if (use_sliding && is({"qwen2", "qwen3", "qwen2_moe"})) {
    ASSIGN_OR_RETURN(const int64_t below, positive("max_window_layers", 28));
    const bool moe = type == "qwen2_moe";
    m.layer_attention = LayersWhere(layers, Attention::kSliding, [&](int64_t i) {
      return moe ? i % 2 == 0 && i < below : i >= below;
    });
  }
  // transformers' defaults where the field is missing.
  const int64_t window = type == "gpt_oss" ? 128 : type == "mixtral" ? 0 : 4096;
  ASSIGN_OR_RETURN(m.sliding_window, SizeOrNone(ints, strings, "sliding_window", window));
  ASSIGN_OR_RETURN(m.attention_chunk, SizeOrNone(ints, strings, "attention_chunk_size", 8192));
  // The Qwen classes window only with use_sliding_window.
  if (is({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe"}) && !use_sliding) m.sliding_window = 0;
  return absl::OkStatus();
}

// The layers that use the experts (ModelConfig's rules). REQUIRES: moe_layer_freq and
// moe_layer_step >= 1, mlp_only_layers and moe_layers sorted.
int64_t MoeLayers(const ModelConfig& m) {
  int64_t out = 0;
  for (int64_t i = std::max<int64_t>(m.first_dense_layers, 0); i < m.num_layers; ++i) {
    if (i % m.moe_layer_freq == 0 && (i + 1) % m.moe_layer_step == 0 &&
        !std::binary_search(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), i) &&
        (!m.moe_layers_listed || std::binary_search(m.moe_layers.begin(), m.moe_layers.end(), i))) {
      ++out;
    }
  }
  return out;
}

// Sets `options` to the attention cost model with `cost`'s weights; returns its per-micro-batch
// cost.
int64_t Use(const ModelCost& cost, PlanOptions& options) {
  options.cost = CostModel::kAttention;
  options.attention = AttentionCost{cost.linear, cost.quadratic, cost.windowed,
                                    cost.window, cost.chunked,   cost.chunk};
  return cost.micro_batch;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromFields(
    const absl::flat_hash_map<std::string, int64_t>& ints,
    const absl::flat_hash_map<std::string, std::string>& strings) {
  // Every integer field read: none may come as a string, or be negative.
  for (const char* key : {"hidden_size",
                          "num_hidden_layers",
                          "num_attention_heads",
                          "num_key_value_heads",
                          "head_dim",
                          "intermediate_size",
                          "vocab_size",
                          "num_experts_per_tok",
                          "moe_intermediate_size",
                          "n_shared_experts",
                          "shared_expert_intermediate_size",
                          "n_routed_experts",
                          "num_experts",
                          "num_local_experts",
                          "first_k_dense_replace",
                          "moe_layer_freq",
                          "decoder_sparse_step",
                          "interleave_moe_layer_step",
                          "intermediate_size_mlp",
                          "q_lora_rank",
                          "kv_lora_rank",
                          "qk_nope_head_dim",
                          "qk_rope_head_dim",
                          "v_head_dim"}) {
    if (auto it = strings.find(key); it != strings.end() && it->second != "null") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", key, " = ", it->second.substr(0, 40), ": must be an integer (int64)"));
    }
    if (auto it = ints.find(key); it != ints.end() && it->second < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", key, " = ", it->second, ": must be >= 0"));
    }
  }
  ModelConfig m;
  for (const auto& [key, member] : {std::pair<const char*, int64_t*>{"hidden_size", &m.hidden_size},
                                    {"num_hidden_layers", &m.num_layers},
                                    {"num_attention_heads", &m.num_heads},
                                    {"intermediate_size", &m.intermediate_size},
                                    {"vocab_size", &m.vocab_size}}) {
    *member = Get(ints, key);
    if (*member < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", key, ints.contains(key) ? absl::StrCat(" = ", *member) : " is missing",
          ": must be a positive integer"));
    }
  }
  m.num_kv_heads = Get(ints, "num_key_value_heads");
  m.head_dim = Get(ints, "head_dim");
  m.experts_per_token = Get(ints, "num_experts_per_tok");
  m.moe_intermediate_size = Get(ints, "moe_intermediate_size", m.intermediate_size);
  m.shared_experts = Get(ints, "n_shared_experts");
  m.shared_intermediate_size = Get(ints, "shared_expert_intermediate_size");
  const char* width = "n_routed_experts";
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts"}) {
    if (ints.contains(key)) {
      width = key;
      break;
    }
  }
  m.num_experts = Get(ints, width);
  m.first_dense_layers = Get(ints, "first_k_dense_replace");
  m.moe_layer_freq = Get(ints, "moe_layer_freq", 1);
  m.moe_layer_step = Get(ints, "decoder_sparse_step", Get(ints, "interleave_moe_layer_step", 1));
  m.dense_intermediate_size = Get(ints, "intermediate_size_mlp");
  m.q_lora_rank = Get(ints, "q_lora_rank");
  m.kv_lora_rank = Get(ints, "kv_lora_rank");
  m.qk_nope_head_dim = Get(ints, "qk_nope_head_dim");
  m.qk_rope_head_dim = Get(ints, "qk_rope_head_dim");
  m.v_head_dim = Get(ints, "v_head_dim");
  if (auto it = strings.find("model_type"); it != strings.end()) {
    for (const char* ungated :
         {"gpt2", "gpt_neox", "opt", "bloom", "falcon", "phi", "starcoder2"}) {
      if (it->second == ungated) m.gated_mlp = false;
    }
  }
  if (auto it = strings.find("model_type");
      it != strings.end() && (it->second == "llama4" || it->second == "llama4_text")) {
    m.shared_experts = 1;
  }
  RETURN_IF_ERROR(ReadLayerAttention(ints, strings, m));
  if (auto it = strings.find("mlp_only_layers"); it != strings.end() && it->second != "null") {
    ASSIGN_OR_RETURN(m.mlp_only_layers, LayerList("mlp_only_layers", it->second, m.num_layers));
  }
  if (auto it = strings.find("moe_layers"); it != strings.end() && it->second != "null") {
    ASSIGN_OR_RETURN(m.moe_layers, LayerList("moe_layers", it->second, m.num_layers));
    m.moe_layers_listed = true;
  }

  // The model holds together.
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", parts...));
  };
  if (m.experts_per_token > 0 && m.experts_per_token > m.num_experts) {
    return invalid("num_experts_per_tok = ", m.experts_per_token, " is more than ", width,
                   ints.contains(width) ? absl::StrCat(" = ", m.num_experts) : " (missing)",
                   ": a token cannot use more experts than the router has");
  }
  if (m.num_kv_heads > 0 && (m.num_kv_heads > m.num_heads || m.num_heads % m.num_kv_heads != 0)) {
    return invalid("num_key_value_heads = ", m.num_kv_heads,
                   " must divide num_attention_heads = ", m.num_heads);
  }
  if (m.head_dim == 0 && m.kv_lora_rank == 0 && m.hidden_size % m.num_heads != 0) {
    return invalid("hidden_size = ", m.hidden_size,
                   " is not a multiple of num_attention_heads = ", m.num_heads,
                   " and head_dim is missing");
  }
  if (m.first_dense_layers > m.num_layers) {
    return invalid("first_k_dense_replace = ", m.first_dense_layers,
                   " is more than num_hidden_layers = ", m.num_layers);
  }
  if (m.moe_layer_freq < 1 || m.moe_layer_step < 1) {
    return invalid(m.moe_layer_freq < 1                   ? "moe_layer_freq = "
                   : ints.contains("decoder_sparse_step") ? "decoder_sparse_step = "
                                                          : "interleave_moe_layer_step = ",
                   std::min(m.moe_layer_freq, m.moe_layer_step), ": must be >= 1");
  }
  if (m.kv_lora_rank > 0 && (m.qk_nope_head_dim + m.qk_rope_head_dim < 1 || m.v_head_dim < 1)) {
    return invalid("kv_lora_rank = ", m.kv_lora_rank,
                   " (multi-head latent attention) needs qk_nope_head_dim + qk_rope_head_dim "
                   ">= 1 and v_head_dim >= 1; got ",
                   m.qk_nope_head_dim, " + ", m.qk_rope_head_dim, " and ", m.v_head_dim);
  }
  return m;
}

absl::StatusOr<ModelCost> CostOfModel(const ModelConfig& config, int64_t max_batch_tokens,
                                      int64_t longest, int64_t overhead_tokens) {
  const ModelConfig& m = config;
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"hidden_size", m.hidden_size},
                                    {"num_layers", m.num_layers},
                                    {"num_heads", m.num_heads},
                                    {"num_kv_heads", m.num_kv_heads},
                                    {"head_dim", m.head_dim},
                                    {"intermediate_size", m.intermediate_size},
                                    {"vocab_size", m.vocab_size},
                                    {"experts_per_token", m.experts_per_token},
                                    {"moe_intermediate_size", m.moe_intermediate_size},
                                    {"dense_intermediate_size", m.dense_intermediate_size},
                                    {"shared_experts", m.shared_experts},
                                    {"num_experts", m.num_experts},
                                    {"first_dense_layers", m.first_dense_layers},
                                    {"q_lora_rank", m.q_lora_rank},
                                    {"kv_lora_rank", m.kv_lora_rank},
                                    {"qk_nope_head_dim", m.qk_nope_head_dim},
                                    {"qk_rope_head_dim", m.qk_rope_head_dim},
                                    {"v_head_dim", m.v_head_dim},
                                    {"shared_intermediate_size", m.shared_intermediate_size}}) {
    if (value < 0 || value > kMaxField) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", name, " = ", value, ": must be in [0, ", kMaxField, "]"));
    }
  }
  if (m.moe_layer_freq < 1 || m.moe_layer_step < 1 ||
      !std::is_sorted(m.mlp_only_layers.begin(), m.mlp_only_layers.end()) ||
      !std::is_sorted(m.moe_layers.begin(), m.moe_layers.end())) {
    return absl::InvalidArgumentError(
        "model config: moe_layer_freq and moe_layer_step must be >= 1, mlp_only_layers and "
        "moe_layers sorted");
  }
  if (!m.layer_attention.empty() &&
      static_cast<int64_t>(m.layer_attention.size()) != m.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("model config: layer_attention has ",
                                                   m.layer_attention.size(),
                                                   " entries for num_layers = ", m.num_layers));
  }
  if (m.sliding_window < 0 || m.sliding_window > kMaxLength || m.attention_chunk < 0 ||
      m.attention_chunk > kMaxLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: sliding_window = ", m.sliding_window,
        " and attention_chunk = ", m.attention_chunk, ": must be in [0, ", kMaxLength, "]"));
  }
  if (m.hidden_size < 1 || m.num_layers < 1 || m.num_heads < 1) {
    return absl::InvalidArgumentError(
        "model config: hidden_size, num_layers and num_heads must be >= 1");
  }
  if (max_batch_tokens < 1 || longest < 1 || overhead_tokens < 0 ||
      overhead_tokens > kMaxOverheadTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model cost: max_batch_tokens = ", max_batch_tokens, " and longest = ", longest,
        " must be >= 1, overhead_tokens = ", overhead_tokens, " in [0, ", kMaxOverheadTokens, "]"));
  }
  const U128 h = m.hidden_size;
  const U128 heads = m.num_heads;
  const U128 kv = m.num_kv_heads > 0 ? m.num_kv_heads : m.num_heads;
  const U128 d = m.head_dim > 0 ? m.head_dim : std::max<int64_t>(1, m.hidden_size / m.num_heads);
  // Attention: parameters a token passes through, and the per-head dims of the scores.
  U128 attention = 0, qk_dim = d, v_dim = d;
  if (m.kv_lora_rank > 0) {
    const U128 nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
    const U128 v = m.v_head_dim > 0 ? m.v_head_dim : d;
    qk_dim = nope + rope;
    v_dim = v;
    const U128 q = m.q_lora_rank > 0
                       ? Add(Mul(h, m.q_lora_rank), Mul({U128(m.q_lora_rank), heads, qk_dim}))
                       : Mul({h, heads, qk_dim});
    const U128 kv_proj =
        Add(Mul(h, U128(m.kv_lora_rank) + rope), Mul({U128(m.kv_lora_rank), heads, nope + v}));
    attention = Add(Add(q, kv_proj), Mul({heads, v, h}));
  } else {
    attention = Add(Mul({U128(2), h, heads, d}), Mul({U128(2), h, kv, d}));
  }
  const U128 mats = m.gated_mlp ? 3 : 2;
  const U128 dense_mlp =
      Mul({mats, h,
           U128(m.dense_intermediate_size > 0 ? m.dense_intermediate_size : m.intermediate_size)});
  const bool moe = m.experts_per_token > 0;
  // The shared experts: one MLP of shared_intermediate_size with its one-output gate, or
  // shared_experts of the routed experts' size.
  const U128 shared_mlp =
      m.shared_intermediate_size > 0
          ? Add(Mul({mats, h, U128(m.shared_intermediate_size)}), h)
          : Mul({mats, h, U128(m.moe_intermediate_size), U128(m.shared_experts)});
  const U128 moe_mlp =
      Add(Add(Mul({mats, h, U128(m.moe_intermediate_size), U128(m.experts_per_token)}), shared_mlp),
          Mul(h, m.num_experts));
  const int64_t moe_layers = moe ? MoeLayers(m) : 0;
  const int64_t dense_layers = m.num_layers - moe_layers;
  U128 params = Mul(h, m.vocab_size);
  params = Add(params, Mul(Add(attention, dense_mlp), dense_layers));
  params = Add(params, Mul(Add(attention, moe_mlp), moe_layers));
  const U128 linear = Mul(6, params);
  // Scores per layer kind: a sliding or chunked layer without its size sees the whole sequence.
  int64_t full_layers = m.layer_attention.empty() ? m.num_layers : 0, sliding_layers = 0,
          chunked_layers = 0;
  for (const ModelConfig::Attention kind : m.layer_attention) {
    if (kind == ModelConfig::Attention::kSliding && m.sliding_window > 0) {
      ++sliding_layers;
    } else if (kind == ModelConfig::Attention::kChunked && m.attention_chunk > 0) {
      ++chunked_layers;
    } else if (kind != ModelConfig::Attention::kRecurrent) {
      ++full_layers;
    }
  }
  const U128 per_layer = Mul({U128(3), heads, qk_dim + v_dim});
  const U128 quadratic = Mul(per_layer, full_layers);
  const U128 windowed = Mul(per_layer, sliding_layers);
  const U128 chunked = Mul(per_layer, chunked_layers);

  // The least shift that keeps every weight and the largest batch's cost in range.
  const U128 tokens = max_batch_tokens;
  const U128 seq = std::min(longest, max_batch_tokens);
  for (int shift = 0; shift < 127; ++shift) {
    const U128 a = Scaled(linear, shift), b = Scaled(quadratic, shift);
    const U128 bw = Scaled(windowed, shift), bc = Scaled(chunked, shift);
    const U128 c = Mul(a, overhead_tokens);
    constexpr U128 kMaxWeight = kMaxAttentionWeight;
    if (a > kMaxWeight || b > kMaxWeight || bw > kMaxWeight || bc > kMaxWeight ||
        c > static_cast<U128>(kMaxMicroBatchCost)) {
      continue;
    }
    // A windowed or chunked layer's scores are at most a full layer's (L^2).
    const U128 batch =
        Add(Add(Mul(a, tokens), Mul({Add(Add(b, bw), bc), tokens, seq})), Mul(c, tokens));
    if (batch > (U128{1} << 62)) continue;
    ModelCost out{static_cast<int64_t>(a), static_cast<int64_t>(b), static_cast<int64_t>(c), shift};
    if (bw > 0) {
      out.windowed = static_cast<int64_t>(bw);
      out.window = m.sliding_window;
    }
    if (bc > 0) {
      out.chunked = static_cast<int64_t>(bc);
      out.chunk = m.attention_chunk;
    }
    return out;
  }
  return absl::InvalidArgumentError("model cost: no scale fits the batch in int64");
}

absl::StatusOr<ModelCost> CostOfModelForBatch(const ModelConfig& config,
                                              absl::Span<const int64_t> lengths, int64_t align_to,
                                              int64_t overhead_tokens) {
  if (align_to < 1 || align_to > kMaxAlign) {
    return absl::InvalidArgumentError(
        absl::StrCat("align_to = ", align_to, ": must be in [1, ", kMaxAlign, "]"));
  }
  int64_t total = 0, longest = 1;
  for (int64_t length : lengths) {
    if (length < 1 || length > kMaxLength) {
      return absl::InvalidArgumentError(
          absl::StrCat("length ", length, ": must be in [1, ", kMaxLength, "]"));
    }
    const int64_t aligned = (length + align_to - 1) / align_to * align_to;
    total = std::min(total + aligned, int64_t{1} << 62);  // both below 2^62: no overflow
    longest = std::max(longest, aligned);
  }
  return CostOfModel(config, std::max<int64_t>(total, 1), longest, overhead_tokens);
}

absl::StatusOr<ModelCost> CostOfModelForForest(const ModelConfig& config, const Forest& forest,
                                               int64_t align_to, int64_t overhead_tokens) {
  if (align_to < 1 || align_to > kMaxAlign) {
    return absl::InvalidArgumentError(
        absl::StrCat("align_to = ", align_to, ": must be in [1, ", kMaxAlign, "]"));
  }
  ASSIGN_OR_RETURN(const ForestIndex index, IndexForest(forest));
  constexpr int64_t kHuge = int64_t{1} << 62;  // past any batch CostOfModel can scale
  auto aligned = [&](int64_t tokens) {
    tokens = std::min(tokens, kHuge);
    return (tokens + align_to - 1) / align_to * align_to;
  };
  int64_t total = 0, rollout = 1, tree = 1;
  for (int64_t length : index.rollout_len) {
    total = std::min(total + aligned(length), kHuge);  // both at most 2^62 + 2^20: no overflow
    rollout = std::max(rollout, aligned(length));
  }
  // Each tree's tokens, summed at its root (IndexForest checked that the total fits int64).
  std::vector<int64_t> tree_tokens(forest.node_len.size(), 0);
  for (size_t n = 0; n < forest.node_len.size(); ++n) {
    tree_tokens[index.root[n]] += forest.node_len[n];
  }
  for (int64_t root : index.roots) tree = std::max(tree, aligned(tree_tokens[root]));
  // Rollouts are at most 2^31 - 1 tokens and align_to at most 2^20: no overflow.
  const int64_t longest = std::min(tree, rollout + 2 * (align_to - 1));
  return CostOfModel(config, std::max<int64_t>(total, 1), longest, overhead_tokens);
}

absl::StatusOr<int64_t> UseModelCost(const absl::flat_hash_map<std::string, int64_t>& ints,
                                     const absl::flat_hash_map<std::string, std::string>& strings,
                                     absl::Span<const int64_t> lengths, PlanOptions& options) {
  ASSIGN_OR_RETURN(const ModelConfig config, ModelConfigFromFields(ints, strings));
  ASSIGN_OR_RETURN(const ModelCost cost,
                   CostOfModelForBatch(config, lengths, EffectiveAlignTo(options)));
  return Use(cost, options);
}

absl::StatusOr<int64_t> UseModelCost(const absl::flat_hash_map<std::string, int64_t>& ints,
                                     const absl::flat_hash_map<std::string, std::string>& strings,
                                     const Forest& forest, PlanOptions& options) {
  ASSIGN_OR_RETURN(const ModelConfig config, ModelConfigFromFields(ints, strings));
  ASSIGN_OR_RETURN(const ModelCost cost,
                   CostOfModelForForest(config, forest, EffectiveAlignTo(options)));
  return Use(cost, options);
}

}  // namespace packsched::planner
