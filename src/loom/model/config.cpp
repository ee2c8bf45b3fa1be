#include "loom/model/config.hpp"

#include <cmath>
#include <utility>

#include "loom/core/error.hpp"

namespace loom {

const char* architecture_name(Architecture arch) { return arch == Architecture::GPT2 ? "gpt2" : "llama"; }

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::None;
  if (text == "selective") return Recompute::Selective;
  if (text == "full") return Recompute::Full;
  throw_error("recompute: got '", text, "', expected one of none, selective, full");
}

const char* moe_router_name(MoeRouter router) { return router == MoeRouter::Sigmoid ? "sigmoid" : "softmax"; }

MoeRouter parse_moe_router(const std::string& text) {
  if (text == "softmax") return MoeRouter::Softmax;
  if (text == "sigmoid") return MoeRouter::Sigmoid;
  throw_error("model.moe_router: got '", text, "', expected softmax (Mixtral) or sigmoid (DeepSeek-V3)");
}

namespace {
int64_t mlp_parameters(Architecture arch, bool squared_relu, int64_t c, int64_t f) {
  if (arch == Architecture::GPT2) return c * f + f + f * c + c;  // c_fc, c_proj
  return squared_relu ? 2 * c * f                                // up, down
                      : 3 * c * f;                               // gate, up, down
}
}  // namespace

int64_t ModelConfig::expert_parameter_count() const {
  return mlp_parameters(arch, squared_relu_mlp, moe_latent > 0 ? moe_latent : n_embd, expert_ffn());
}
int64_t ModelConfig::dense_mlp_parameter_count() const {
  return mlp_parameters(arch, squared_relu_mlp, n_embd, ffn_hidden);
}

int64_t ModelConfig::hybrid_layer_count(char kind) const {
  int64_t count = 0;
  for (const char symbol : hybrid_pattern) count += symbol == kind;
  return count;
}
int64_t ModelConfig::attention_layer_count() const {
  return is_hybrid() ? hybrid_layer_count('*') : n_layer;
}
int64_t ModelConfig::dense_mlp_layer_count() const {
  return is_hybrid() ? hybrid_layer_count('-') : n_layer - moe_layer_count();
}

double ModelConfig::mamba_scan_flops_per_token() const {
  const double q = static_cast<double>(mamba_chunk), n = static_cast<double>(mamba_state);
  const double inner = static_cast<double>(mamba_inner()),
               groups = static_cast<double>(mamba_groups);
  return 2 * q * n * groups + 2 * q * inner + 4 * n * inner;
}

int64_t ModelConfig::mamba_parameter_count() const {
  const int64_t c = n_embd, channels = mamba_conv_channels();
  return c                                   // the block's pre-norm
         + c * mamba_in_proj()               // in_proj
         + channels * mamba_conv + channels  // conv1d weight and bias
         + 3 * mamba_heads                   // dt_bias, A_log, D
         + mamba_inner()                     // the gated RMSNorm
         + mamba_inner() * c;                // out_proj
}

int64_t ModelConfig::moe_layer_count() const {
  int64_t count = 0;
  for (int64_t l = 0; l < n_layer; ++l) count += is_moe_layer(l);
  return count;
}

int64_t ModelConfig::windowed_layer_count() const {
  int64_t count = 0;
  for (int64_t l = 0; l < n_layer; ++l) count += is_windowed_layer(l);
  return count;
}

double ModelConfig::mean_keys_per_query(int64_t layer, int64_t seq_len) const {
  const double t = static_cast<double>(seq_len);
  if (!is_windowed_layer(layer) || sliding_window >= seq_len) return t / 2;
  const double w = static_cast<double>(sliding_window);
  return (w * (w + 1) / 2 + (t - w) * w) / t;  // rows 0..W-1 see i + 1 keys, the rest W
}

