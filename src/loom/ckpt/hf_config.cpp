#include "loom/ckpt/hf_config.hpp"

#include <cmath>
#include <string>

#include "loom/core/error.hpp"

namespace loom {

namespace {

using json = nlohmann::json;

// loom's GPT-2 MLP uses the tanh approximation of GELU; HF names it either way.
bool is_tanh_gelu(const std::string& name) { return name == "gelu_new" || name == "gelu_pytorch_tanh"; }

// Reads keys of one HF config, naming the key and model type in every error.
class HfConfigReader {
 public:
  HfConfigReader(const json& hf, std::string model_type) : hf_(hf), model_type_(std::move(model_type)) {}

  bool has(const char* key) const { return hf_.contains(key) && !hf_.at(key).is_null(); }
  const json& raw(const char* key) const { return require(key); }

  int64_t integer(const char* key) const {
    const json& value = require(key);
    if (!value.is_number_integer()) fail(key, value, "an integer");
    return value.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double number(const char* key) const {
    const json& value = require(key);
    if (!value.is_number()) fail(key, value, "a number");
    return value.get<double>();
  }
  double number_or(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }

  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& value = hf_.at(key);
    if (!value.is_boolean()) fail(key, value, "true or false");
    return value.get<bool>();
  }

  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& value = hf_.at(key);
    if (!value.is_string()) fail(key, value, "a string");
    return value.get<std::string>();
  }

  [[noreturn]] void fail(const char* key, const json& value, const std::string& expected) const {
    throw_error("HF config (", model_type_, ") key '", key, "': got ", value.dump(), ", expected ", expected);
  }

 private:
  const json& require(const char* key) const {
    if (!has(key)) throw_error("HF config (", model_type_, "): missing required key '", key, "'");
    return hf_.at(key);
  }

  const json& hf_;
  std::string model_type_;
};

ModelConfig gpt2_from_hf(const HfConfigReader& hf) {
  ModelConfig config;
  config.arch = Architecture::GPT2;
  config.vocab_size = hf.integer("vocab_size");
  config.max_seq_len = hf.integer("n_positions");
  config.n_embd = hf.integer("n_embd");
  config.n_layer = hf.integer("n_layer");
  config.n_head = config.n_kv_head = hf.integer("n_head");
  config.ffn_hidden = hf.integer_or("n_inner", 4 * config.n_embd);  // HF: null means 4 * n_embd
  config.norm_eps = hf.number("layer_norm_epsilon");
  config.tied_embeddings = hf.boolean_or("tie_word_embeddings", true);
  const std::string activation = hf.string_or("activation_function", "gelu_new");
  if (!is_tanh_gelu(activation))
    hf.fail("activation_function", activation, "\"gelu_new\" or \"gelu_pytorch_tanh\" (loom's GPT-2 GELU)");
  return config;
}

ModelConfig llama_from_hf(const HfConfigReader& hf) {
  ModelConfig config;
  config.arch = Architecture::Llama;
  config.vocab_size = hf.integer("vocab_size");
  config.n_embd = hf.integer("hidden_size");
  config.ffn_hidden = hf.integer("intermediate_size");
  config.n_layer = hf.integer("num_hidden_layers");
  config.n_head = hf.integer("num_attention_heads");
  config.n_kv_head = hf.integer_or("num_key_value_heads", config.n_head);  // HF: absent means no GQA
  config.max_seq_len = hf.integer("max_position_embeddings");
  config.norm_eps = hf.number("rms_norm_eps");
  config.rope_theta = hf.number_or("rope_theta", 10000.0);                  // LlamaConfig default
  config.tied_embeddings = hf.boolean_or("tie_word_embeddings", false);     // LlamaConfig default
  const std::string activation = hf.string_or("hidden_act", "silu");
  if (activation != "silu") hf.fail("hidden_act", activation, "\"silu\" (loom's SwiGLU)");
  // Features that change the math; loading them silently would give a different model.
  if (hf.has("rope_scaling")) {
    // Llama 3.1 / 3.2's scaling; the other kinds (linear, dynamic, yarn, longrope) are refused.
    const nlohmann::json scaling = hf.raw("rope_scaling");
    std::string kind;
    for (const char* key : {"type", "rope_type"}) {  // rope_type wins where both are given
      if (!scaling.is_object() || !scaling.contains(key)) continue;
      if (!scaling[key].is_string())
        hf.fail("rope_scaling", scaling, std::string("a string for \"") + key + "\"");
      kind = scaling[key].get<std::string>();
    }
    auto number = [&](const char* key) {
      if (!scaling.contains(key) || !scaling[key].is_number())
        hf.fail("rope_scaling", scaling, std::string("a number for \"") + key + "\"");
      return scaling[key].get<double>();
    };
    if (kind != "llama3")
      hf.fail("rope_scaling", scaling, "null or {\"rope_type\": \"llama3\", ...} (Llama 3.1's scaling, the one loom implements)");
    config.rope_scaling_factor = number("factor");
    config.rope_low_freq_factor = number("low_freq_factor");
    config.rope_high_freq_factor = number("high_freq_factor");
    const double original = number("original_max_position_embeddings");
    if (original != std::floor(original) || original <= 0)
      hf.fail("rope_scaling", scaling, "a positive integer original_max_position_embeddings");
    config.rope_original_max_positions = static_cast<int64_t>(original);
  }
  if (hf.boolean_or("attention_bias", false)) hf.fail("attention_bias", true, "false (loom's Llama has no biases)");
  if (hf.boolean_or("mlp_bias", false)) hf.fail("mlp_bias", true, "false (loom's Llama has no biases)");
  // An explicit head width (Mistral NeMo, Qwen3): kept only where it differs from hidden_size /
  // num_attention_heads, so that a config spelling out the default reads as one that does not.
  if (hf.has("head_dim")) {
    const int64_t head_dim = hf.integer("head_dim");
    if (head_dim <= 0) hf.fail("head_dim", hf.raw("head_dim"), "a positive width");
    if (config.n_head <= 0 || config.n_embd % config.n_head != 0 ||
        head_dim != config.n_embd / config.n_head)
      config.attention_head_dim = head_dim;
  }
  return config;
}

// A sliding window (transformers' `sliding_window`: a query sees that many keys, itself
// included) on every layer, or on the layers `layer_types` names "sliding_attention" where
// they follow loom's pattern (every G-th layer global: model.global_attention_every). A window
// as long as the context is no window.
void read_sliding_window(const HfConfigReader& hf, ModelConfig& config) {
  if (!hf.has("sliding_window")) return;
  const int64_t window = hf.integer("sliding_window");
  if (window <= 0)
    hf.fail("sliding_window", hf.raw("sliding_window"), "null or a positive number of keys");
  if (hf.boolean_or("use_sliding_window", true) == false) return;  // Qwen2's switch
  config.sliding_window = window >= config.max_seq_len ? 0 : window;
  if (!hf.has("layer_types") || config.sliding_window == 0) return;
  const nlohmann::json types = hf.raw("layer_types");
  const std::string expected =
      "a list of n_layer \"sliding_attention\" / \"full_attention\", full every G-th layer (G >= "
      "2) or never";
  if (!types.is_array() || static_cast<int64_t>(types.size()) != config.n_layer)
    hf.fail("layer_types", types, expected);
  int64_t every = 0;
  for (int64_t l = 0; l < config.n_layer; ++l)
    if (types[static_cast<size_t>(l)] == "full_attention") {
      every = l + 1;
      break;
    }
  config.global_attention_every = every;
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const nlohmann::json& type = types[static_cast<size_t>(l)];
    if (every == 1 || (type != "full_attention" && type != "sliding_attention") ||
        (type == "sliding_attention") != config.is_windowed_layer(l))
      hf.fail("layer_types", types, expected);
  }
}

