#include "loom/data/unigram.hpp"

#include <cmath>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/data_loader.hpp"
#include "loom/data/token_shard.hpp"

namespace loom {

double unigram_cross_entropy(const std::string& train_pattern, const std::string& val_pattern,
                             int64_t vocab_size) {
  return unigram_cross_entropy(std::vector<DataSource>{{train_pattern, 1.0}}, val_pattern, vocab_size);
}

double unigram_cross_entropy(const std::vector<DataSource>& train, const std::string& val_pattern,
                             int64_t vocab_size) {
  double weight_sum = 0;
  for (const DataSource& source : train) weight_sum += source.weight;
  std::vector<double> probability(static_cast<size_t>(vocab_size), 0.0);
  for (const DataSource& source : train) {
    std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);  // add-one smoothing
    double total = static_cast<double>(vocab_size);
    for (const std::string& path : expand_shard_pattern(source.pattern)) {
      const ShardTokens tokens = read_token_shard(path, vocab_size);
      for (int64_t i = 0; i < tokens.size(); ++i) {
        counts[static_cast<size_t>(tokens[i])] += 1.0;
        total += 1.0;
      }
    }
    for (size_t t = 0; t < counts.size(); ++t) probability[t] += source.weight / weight_sum * counts[t] / total;
  }
  double nats = 0.0;
  int64_t n = 0;
  for (const std::string& path : expand_shard_pattern(val_pattern)) {
    const ShardTokens tokens = read_token_shard(path, vocab_size);
    for (int64_t i = 0; i < tokens.size(); ++i) {
      nats -= std::log(probability[static_cast<size_t>(tokens[i])]);
      ++n;
    }
  }
  if (n == 0) throw_error("unigram baseline: no validation tokens in ", val_pattern);
  return nats / static_cast<double>(n);
}

}  // namespace loom