int64_t ModelConfig::parameter_count() const {
  const int64_t c = n_embd;
  // A mixture-of-experts block's MLP part: the routed experts with their router, the latent
  // projections, the shared experts (one MLP n_shared x as wide as an expert, on the hidden state).
  const int64_t moe_block =
      n_experts * expert_parameter_count() + n_experts * c + 2 * c * moe_latent +
      (n_shared_experts > 0
           ? mlp_parameters(arch, squared_relu_mlp, c, n_shared_experts * expert_ffn())
           : 0);
  if (is_hybrid()) {
    int64_t total = vocab_size * c + c /*final norm*/ + (tied_embeddings ? 0 : vocab_size * c);
    total += hybrid_layer_count('*') * (c + 2 * c * q_dim() + 2 * c * kv_dim());
    total += hybrid_layer_count('-') * (c + dense_mlp_parameter_count());
    total += hybrid_layer_count('E') * (c + moe_block);
    total += hybrid_layer_count('M') * mamba_parameter_count();
    return total;
  }
  int64_t per_layer = 0;
  if (arch == Architecture::GPT2) {
    per_layer = 2 * c                                 // ln_1
                + c * 3 * c + 3 * c                   // c_attn
                + c * c + c                           // attn c_proj
                + 2 * c;                              // ln_2
  } else {
    per_layer = c                                     // input_layernorm
                + 2 * c * q_dim() + 2 * c * kv_dim()  // q, o; k, v
                + c;                                  // post_attention_layernorm
  }
  // Each layer's MLP, or its experts, their router and the shared experts (one MLP n_shared x
  // as wide as an expert).
  const int64_t moe_layers = moe_layer_count();
  int64_t total = vocab_size * c + n_layer * per_layer + (n_layer - moe_layers) * dense_mlp_parameter_count();
  total += moe_layers * moe_block;
  total += arch == Architecture::GPT2 ? 2 * c : c;              // final norm
  if (arch == Architecture::GPT2) total += max_seq_len * c;     // wpe
  if (!tied_embeddings) total += vocab_size * c;                // lm_head
  return total;
}

