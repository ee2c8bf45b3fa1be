#include "loom/model/parameter_specs.hpp"

namespace loom {

namespace {

void add_block(std::vector<ParameterSpec>& out, const ModelConfig& c, int64_t layer) {
  const int64_t unit = layer + 1, h = c.n_embd, f = c.ffn_hidden;
  auto add = [&](const std::string& name, Shape shape) { out.push_back({name, std::move(shape), unit}); };
  if (c.arch == Architecture::GPT2) {
    const std::string p = "transformer.h." + std::to_string(layer);
    add(p + ".ln_1.weight", {h});
    add(p + ".ln_1.bias", {h});
    add(p + ".attn.c_attn.weight", {3 * h, h});
    add(p + ".attn.c_attn.bias", {3 * h});
    add(p + ".attn.c_proj.weight", {h, h});
    add(p + ".attn.c_proj.bias", {h});
    add(p + ".ln_2.weight", {h});
    add(p + ".ln_2.bias", {h});
    if (c.is_moe()) {
      add(p + ".mlp.router.weight", {c.n_experts, h});
      for (int64_t e = 0; e < c.n_experts; ++e) {
        const std::string x = p + ".mlp.experts." + std::to_string(e);
        for (auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
                 {".c_fc.weight", {f, h}}, {".c_fc.bias", {f}}, {".c_proj.weight", {h, f}}, {".c_proj.bias", {h}}})
          out.push_back({x + name, shape, unit, true});
      }
      return;
    }
    add(p + ".mlp.c_fc.weight", {f, h});
    add(p + ".mlp.c_fc.bias", {f});
    add(p + ".mlp.c_proj.weight", {h, f});
    add(p + ".mlp.c_proj.bias", {h});
    return;
  }
  const std::string p = "model.layers." + std::to_string(layer);
  add(p + ".input_layernorm.weight", {h});
  add(p + ".self_attn.q_proj.weight", {h, h});
  add(p + ".self_attn.k_proj.weight", {c.kv_dim(), h});
  add(p + ".self_attn.v_proj.weight", {c.kv_dim(), h});
  add(p + ".self_attn.o_proj.weight", {h, h});
  add(p + ".post_attention_layernorm.weight", {h});
  if (c.is_moe()) {  // Mixtral's names: w1 gate, w3 up, w2 down
    add(p + ".block_sparse_moe.gate.weight", {c.n_experts, h});
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string x = p + ".block_sparse_moe.experts." + std::to_string(e);
      out.push_back({x + ".w1.weight", {f, h}, unit, true});
      out.push_back({x + ".w3.weight", {f, h}, unit, true});
      out.push_back({x + ".w2.weight", {h, f}, unit, true});
    }
    return;
  }
  add(p + ".mlp.gate_proj.weight", {f, h});
  add(p + ".mlp.up_proj.weight", {f, h});
  add(p + ".mlp.down_proj.weight", {h, f});
}

}  // namespace

std::vector<ParameterSpec> parameter_specs(const ModelConfig& c) {
  c.validate();
  const bool gpt2 = c.arch == Architecture::GPT2;
  std::vector<ParameterSpec> out;
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.n_embd}, 0});
  out.push_back({gpt2 ? "transformer.ln_f.weight" : "model.norm.weight", {c.n_embd}, 0});
  if (gpt2) out.push_back({"transformer.ln_f.bias", {c.n_embd}, 0});
  for (int64_t l = c.n_layer - 1; l >= 0; --l) add_block(out, c, l);
  out.push_back({gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight", {c.vocab_size, c.n_embd}, 0});
  if (gpt2) out.push_back({"transformer.wpe.weight", {c.max_seq_len, c.n_embd}, 0});
  return out;
}

}  // namespace loom
