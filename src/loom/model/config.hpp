#pragma once
// Model description shared by the engine, checkpoints and (later) the planner: one struct
// says everything about a transformer's shape, so nothing else re-derives it.
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

// Vocabulary entries the fused cross-entropy turns into logits at a time (per row).
// 8192 keeps a [rows, chunk] f32 block in L2-sized pieces and was measured faster than one
// chunk for the whole GPT-2 vocabulary on the CPU (bench_train_step --vocab-chunk).
constexpr int64_t kDefaultVocabChunk = 8192;

enum class Architecture { GPT2, Llama };
enum class Recompute { None, Selective, Full };
// How a mixture-of-experts router scores experts (model/moe.hpp): softmax over the experts
// (Mixtral) or a sigmoid per expert with a selection bias (DeepSeek-V3).
enum class MoeRouter { Softmax, Sigmoid };

const char* architecture_name(Architecture arch);
const char* recompute_name(Recompute mode);
Recompute parse_recompute(const std::string& text);  // "none" | "selective" | "full"
const char* moe_router_name(MoeRouter router);       // "softmax" | "sigmoid"
MoeRouter parse_moe_router(const std::string& text);

struct ModelConfig {
  Architecture arch = Architecture::GPT2;
  int64_t vocab_size = 50257;
  int64_t max_seq_len = 1024;  // learned positions (GPT-2) / RoPE table length (Llama)
  int64_t n_layer = 12;
  int64_t n_embd = 768;        // hidden size
  int64_t n_head = 12;
  int64_t n_kv_head = 12;      // < n_head means grouped-query attention
  // The width of one attention head, when it is not n_embd / n_head (Llama only; HF's
  // `head_dim`: Qwen3 30B-A3B's 32 heads of 128 on a 2048-wide stream, Mistral NeMo's 32 of 128
  // on 5120). q and the attention output are then n_head x head_dim wide, not n_embd. 0: n_embd
  // / n_head.
  int64_t attention_head_dim = 0;
  int64_t ffn_hidden = 3072;   // MLP inner size (SwiGLU: size of gate and up each)
  bool tied_embeddings = true;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // Llama 3.1's RoPE frequency scaling (HF rope_scaling {"rope_type": "llama3", ...}); a factor
  // of 0 is plain RoPE. See cpu::RopeScaling.
  double rope_scaling_factor = 0;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int64_t rope_original_max_positions = 8192;
  // Mixture of experts (Shazeer et al. 2017; Mixtral, Jiang et al. 2024): each block's MLP
  // becomes n_experts MLPs of ffn_hidden each plus a router, and every token runs through
  // experts_per_token of them. 0 experts is a dense model. The engine trains Llama-style
  // (SwiGLU) MoE models on one process so far; `loom plan` plans them at any scale.
  int64_t n_experts = 0;
  int64_t experts_per_token = 0;
  // Shared experts (DeepSeekMoE, Dai et al. 2024): every token also runs through one SwiGLU MLP
  // of n_shared_experts x ffn_hidden, unweighted, beside its routed experts.
  int64_t n_shared_experts = 0;
  MoeRouter moe_router = MoeRouter::Softmax;
  double moe_aux_loss_coef = 0.01;   // weight of each MoE layer's switch balancing loss
  double moe_z_loss_coef = 0.0;      // weight of each MoE layer's router z-loss
  double moe_capacity_factor = 0.0;  // 0: dropless; else rows per expert <= c k tokens / E
  double moe_bias_rate = 0.0;        // sigmoid router: selection-bias step per optimizer step
  // Fine-grained experts and mixed layers (DeepSeekMoE; DeepSeek-V3: 2048-wide experts, the
  // first 3 of 61 layers dense with ffn_hidden 18432): each expert (and each shared expert) is
  // moe_ffn_hidden wide (0: ffn_hidden); layer l is a mixture of experts when l >= moe_first_dense
  // and (l - moe_first_dense) is a multiple of moe_every, a dense MLP of ffn_hidden otherwise.
  int64_t moe_ffn_hidden = 0;
  int64_t moe_first_dense = 0;
  int64_t moe_every = 1;
  // Sliding-window (local) attention (Mistral 7B v0.1; Gemma 2 and 3, gpt-oss between global
  // layers): a windowed layer's query i sees the keys [i - sliding_window + 1, i], that many at
  // most (transformers' convention), within its document when documents are packed. With
  // global_attention_every = G > 1 layer l attends globally when (l + 1) % G == 0 (G = 2: local,
  // global, local, ...: Gemma 2, gpt-oss; G = 6: Gemma 3's five local to one global); 0: every
  // layer is windowed. sliding_window = 0: every layer is global.
  int64_t sliding_window = 0;
  int64_t global_attention_every = 0;
  // Hybrid Mamba-2 / attention stacks (Nemotron-H, NVIDIA 2025, arXiv 2504.03624; Megatron-LM's
  // hybrid layer pattern): one symbol a layer, each its own pre-norm residual block: 'M' a
  // Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs"), '*' attention, '-' a dense MLP of
  // ffn_hidden, 'E' a mixture-of-experts MLP. n_layer is the pattern's length. Empty: a
  // transformer, every layer attention + MLP. Llama-style only; `loom plan` plans hybrids, the
  // engine does not build them.
  std::string hybrid_pattern;
  // A Mamba-2 mixer: mamba_heads heads of mamba_head_dim (d_inner = heads x head_dim), an SSM
  // state of mamba_state per head, B and C shared by mamba_groups groups of heads, a causal
  // depthwise convolution of mamba_conv taps over x|B|C, the scan in chunks of mamba_chunk.
  int64_t mamba_heads = 0, mamba_head_dim = 64, mamba_state = 128, mamba_groups = 8, mamba_conv = 4,
          mamba_chunk = 128;
  // MLPs and experts as up -> squared ReLU -> down, two matrices (Nemotron-4, Nemotron-H), not
  // SwiGLU's three. Llama-style only.
  bool squared_relu_mlp = false;
  // Latent MoE (Nemotron 3 Super and Ultra): the routed experts run on a moe_latent-wide
  // projection of the token, one down projection (h -> latent) before them and one up
  // (latent -> h) after, shared by the experts. 0: on the hidden state.
  int64_t moe_latent = 0;
  // Multi-token prediction (DeepSeek-V3, Liu et al. 2024, sec. 2.2; Nemotron 3): mtp_layers more
  // depths after the last layer, each an attention block and an MLP block (a hybrid's "*E" or
  // "*-") on the projected [hidden; next token's embedding], and one more pass of the shared head.
  int64_t mtp_layers = 0;