void ModelConfig::validate() const {
  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) throw_error("model.", key, ": got ", v, ", expected a positive integer");
  };
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  positive("n_layer", n_layer);
  positive("n_embd", n_embd);
  positive("n_head", n_head);
  positive("n_kv_head", n_kv_head);
  positive("ffn_hidden", ffn_hidden);
  if (attention_head_dim < 0)
    throw_error("model.head_dim: got ", attention_head_dim,
                ", expected a positive width (0: n_embd / n_head)");
  if (attention_head_dim > 0 && arch == Architecture::GPT2)
    throw_error(
        "model.head_dim: GPT-2's heads are n_embd / n_head wide; an explicit head_dim is Llama's "
        "(set "
        "model.arch = \"llama\", or leave head_dim out)");
  if (attention_head_dim == 0 && n_embd % n_head != 0)
    throw_error("model.n_head: ", n_head, " does not divide model.n_embd=", n_embd,
                "; choose n_head that divides it, or give model.head_dim (heads of that width, "
                "n_head x head_dim "
                "wide in all)");
  if (n_head % n_kv_head != 0)
    throw_error("model.n_kv_head: ", n_kv_head, " does not divide model.n_head=", n_head);
  if (arch == Architecture::Llama && head_dim() % 2 != 0)
    throw_error("model: head dimension ", head_dim(), " must be even for RoPE");
  if (arch == Architecture::GPT2 && n_kv_head != n_head)
    throw_error("model.n_kv_head: GPT-2 has no grouped-query attention; got ", n_kv_head,
                ", expected n_head=", n_head);
  if (!(norm_eps > 0)) throw_error("model.norm_eps: got ", norm_eps, ", expected > 0");
  if (!(rope_theta > 0)) throw_error("model.rope_theta: got ", rope_theta, ", expected > 0");
  if (rope_scaling_factor != 0) {
    if (arch != Architecture::Llama)
      throw_error("model.rope_scaling_factor: RoPE scaling is Llama's; GPT-2 has learned positions");
    if (!(rope_scaling_factor >= 1))
      throw_error("model.rope_scaling_factor: got ", rope_scaling_factor, ", expected 0 (plain RoPE) or >= 1");
    if (!(rope_low_freq_factor > 0) || !(rope_high_freq_factor > rope_low_freq_factor))
      throw_error("model.rope_low_freq_factor / rope_high_freq_factor: got ", rope_low_freq_factor, " / ",
                  rope_high_freq_factor, ", expected 0 < low < high");
    if (rope_original_max_positions <= 0)
      throw_error("model.rope_original_max_positions: got ", rope_original_max_positions, ", expected > 0");
  }
  if (n_experts < 0) throw_error("model.n_experts: got ", n_experts, ", expected 0 (dense) or a positive count");
  if (n_experts == 0 && experts_per_token != 0)
    throw_error("model.experts_per_token: got ", experts_per_token, " for a dense model (n_experts = 0)");
  if (n_experts > 0 && (experts_per_token < 1 || experts_per_token > n_experts))
    throw_error("model.experts_per_token: got ", experts_per_token, ", expected 1 to model.n_experts = ", n_experts,
                " (a token goes to that many distinct experts)");
  if (!(moe_capacity_factor >= 0) || !std::isfinite(moe_capacity_factor))
    throw_error("model.moe_capacity_factor: got ", moe_capacity_factor, ", expected > 0 (an expert takes at most "
                "factor x experts_per_token x tokens / n_experts of a micro-batch's tokens, the rest are dropped) or "
                "0 (dropless, the default)");
  if (n_shared_experts < 0 || (n_shared_experts > 0 && n_experts == 0))
    throw_error("model.n_shared_experts: got ", n_shared_experts, ", expected 0, or a count with model.n_experts > 0");
  if (n_shared_experts > 0 && arch != Architecture::Llama)
    throw_error("model.n_shared_experts: shared experts are Llama-style (SwiGLU) MLPs; model.arch is gpt2");
  for (const auto& [key, value] : {std::pair<const char*, double>{"moe_aux_loss_coef", moe_aux_loss_coef},
                                   {"moe_z_loss_coef", moe_z_loss_coef},
                                   {"moe_bias_rate", moe_bias_rate}})
    if (!(value >= 0) || !std::isfinite(value)) throw_error("model.", key, ": got ", value, ", expected a finite value >= 0");
  if (moe_ffn_hidden < 0 || (moe_ffn_hidden > 0 && n_experts == 0))
    throw_error("model.moe_ffn_hidden: got ", moe_ffn_hidden, ", expected 0 (ffn_hidden), or a width with model.n_experts > 0");
  if (sliding_window < 0)
    throw_error("model.sliding_window: got ", sliding_window,
                ", expected 0 (global attention) or a window in keys");
  if (global_attention_every < 0 || global_attention_every == 1)
    throw_error(
        "model.global_attention_every: got ", global_attention_every,
        ", expected 0 (every layer windowed) or G >= 2 (layer l global when (l + 1) % G == 0)");
  if (sliding_window > 0 && arch != Architecture::Llama)
    throw_error(
        "model.sliding_window: a sliding window is Llama-style (Mistral's, Gemma's); model.arch is "
        "gpt2");
  if (global_attention_every > 0 && sliding_window == 0)
    throw_error("model.global_attention_every: got ", global_attention_every,
                " without model.sliding_window; give the window of the other layers");
  if (moe_every < 1) throw_error("model.moe_every: got ", moe_every, ", expected >= 1 (every n-th layer is a mixture of experts)");
  if (moe_first_dense < 0 || (n_experts > 0 && moe_first_dense >= n_layer))
    throw_error("model.moe_first_dense: got ", moe_first_dense, ", expected 0 to model.n_layer - 1 = ", n_layer - 1,
                " (the first layers that stay dense; at least one layer must be a mixture of experts)");
  if (n_experts == 0 && (moe_first_dense != 0 || moe_every != 1))
    throw_error("model.moe_first_dense / model.moe_every are set for a dense model (n_experts = 0)");
  validate_hybrid();
  if (moe_bias_rate > 0 && moe_router != MoeRouter::Sigmoid)
    throw_error("model.moe_bias_rate: got ", moe_bias_rate, " with model.moe_router = softmax; the selection bias "
                "(auxiliary-loss-free balancing) belongs to the sigmoid router: set moe_router = \"sigmoid\" or the "
                "rate to 0");
}

