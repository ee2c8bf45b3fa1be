#pragma once
// Counter-based random numbers (SplitMix64 mixing of seed + stream + index): the value at
// any index is a pure function of (seed, stream, index), so initialisation and sampling are
// reproducible across thread counts and platforms, and resuming needs only a counter.
#include <cmath>
#include <cstdint>

namespace loom {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream) : key_(splitmix64(seed ^ splitmix64(stream))) {}
  uint64_t bits(uint64_t index) const { return splitmix64(key_ + index * 0xd1b54a32d192ed03ull); }
  // Uniform in (0, 1): never exactly 0, so log() is safe.
  double uniform(uint64_t index) const {
    return (static_cast<double>(bits(index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  // Standard normal by Box-Muller from two independent uniforms.
  double normal(uint64_t index) const {
    const double u1 = uniform(2 * index), u2 = uniform(2 * index + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t key_;
};

}  // namespace loom