// Mistral (transformers' MistralConfig): Llama's layers and names, with Mistral 7B v0.1's
// sliding window (null from v0.2 on, and in Mistral NeMo).
ModelConfig mistral_from_hf(const HfConfigReader& hf) {
  ModelConfig config = llama_from_hf(hf);
  read_sliding_window(hf, config);
  return config;
}

// Mixtral: Llama's attention and norms, a sparse MoE block of num_local_experts SwiGLU experts.
ModelConfig mixtral_from_hf(const HfConfigReader& hf) {
  ModelConfig config = llama_from_hf(hf);
  config.n_experts = hf.integer("num_local_experts");
  config.experts_per_token = hf.integer("num_experts_per_tok");
  config.moe_aux_loss_coef = hf.number_or("router_aux_loss_coef", 0.001);  // MixtralConfig default
  if (!hf.boolean_or("output_router_logits", false)) config.moe_aux_loss_coef = 0;  // transformers adds it only then
  config.moe_z_loss_coef = hf.number_or("router_z_loss_coef", 0.0);
  config.n_shared_experts = hf.integer_or("n_shared_experts", 0);
  config.moe_router = parse_moe_router(hf.string_or("loom_moe_router", "softmax"));
  config.moe_capacity_factor = hf.number_or("loom_moe_capacity_factor", 0.0);
  config.moe_bias_rate = hf.number_or("loom_moe_bias_rate", 0.0);
  // Fine-grained experts and leading dense layers under DeepSeek-V2/V3's config names, and the
  // spacing of the MoE layers after them under loom's.
  config.moe_ffn_hidden = hf.integer_or("moe_intermediate_size", 0);
  config.moe_first_dense = hf.integer_or("first_k_dense_replace", 0);
  config.moe_every = hf.integer_or("loom_moe_every", 1);
  read_sliding_window(hf, config);
  return config;
}

}  // namespace

