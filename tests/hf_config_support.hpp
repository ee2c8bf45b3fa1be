#pragma once
// What the checkpoint and HF config tests share: two small models and a field-by-field
// comparison of model configs.
#include <gtest/gtest.h>

#include "loom/model/config.hpp"

namespace loom::test {

inline ModelConfig hf_tiny_gpt2() {
  ModelConfig c;
  c.arch = Architecture::GPT2;
  c.vocab_size = 16;
  c.max_seq_len = 8;
  c.n_layer = 1;
  c.n_embd = 4;
  c.n_head = c.n_kv_head = 2;
  c.ffn_hidden = 16;
  return c;
}

inline ModelConfig gqa_llama() {
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.vocab_size = 320;
  c.max_seq_len = 256;
  c.n_layer = 3;
  c.n_embd = 64;
  c.n_head = 8;
  c.n_kv_head = 2;
  c.ffn_hidden = 176;
  c.tied_embeddings = false;
  c.norm_eps = 1e-6;
  c.rope_theta = 500000.0;
  return c;
}

inline void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.attention_head_dim, b.attention_head_dim);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.global_attention_every, b.global_attention_every);
  EXPECT_EQ(a.ffn_hidden, b.ffn_hidden);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.experts_per_token, b.experts_per_token);
  EXPECT_EQ(a.moe_router, b.moe_router);
  EXPECT_EQ(a.moe_aux_loss_coef, b.moe_aux_loss_coef);
  EXPECT_EQ(a.moe_z_loss_coef, b.moe_z_loss_coef);
  EXPECT_EQ(a.moe_capacity_factor, b.moe_capacity_factor);
  EXPECT_EQ(a.moe_bias_rate, b.moe_bias_rate);
}

}  // namespace loom::test
