#include "loom/model/parameter_specs.hpp"

#include <algorithm>

namespace loom {

int64_t ParameterSpec::numel_on_tp_rank(int64_t tp, int64_t rank) const {
  if (tp_dim < 0 || tp <= 1) return numel();
  const int64_t rows = shape[static_cast<size_t>(tp_dim)], block = (rows + tp - 1) / tp;
  const int64_t mine = std::min(rows, (rank + 1) * block) - std::min(rows, rank * block);
  return numel() / rows * mine;
}

namespace {

// Split dimensions (parallel/tensor_parallel_plan): column-parallel layers split their output
// rows, row-parallel layers their input columns; whole: norms, row-parallel biases, routers.
constexpr int kColumns = 0, kRows = 1, kWhole = -1;

// One block of a hybrid Mamba stack (ModelConfig::hybrid_pattern), under the names of
// transformers' NemotronH: its pre-norm and its mixer, one of Mamba-2, attention, MLP or experts.
// Megatron-LM splits a Mamba mixer over tp by heads: in_proj's z, x, B, C and dt rows, the
// convolution's channels, the per-head dt_bias, A_log and D, the gated norm's d_inner and
// out_proj's input columns.
void add_hybrid_block(std::vector<ParameterSpec>& out, const ModelConfig& c, int64_t layer) {
  const int64_t unit = layer + 1, h = c.n_embd;
  auto add = [&](const std::string& name, Shape shape, int tp_dim, int64_t expert = -1) {
    out.push_back({name, std::move(shape), unit, expert >= 0, tp_dim, ModelPart::Block, expert});
  };
  const std::string p = "backbone.layers." + std::to_string(layer), m = p + ".mixer";
  add(p + ".norm.weight", {h}, kWhole);
  // An MLP of width w on an input of width in: up and down, or gate, up and down (SwiGLU).
  auto mlp = [&](const std::string& x, int64_t in, int64_t w, int64_t expert) {
    if (!c.squared_relu_mlp) add(x + ".gate_proj.weight", {w, in}, kColumns, expert);
    add(x + ".up_proj.weight", {w, in}, kColumns, expert);
    add(x + ".down_proj.weight", {in, w}, kRows, expert);
  };
  switch (c.layer_kind(layer)) {
    case 'M':
      add(m + ".in_proj.weight", {c.mamba_in_proj(), h}, kColumns);
      add(m + ".conv1d.weight", {c.mamba_conv_channels(), 1, c.mamba_conv}, kColumns);
      add(m + ".conv1d.bias", {c.mamba_conv_channels()}, kColumns);
      add(m + ".dt_bias", {c.mamba_heads}, kColumns);
      add(m + ".A_log", {c.mamba_heads}, kColumns);
      add(m + ".D", {c.mamba_heads}, kColumns);
      add(m + ".norm.weight", {c.mamba_inner()}, kColumns);
      add(m + ".out_proj.weight", {h, c.mamba_inner()}, kRows);
      return;
    case '*':
      add(m + ".q_proj.weight", {c.q_dim(), h}, kColumns);
      add(m + ".k_proj.weight", {c.kv_dim(), h}, kColumns);
      add(m + ".v_proj.weight", {c.kv_dim(), h}, kColumns);
      add(m + ".o_proj.weight", {h, c.q_dim()}, kRows);
      return;
    case '-': mlp(m, h, c.ffn_hidden, -1); return;
    default: {  // 'E'
      add(m + ".gate.weight", {c.n_experts, h}, kWhole);
      const int64_t in = c.moe_latent > 0 ? c.moe_latent : h;
      if (c.moe_latent > 0) {
        add(m + ".fc1_latent_proj.weight", {c.moe_latent, h}, kWhole);
        add(m + ".fc2_latent_proj.weight", {h, c.moe_latent}, kWhole);
      }
      for (int64_t e = 0; e < c.n_experts; ++e)
        mlp(m + ".experts." + std::to_string(e), in, c.expert_ffn(), e);
      if (c.n_shared_experts > 0)
        mlp(m + ".shared_experts", h, c.n_shared_experts * c.expert_ffn(), -1);
      return;
    }
  }
}

void add_block(std::vector<ParameterSpec>& out, const ModelConfig& c, int64_t layer) {
  if (c.is_hybrid()) {
    add_hybrid_block(out, c, layer);
    return;
  }
  const int64_t unit = layer + 1, h = c.n_embd, f = c.is_moe_layer(layer) ? c.expert_ffn() : c.ffn_hidden;
  auto add = [&](const std::string& name, Shape shape, int tp_dim, int64_t expert = -1) {
    out.push_back({name, std::move(shape), unit, expert >= 0, tp_dim, ModelPart::Block, expert});
  };
  if (c.arch == Architecture::GPT2) {
    const std::string p = "transformer.h." + std::to_string(layer);
    add(p + ".ln_1.weight", {h}, kWhole);
    add(p + ".ln_1.bias", {h}, kWhole);
    add(p + ".attn.c_attn.weight", {3 * h, h}, kColumns);
    add(p + ".attn.c_attn.bias", {3 * h}, kColumns);
    add(p + ".attn.c_proj.weight", {h, h}, kRows);
    add(p + ".attn.c_proj.bias", {h}, kWhole);
    add(p + ".ln_2.weight", {h}, kWhole);
    add(p + ".ln_2.bias", {h}, kWhole);
    if (c.is_moe_layer(layer)) {
      add(p + ".mlp.router.weight", {c.n_experts, h}, kWhole);
      for (int64_t e = 0; e < c.n_experts; ++e) {
        const std::string x = p + ".mlp.experts." + std::to_string(e);
        add(x + ".c_fc.weight", {f, h}, kColumns, e);
        add(x + ".c_fc.bias", {f}, kColumns, e);
        add(x + ".c_proj.weight", {h, f}, kRows, e);
        add(x + ".c_proj.bias", {h}, kWhole, e);
      }
      return;
    }
    add(p + ".mlp.c_fc.weight", {f, h}, kColumns);
    add(p + ".mlp.c_fc.bias", {f}, kColumns);
    add(p + ".mlp.c_proj.weight", {h, f}, kRows);
    add(p + ".mlp.c_proj.bias", {h}, kWhole);
    return;
  }
  const std::string p = "model.layers." + std::to_string(layer);
  add(p + ".input_layernorm.weight", {h}, kWhole);
  add(p + ".self_attn.q_proj.weight", {c.q_dim(), h}, kColumns);
  add(p + ".self_attn.k_proj.weight", {c.kv_dim(), h}, kColumns);
  add(p + ".self_attn.v_proj.weight", {c.kv_dim(), h}, kColumns);
  add(p + ".self_attn.o_proj.weight", {h, c.q_dim()}, kRows);
  add(p + ".post_attention_layernorm.weight", {h}, kWhole);
  if (c.is_moe_layer(layer)) {  // Mixtral's names: w1 gate, w3 up, w2 down
    add(p + ".block_sparse_moe.gate.weight", {c.n_experts, h}, kWhole);
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string x = p + ".block_sparse_moe.experts." + std::to_string(e);
      add(x + ".w1.weight", {f, h}, kColumns, e);
      add(x + ".w3.weight", {f, h}, kColumns, e);
      add(x + ".w2.weight", {h, f}, kRows, e);
    }
    if (c.n_shared_experts > 0) {  // one MLP for every token, held whole by every ep rank
      const std::string x = p + ".block_sparse_moe.shared_experts";
      const int64_t w = c.n_shared_experts * f;
      add(x + ".w1.weight", {w, h}, kColumns);
      add(x + ".w3.weight", {w, h}, kColumns);
      add(x + ".w2.weight", {h, w}, kRows);
    }
    return;
  }
  add(p + ".mlp.gate_proj.weight", {f, h}, kColumns);
  add(p + ".mlp.up_proj.weight", {f, h}, kColumns);
  add(p + ".mlp.down_proj.weight", {h, f}, kRows);
}

}  // namespace