void ModelConfig::validate_hybrid() const {
  if (squared_relu_mlp && arch != Architecture::Llama)
    throw_error(
        "model.squared_relu_mlp: a two-matrix squared-ReLU MLP is Nemotron's (Llama-style); "
        "GPT-2's MLP "
        "has its own GELU");
  if (moe_latent < 0 || (moe_latent > 0 && n_experts == 0))
    throw_error("model.moe_latent: got ", moe_latent,
                ", expected 0, or a width with model.n_experts > 0");
  if (mtp_layers < 0)
    throw_error("model.mtp_layers: got ", mtp_layers, ", expected 0 or more depths");
  if (!is_hybrid()) {
    if (mamba_heads != 0)
      throw_error("model.mamba_heads: got ", mamba_heads,
                  " without model.hybrid_pattern (no layer is Mamba)");
    if (squared_relu_mlp || moe_latent > 0)
      throw_error(
          "model.squared_relu_mlp / moe_latent: planned for hybrid Mamba stacks only (set "
          "model.hybrid_pattern); a transformer's MLP is SwiGLU or GELU");
    return;
  }
  if (arch != Architecture::Llama)
    throw_error(
        "model.hybrid_pattern: hybrid Mamba stacks are Llama-style (RMSNorm, no biases); "
        "model.arch is gpt2");
  if (static_cast<int64_t>(hybrid_pattern.size()) != n_layer)
    throw_error("model.hybrid_pattern: ", hybrid_pattern.size(),
                " symbols for model.n_layer = ", n_layer, "; one symbol a layer");
  for (const char symbol : hybrid_pattern)
    if (symbol != 'M' && symbol != '*' && symbol != '-' && symbol != 'E')
      throw_error(
          "model.hybrid_pattern: '", std::string(1, symbol), "' in \"", hybrid_pattern,
          "\"; expected M (Mamba-2), * (attention), - (dense MLP) or E (mixture of experts)");
  if ((hybrid_layer_count('E') > 0) != (n_experts > 0))
    throw_error("model.hybrid_pattern: ", hybrid_layer_count('E'),
                " E layers with model.n_experts = ", n_experts,
                "; give experts exactly when the pattern has E layers");
  if (n_experts > 0 && (moe_first_dense != 0 || moe_every != 1))
    throw_error(
        "model.moe_first_dense / model.moe_every: a hybrid's E symbols place its experts; leave "
        "them unset");
  if (sliding_window > 0)
    throw_error(
        "model.sliding_window: not planned for a hybrid Mamba stack (its attention layers are "
        "global)");
  if (hybrid_layer_count('M') > 0) {
    for (const auto& [key, value] : {std::pair<const char*, int64_t>{"mamba_heads", mamba_heads},
                                     {"mamba_head_dim", mamba_head_dim},
                                     {"mamba_state", mamba_state},
                                     {"mamba_groups", mamba_groups},
                                     {"mamba_conv", mamba_conv},
                                     {"mamba_chunk", mamba_chunk}})
      if (value <= 0)
        throw_error("model.", key, ": got ", value,
                    ", expected a positive integer for the M layers");
    if (mamba_heads % mamba_groups != 0)
      throw_error("model.mamba_groups: ", mamba_groups,
                  " does not divide model.mamba_heads = ", mamba_heads);
  } else if (mamba_heads != 0) {
    throw_error("model.mamba_heads: got ", mamba_heads, " but model.hybrid_pattern has no M layer");
  }
}

