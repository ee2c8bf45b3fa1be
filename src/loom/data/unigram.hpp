#pragma once
// The unigram baseline: cross-entropy (nats/token) of the validation tokens under the token
// frequencies of the training shards (add-one smoothed). A language model that has learned
// anything beyond word frequencies must beat it, so the demo reports its loss against it.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/data_loader.hpp"

namespace loom {

// With several training sources the frequencies are their weighted mixture: p(t) =
// sum_s w_s (c_s(t) + 1) / (N_s + V), the distribution the loader draws tokens from.
double unigram_cross_entropy(const std::vector<DataSource>& train, const std::string& val_pattern,
                             int64_t vocab_size);
double unigram_cross_entropy(const std::string& train_pattern, const std::string& val_pattern,
                             int64_t vocab_size);

}  // namespace loom
