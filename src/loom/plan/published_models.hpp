#pragma once
// Published architectures of well-known models, for runs that name a model but leave its
// dimensions out ("LLaMA 13B", "Llama 3 405B", "GPT-3 175B"). Each entry cites the paper or
// model card its dimensions come from. Models loom cannot describe (multi-head latent
// attention, head widths other than hidden / heads) are listed with the reason, so a run
// naming them is refused with it rather than predicted on a wrong shape.
#include <cstdint>
#include <optional>
#include <string>

#include "loom/model/config.hpp"

namespace loom::plan {

struct PublishedModel {
  std::string name;             // as matched, e.g. "LLaMA 13B"
  ModelConfig config;           // max_seq_len: the context the model was pre-trained with
  int64_t batch_tokens = 0;     // the pre-training global batch in tokens, 0 if not published
  std::string source;           // where the dimensions come from
  std::string not_representable;  // non-empty: why loom's ModelConfig cannot hold this model
  // Non-empty: `config` stands in for an architecture ModelConfig cannot hold exactly, and how;
  // the run is answered with this printed among its assumptions.
  std::string approximation;
};

// The preset whose family and size the printed name matches (case-insensitive; "LLaMA 30B"
// and "LLaMA-33B" are the same model; "Llama 3.1 8B" matches Llama 3 8B). nullopt when none
// matches.
std::optional<PublishedModel> find_published_model(const std::string& printed_name);
// The family key a printed name belongs to ("llama3", "gpt2", "deepseekv3", ...), "" when none.
std::string published_family(const std::string& printed_name);

}  // namespace loom::plan