json hf_config_json(const ModelConfig& config) {
  config.validate();
  if (config.arch == Architecture::GPT2) {
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", config.vocab_size},
            {"n_positions", config.max_seq_len},
            {"n_embd", config.n_embd},
            {"n_layer", config.n_layer},
            {"n_head", config.n_head},
            {"n_inner", config.ffn_hidden},
            {"layer_norm_epsilon", config.norm_eps},
            {"activation_function", "gelu_new"},
            {"tie_word_embeddings", config.tied_embeddings},
            {"torch_dtype", "float32"}};
  }
  json llama = {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", config.vocab_size},
          {"hidden_size", config.n_embd},
          {"intermediate_size", config.ffn_hidden},
          {"num_hidden_layers", config.n_layer},
          {"num_attention_heads", config.n_head},
          {"num_key_value_heads", config.n_kv_head},
          {"max_position_embeddings", config.max_seq_len},
          {"rms_norm_eps", config.norm_eps},
          {"rope_theta", config.rope_theta},
          {"tie_word_embeddings", config.tied_embeddings},
          {"hidden_act", "silu"},
          {"torch_dtype", "float32"}};
  if (config.attention_head_dim > 0) llama["head_dim"] = config.attention_head_dim;
  if (config.sliding_window > 0) {
    // MistralConfig's window, on every layer. With global layers among them, transformers'
    // MistralConfig would ignore layer_types and window every layer (a different model,
    // silently): such a config is written under loom's own model_type, which transformers
    // refuses, and loom reads as Mistral with layer_types.
    const bool mixed = config.global_attention_every > 0;
    llama["architectures"] = {"MistralForCausalLM"};
    llama["model_type"] = mixed ? "loom_mistral" : "mistral";
    llama["sliding_window"] = config.sliding_window;
    if (mixed) {
      llama["layer_types"] = nlohmann::json::array();
      for (int64_t l = 0; l < config.n_layer; ++l)
        llama["layer_types"].push_back(config.is_windowed_layer(l) ? "sliding_attention"
                                                                   : "full_attention");
    }
  }
  if (config.rope_scaling_factor != 0)
    llama["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", config.rope_scaling_factor},
                             {"low_freq_factor", config.rope_low_freq_factor},
                             {"high_freq_factor", config.rope_high_freq_factor},
                             {"original_max_position_embeddings", config.rope_original_max_positions}};
  if (!config.is_moe()) return llama;
  // Mixtral's config (transformers' MixtralConfig, its window on every layer), plus loom's
  // router options under names of their own; with global layers among windowed ones, loom's
  // own model_type (see above).
  llama["architectures"] = {"MixtralForCausalLM"};
  llama["model_type"] = config.global_attention_every > 0 ? "loom_mixtral" : "mixtral";
  llama["num_local_experts"] = config.n_experts;
  llama["num_experts_per_tok"] = config.experts_per_token;
  llama["router_aux_loss_coef"] = config.moe_aux_loss_coef;
  llama["output_router_logits"] = config.moe_aux_loss_coef > 0;
  llama["sliding_window"] =
      config.sliding_window > 0 ? nlohmann::json(config.sliding_window) : nlohmann::json();
  llama["router_z_loss_coef"] = config.moe_z_loss_coef;
  llama["n_shared_experts"] = config.n_shared_experts;
  llama["loom_moe_router"] = moe_router_name(config.moe_router);
  llama["loom_moe_capacity_factor"] = config.moe_capacity_factor;
  llama["loom_moe_bias_rate"] = config.moe_bias_rate;
  // Not Mixtral's: experts narrower than the dense MLPs, dense layers among the MoE ones.
  if (config.moe_ffn_hidden > 0) llama["moe_intermediate_size"] = config.moe_ffn_hidden;
  if (config.moe_first_dense > 0) llama["first_k_dense_replace"] = config.moe_first_dense;
  if (config.moe_every > 1) llama["loom_moe_every"] = config.moe_every;
  return llama;
}

ModelConfig model_config_from_hf_json(const json& hf) {
  if (!hf.is_object()) throw_error("HF config: got ", hf.type_name(), ", expected a JSON object");
  const auto model_type = hf.find("model_type");
  if (model_type == hf.end() || !model_type->is_string())
    throw_error(
        "HF config: missing string key 'model_type' (expected \"gpt2\", \"llama\", \"mistral\" or "
        "\"mixtral\")");
  const std::string type = model_type->get<std::string>();
  const HfConfigReader reader(hf, type);
  ModelConfig config;
  if (type == "gpt2")
    config = gpt2_from_hf(reader);
  else if (type == "llama")
    config = llama_from_hf(reader);
  else if (type == "mistral" || type == "loom_mistral")
    config = mistral_from_hf(reader);
  else if (type == "mixtral" || type == "loom_mixtral")
    config = mixtral_from_hf(reader);
  else
    throw_error("HF config key 'model_type': got \"", type,
                "\", expected \"gpt2\", \"llama\", \"mistral\" or \"mixtral\" (or loom's "
                "\"loom_mistral\" / "
                "\"loom_mixtral\": windowed layers among global ones)");
  try {
    config.validate();
  } catch (const Error& e) {
    throw_error("HF config (", type, ") describes an invalid model: ", e.what());
  }
  return config;
}

}  // namespace loom
