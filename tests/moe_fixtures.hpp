#pragma once
// Mixture-of-experts layers filled with seeded random weights, shared by the MoE and FP8 MoE
// tests.
#include <algorithm>
#include <vector>

#include "gradcheck.hpp"
#include "loom/model/moe.hpp"

namespace loom::test {

inline void fill(Parameter& p, uint64_t seed, float scale) {
  const std::vector<float> v = random_vector(static_cast<size_t>(p.value.numel()), seed, scale);
  std::copy(v.begin(), v.end(), p.value.f32());
}

// The router at scale 0.5, every expert's (and the shared experts') weights at 0.3, each from
// its own seed.
inline void fill_layer(MoeLayer& layer, uint64_t seed) {
  fill(layer.router, seed, 0.5f);
  if (layer.spec().shared_experts > 0) {
    fill(layer.shared_gate, seed + 101, 0.3f);
    fill(layer.shared_up, seed + 102, 0.3f);
    fill(layer.shared_down, seed + 103, 0.3f);
  }
  for (size_t e = 0; e < layer.gate.size(); ++e) {
    fill(layer.gate[e], seed + 10 * e + 1, 0.3f);
    fill(layer.up[e], seed + 10 * e + 2, 0.3f);
    fill(layer.down[e], seed + 10 * e + 3, 0.3f);
  }
}

}  // namespace loom::test