namespace {
ModelConfig gpt2(int64_t layers, int64_t embd, int64_t heads) {
  ModelConfig c;
  c.arch = Architecture::GPT2;
  c.n_layer = layers;
  c.n_embd = embd;
  c.n_head = c.n_kv_head = heads;
  c.ffn_hidden = 4 * embd;
  return c;
}
// Llama 3 family dimensions (Meta's model cards / HF configs), vocab 128256, RoPE theta 500000.
ModelConfig llama(int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads, int64_t ffn, bool tied) {
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.vocab_size = 128256;
  c.max_seq_len = 8192;
  c.n_layer = layers;
  c.n_embd = embd;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.ffn_hidden = ffn;
  c.tied_embeddings = tied;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  return c;
}
// Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1; HF config.json): Mistral 7B's
// attention with 8 SwiGLU experts per block, 2 per token; 46.7B parameters, 12.9B active.
ModelConfig mixtral_8x7b() {
  ModelConfig c = llama(32, 4096, 32, 8, 14336, false);
  c.vocab_size = 32000;
  c.max_seq_len = 32768;
  c.rope_theta = 1e6;
  c.n_experts = 8;
  c.experts_per_token = 2;
  return c;
}
// DeepSeek-V3's mixture of experts (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sec. 4.2
// and its HF config.json): 61 layers of hidden 7168, the first 3 dense (ffn 18432), then 256
// routed experts of 2048 + 1 shared, 8 per token, sigmoid router with auxiliary-loss-free bias
// balancing (rate 0.001), vocabulary 129,280, untied. Its multi-head latent attention is not
// loom's: this shape has 128 full heads instead (head_dim 56), which lands near the published
// 671B parameters / 37B active.
ModelConfig deepseek_v3_gqa() {
  ModelConfig c = llama(61, 7168, 128, 128, 18432, false);
  c.vocab_size = 129280;
  c.max_seq_len = 4096;
  c.norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.n_experts = 256;
  c.experts_per_token = 8;
  c.n_shared_experts = 1;
  c.moe_ffn_hidden = 2048;
  c.moe_first_dense = 3;
  c.moe_router = MoeRouter::Sigmoid;
  c.moe_bias_rate = 0.001;
  c.moe_aux_loss_coef = 0.0001;  // V3's sequence-wise balance loss weight, here per micro-batch
  return c;
}
// The same family at a size that trains on a CPU (tests, demos): 4 layers of 128, the first
// dense (ffn 512), 16 routed experts of 64 + 1 shared, 4 per token, GPT-2's vocabulary.
ModelConfig deepseek_v3_small() {
  ModelConfig c = deepseek_v3_gqa();
  c.n_layer = 4;
  c.n_embd = 128;
  c.n_head = c.n_kv_head = 4;
  c.ffn_hidden = 512;
  c.vocab_size = 50257;
  c.max_seq_len = 1024;
  c.n_experts = 16;
  c.experts_per_token = 4;
  c.moe_ffn_hidden = 64;
  c.moe_first_dense = 1;
  return c;
}
struct Preset {
  const char* name;
  ModelConfig config;
};
const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"gpt2-124m", gpt2(12, 768, 12)},
      {"gpt2-350m", gpt2(24, 1024, 16)},
      {"gpt2-774m", gpt2(36, 1280, 20)},
      {"gpt2-1.5b", gpt2(48, 1600, 25)},
      {"llama-1b", llama(16, 2048, 32, 8, 8192, true)},
      {"llama-3b", llama(28, 3072, 24, 8, 8192, true)},
      {"llama-8b", llama(32, 4096, 32, 8, 14336, false)},
      {"llama-70b", llama(80, 8192, 64, 8, 28672, false)},
      {"llama-405b", llama(126, 16384, 128, 8, 53248, false)},
      {"mixtral-8x7b", mixtral_8x7b()},
      {"deepseek-v3-gqa", deepseek_v3_gqa()},
      {"deepseek-v3-small", deepseek_v3_small()},
  };
  return all;
}
}  // namespace

ModelConfig model_preset(const std::string& name) {
  for (const auto& p : presets())
    if (name == p.name) return p.config;
  std::string known;
  for (const auto& p : presets()) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw_error("model.preset: unknown preset '", name, "', expected one of ", known);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.emplace_back(p.name);
  return out;
}

}  // namespace loom