std::vector<ParameterSpec> parameter_specs(const ModelConfig& c) {
  c.validate();
  const bool gpt2 = c.arch == Architecture::GPT2;
  std::vector<ParameterSpec> out;
  auto add = [&](const std::string& name, Shape shape, int tp_dim, ModelPart part) {
    out.push_back({name, std::move(shape), 0, false, tp_dim, part});
  };
  // The token table and the head are vocabulary-parallel: blocks of ceil(V / tp) rows.
  if (!c.tied_embeddings) add("lm_head.weight", {c.vocab_size, c.n_embd}, kColumns, ModelPart::OutputHead);
  const bool hybrid = c.is_hybrid();
  add(gpt2     ? "transformer.ln_f.weight"
      : hybrid ? "backbone.norm_f.weight"
               : "model.norm.weight",
      {c.n_embd}, kWhole, ModelPart::FinalNorm);
  if (gpt2) add("transformer.ln_f.bias", {c.n_embd}, kWhole, ModelPart::FinalNorm);
  for (int64_t l = c.n_layer - 1; l >= 0; --l) add_block(out, c, l);
  add(gpt2     ? "transformer.wte.weight"
      : hybrid ? "backbone.embeddings.weight"
               : "model.embed_tokens.weight",
      {c.vocab_size, c.n_embd}, kColumns, ModelPart::TokenTable);
  if (gpt2) add("transformer.wpe.weight", {c.max_seq_len, c.n_embd}, kWhole, ModelPart::PositionTable);
  return out;
}

}  // namespace loom
