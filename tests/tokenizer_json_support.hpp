#pragma once
// What the tokenizer.json tests share: the smallest byte-level BPE file (the 256 byte tokens
// under GPT-2's byte alphabet and one merge), to load or to alter into files loom refuses.
#include <nlohmann/json.hpp>
#include <string>

#include "loom/data/byte_level.hpp"

namespace loom::test {

inline nlohmann::json tiny_byte_level_file() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto alphabet = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    append_utf8(alphabet[b], spelled);
    vocab[spelled] = b;
  }
  vocab["ab"] = 256;
  return {
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}}};
}

}  // namespace loom::test
