#include "loom/train/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"

namespace loom {

std::vector<int32_t> sample_tokens(Transformer& model, const std::vector<int32_t>& prompt,
                                   const SampleOptions& options) {
  if (prompt.empty()) throw_error("sampling needs a non-empty prompt");
  const int64_t vocab = model.config().vocab_size, max_len = model.config().max_seq_len;
  const CounterRng rng(options.seed, 0x5a3b1e);
  std::vector<int32_t> context = prompt, generated;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int64_t step = 0; step < options.new_tokens; ++step) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - max_len);
    const std::vector<float> logits =
        model.last_logits(context.data() + start, 1, static_cast<int64_t>(context.size()) - start);
    int32_t next = 0;
    if (options.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      std::vector<double> weights(static_cast<size_t>(k));
      double total = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        weights[i] = std::exp((logits[order[i]] - logits[order[0]]) / options.temperature);
        total += weights[i];
      }
      double u = rng.uniform(static_cast<uint64_t>(step)) * total;
      next = order[static_cast<size_t>(k - 1)];
      for (int64_t i = 0; i < k; ++i) {
        if ((u -= weights[i]) <= 0) {
          next = order[i];
          break;
        }
      }
    }
    if (next == options.stop_token) break;
    generated.push_back(next);
    context.push_back(next);
  }
  return generated;
}

}  // namespace loom