  int64_t head_dim() const { return attention_head_dim > 0 ? attention_head_dim : n_embd / n_head; }
  int64_t q_dim() const { return n_head * head_dim(); }  // q's width, and the attention output's
  int64_t kv_dim() const { return n_kv_head * head_dim(); }
  bool is_moe() const { return n_experts > 0; }
  bool is_hybrid() const { return !hybrid_pattern.empty(); }
  // A layer's symbol in the hybrid pattern; a transformer's layers are all 'T' (attention + MLP).
  char layer_kind(int64_t layer) const {
    return is_hybrid() ? hybrid_pattern[static_cast<size_t>(layer)] : 'T';
  }
  bool has_attention(int64_t layer) const {
    return layer_kind(layer) == 'T' || layer_kind(layer) == '*';
  }
  int64_t hybrid_layer_count(char kind) const;  // layers of that symbol
  int64_t attention_layer_count() const;        // hybrid '*'; a transformer's every layer
  int64_t dense_mlp_layer_count() const;        // hybrid '-'; a transformer's non-MoE layers
  int64_t mamba_inner() const { return mamba_heads * mamba_head_dim; }
  int64_t mamba_conv_channels() const { return mamba_inner() + 2 * mamba_groups * mamba_state; }
  // in_proj's output: z and x (d_inner each), B and C (groups x state each), dt (one per head).
  int64_t mamba_in_proj() const {
    return 2 * mamba_inner() + 2 * mamba_groups * mamba_state + mamba_heads;
  }
  // The SSD scan's forward FLOPs per token (chunked; Dao & Gu 2024, sec. 6): C B^T within a
  // chunk per group (2 Q N G), its masked product with x per head (2 Q d_inner), the chunk states
  // B^T x and their read-out C h (2 x 2 N d_inner).
  double mamba_scan_flops_per_token() const;
  // One Mamba-2 mixer's parameters with its pre-norm: in_proj, conv1d (weights and bias),
  // dt_bias, A_log, D, the gated RMSNorm over d_inner, out_proj.
  int64_t mamba_parameter_count() const;
  int64_t expert_ffn() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_hidden; }
  bool is_moe_layer(int64_t layer) const {
    if (is_hybrid()) return layer_kind(layer) == 'E';
    return is_moe() && layer >= moe_first_dense && (layer - moe_first_dense) % moe_every == 0;
  }
  int64_t moe_layer_count() const;
  bool is_windowed_layer(int64_t layer) const {
    return sliding_window > 0 && !is_hybrid() &&
           (global_attention_every == 0 || (layer + 1) % global_attention_every != 0);
  }
  int64_t windowed_layer_count() const;
  // Keys a query meets on average in a layer over seq_len tokens: seq_len / 2 for causal
  // attention (the convention of 6N + 6 L s C FLOP counts), under a window shorter than the
  // sequence the exact mean, sum_i min(i + 1, W) / seq_len.
  double mean_keys_per_query(int64_t layer, int64_t seq_len) const;
  // Parameters of one expert MLP of expert_ffn() (SwiGLU: gate, up, down; GPT-2: c_fc, c_proj
  // with biases), and of one dense MLP of ffn_hidden.
  int64_t expert_parameter_count() const;
  int64_t dense_mlp_parameter_count() const;
  // Exact parameter count of the model as loom builds it.
  int64_t parameter_count() const;
  // Throws loom::Error naming the first inconsistent field.
  void validate() const;
  void validate_hybrid() const;  // the hybrid, squared-ReLU, latent-MoE and MTP fields
};

// Named presets: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama-1b, llama-3b, llama-8b,
// llama-70b, llama-405b, mixtral-8x7b, deepseek-v3-gqa (DeepSeek-V3's experts and layers, full
// attention in place of MLA), deepseek-v3-small (the same family at CPU size). Throws loom::Error listing the known names for an unknown one.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace loom
