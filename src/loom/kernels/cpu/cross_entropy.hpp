#pragma once
// Fused output projection + softmax + cross-entropy. Logits are produced one vocabulary
// chunk at a time ([rows, vocab_chunk] at most), reduced with an online log-sum-exp, and
// never stored for the whole vocabulary. With gradients requested, a second pass recomputes
// each chunk's logits and turns them into softmax - onehot on the spot, so the [rows, vocab]
// gradient of the logits never exists either. If one chunk covers the whole vocabulary, the
// logits of pass one are reused and no recomputation happens.
#include <cstdint>

namespace loom::cpu {

struct CrossEntropyArgs {
  const float* hidden;      // [rows, dim] input to the output projection
  const float* weight;      // [vocab, dim] output projection (tied token embedding or lm_head)
  const int32_t* targets;   // [rows]; a negative target is ignored (no loss, no gradient)
  int64_t rows, dim, vocab;
  int64_t vocab_chunk;      // logits computed per chunk of this many vocabulary entries
  float grad_scale;         // gradient of (grad_scale * sum of row losses)
  float* d_hidden;          // [rows, dim] overwritten, or null for loss only
  float* d_weight;          // [vocab, dim] accumulated, or null
  float* row_losses;        // [rows] optional per-row loss output
  float* workspace;         // [rows, vocab_chunk] scratch, or null to allocate one
};

// Returns the sum of the losses of all rows with a target (a double, so large batches add up
// without f32 drift).
double lm_head_cross_entropy(const CrossEntropyArgs& args);

}  // namespace loom::cpu
