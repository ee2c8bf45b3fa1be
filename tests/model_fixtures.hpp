#pragma once
// Tiny model configurations and batches shared by model, trainer and parity tests.
#include <vector>

#include "loom/core/rng.hpp"
#include "loom/model/config.hpp"

namespace loom::test {

inline ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.arch = Architecture::GPT2;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = c.n_kv_head = 4;
  c.ffn_hidden = 128;
  c.tied_embeddings = true;
  return c;
}

inline ModelConfig tiny_llama() {
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 48;
  c.tied_embeddings = false;
  c.rope_theta = 10000.0;
  return c;
}

inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  CounterRng rng(seed, 7);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<int32_t>(rng.bits(static_cast<uint64_t>(i)) % static_cast<uint64_t>(vocab));
  return out;
}

}  // namespace loom::test
