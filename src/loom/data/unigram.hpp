#pragma once
// The unigram baseline: cross-entropy (nats/token) of the validation tokens under the token
// frequencies of the training shards (add-one smoothed). A language model that has learned
// anything beyond word frequencies must beat it, so the demo reports its loss against it.
#include <cstdint>
#include <string>

namespace loom {

double unigram_cross_entropy(const std::string& train_pattern, const std::string& val_pattern,
                             int64_t vocab_size);

}  // namespace loom
