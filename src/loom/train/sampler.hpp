#pragma once
// Autoregressive sampling with temperature and top-k. Randomness comes from a counter-based
// generator keyed by the seed and indexed by token position, so a seed always gives the same text.
#include <cstdint>
#include <vector>

#include "loom/model/transformer.hpp"

namespace loom {

struct SampleOptions {
  int64_t new_tokens = 64;
  double temperature = 0.8;  // <= 0 means greedy
  int64_t top_k = 40;        // <= 0 means the whole vocabulary
  uint64_t seed = 1;
  int32_t stop_token = -1;   // stop early when produced (e.g. end-of-text)
};

// Continues `prompt` (non-empty) and returns only the new tokens. The context is cropped to the
// model's max_seq_len (no KV cache: each step reruns the forward, fine for short samples).
std::vector<int32_t> sample_tokens(Transformer& model, const std::vector<int32_t>& prompt,
                                   const SampleOptions& options);

}  // namespace loom
