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

void add_block(std::vector<ParameterSpec>& out, const ModelConfig& c, int64_t layer) {
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
  add(gpt2 ? "transformer.ln_f.weight" : "model.norm.weight", {c.n_embd}, kWhole, ModelPart::FinalNorm);
  if (gpt2) add("transformer.ln_f.bias", {c.n_embd}, kWhole, ModelPart::FinalNorm);
  for (int64_t l = c.n_layer - 1; l >= 0; --l) add_block(out, c, l);
  add(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight", {c.vocab_size, c.n_embd}, kColumns,
      ModelPart::TokenTable);
  if (gpt2) add("transformer.wpe.weight", {c.max_seq_len, c.n_embd}, kWhole, ModelPart::PositionTable);
  return out;
}

}  // namespace loom
