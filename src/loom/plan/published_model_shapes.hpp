#pragma once
// The shapes published_models.cpp and published_models_more.cpp build their presets from, and
// the entry both tables hold. Internal to the two.
#include <cstdint>
#include <vector>

#include "loom/model/config.hpp"
#include "loom/plan/published_models.hpp"

namespace loom::plan::published_model_table {

inline ModelConfig llama_shape(int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads,
                               int64_t ffn, int64_t vocab, int64_t seq) {
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.n_layer = layers;
  c.n_embd = hidden;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.ffn_hidden = ffn;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.tied_embeddings = false;
  return c;
}

inline ModelConfig gpt_shape(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab,
                             int64_t seq) {
  ModelConfig c;
  c.arch = Architecture::GPT2;
  c.n_layer = layers;
  c.n_embd = hidden;
  c.n_head = c.n_kv_head = heads;
  c.ffn_hidden = 4 * hidden;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.tied_embeddings = true;
  return c;
}

inline ModelConfig moe_shape(ModelConfig c, int64_t experts, int64_t top_k) {
  c.n_experts = experts;
  c.experts_per_token = top_k;
  return c;
}

inline ModelConfig tied(ModelConfig c) {
  c.tied_embeddings = true;
  return c;
}

// Heads of their own width (HF's head_dim), when n_head x head_dim is not the hidden size.
inline ModelConfig heads_of(ModelConfig c, int64_t head_dim) {
  c.attention_head_dim = head_dim;
  return c;
}

// Experts narrower than the dense MLP (fine-grained experts); every layer a mixture.
inline ModelConfig experts_of(ModelConfig c, int64_t experts, int64_t top_k, int64_t expert_ffn) {
  c.n_experts = experts;
  c.experts_per_token = top_k;
  c.moe_ffn_hidden = expert_ffn;
  return c;
}

// Sliding-window attention: a window of `window` keys, every `global_every`-th layer global.
inline ModelConfig windowed(ModelConfig c, int64_t window, int64_t global_every) {
  c.sliding_window = window;
  c.global_attention_every = global_every;
  return c;
}

struct Entry {
  const char* family;  // normalised family key (see family_of)
  double size_b;       // the size as models are named ("13" for LLaMA 13B)
  PublishedModel model;
  // Models a family names by variant rather than size (Llama 4 Scout and Maverick are both
  // "17B"): a pattern the lower-case name matches, tried before the size.
  const char* variant = nullptr;
  // Matched by its variant only, and only when a stated size agrees (not by size alone).
  bool variant_only = false;
};

// Shared experts of the routed experts' width, a dense MLP of ffn_hidden on the layers that are
// not mixtures (moe_first_dense, moe_every).
inline ModelConfig shared_experts(ModelConfig c, int64_t shared, int64_t first_dense,
                                  int64_t every) {
  c.n_shared_experts = shared;
  c.moe_first_dense = first_dense;
  c.moe_every = every;
  return c;
}

// The two tables: models of 2023-25 (published_models.cpp) and of 2019-24's GPU-trained
// papers and open releases (published_models_more.cpp).
const std::vector<Entry>& recent_entries();
const std::vector<Entry>& more_entries();
const std::vector<Entry>& hybrid_entries();  // published_models_hybrid.cpp

}  // namespace loom::plan::published_model_table
