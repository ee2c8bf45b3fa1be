#pragma once
// Rotary position embedding (Su et al. 2021) in the "rotate half" layout Hugging Face's
// Llama uses: within a head of size d, element i pairs with i + d/2 and both rotate by
// pos * theta^(-2i/d). Applied in place to the q and k heads of a fused qkv buffer.
#include <cstdint>
#include <vector>

namespace loom::cpu {

struct RopeTable {
  int64_t head_dim = 0;
  int64_t max_positions = 0;
  std::vector<float> cos, sin;  // [max_positions, head_dim / 2]
};
// Llama 3.1's frequency scaling for long contexts ("rope_type": "llama3" in Hugging Face's
// config): with wavelength w = 2 pi / f of each frequency f and L the original context,
// w < L / high_freq_factor keeps f, w > L / low_freq_factor divides it by `factor`, and in
// between f blends the two: (1 - s) f / factor + s f with s = (L / w - low) / (high - low).
// factor = 0: plain RoPE.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_positions = 8192;
};
RopeTable make_rope_table(int64_t head_dim, int64_t max_positions, double theta, const RopeScaling& scaling = {});
// The frequency of pair i (the angle per position), as the table uses it.
double rope_frequency(int64_t i, int64_t head_dim, double theta, const RopeScaling& scaling = {});

// x: rows of `tokens` (b*t, position = positions[row], or row % seq_len without them), each
// with `heads` heads of head_dim, at stride `row_ld`. inverse=true rotates by -angle (the
// backward of the forward rotation).
void rope_apply(float* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t row_ld,
                const RopeTable& table, bool inverse, const int32_t* positions = nullptr);

}  // namespace loom::cpu
