#pragma once
// GPT-2's byte-level BPE tokenizer, bit-for-bit: the same byte-to-unicode alphabet, the same
// pre-tokenisation regex and the same merge order as openai/gpt-2's encoder.py, so that shards
// we write are interchangeable with llm.c's and with checkpoints trained on GPT-2 tokens.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom {

// One line of vocab.bpe: merging the pair creates token `merged_id`; lower rank merges first.
struct BpeMerge {
  int32_t rank;
  int32_t merged_id;
};

class Gpt2Tokenizer {
 public:
  // encoder.json maps token strings (in GPT-2's byte alphabet) to ids; vocab.bpe lists the
  // merges, one "left right" pair per line, in rank order after a "#version" line.
  static Gpt2Tokenizer load(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  // The same from the two files' contents; the names go into errors. What load() parses, and
  // what tests/fuzz/ feeds malformed files to.
  static Gpt2Tokenizer parse(const std::string& encoder_json, const std::string& vocab_bpe,
                             const std::string& encoder_json_name, const std::string& vocab_bpe_name);

  // `text` must be valid UTF-8 (GPT-2 encodes Python str, never raw bytes). Special tokens are
  // not recognised: "<|endoftext|>" in the text is encoded as ordinary characters.
  // Safe to call from several threads at once.
  std::vector<int32_t> encode(std::string_view text) const;

  // Returns the raw bytes; a token list cut inside a multi-byte character yields the partial
  // bytes (GPT-2's Python decoder would substitute U+FFFD instead).
  std::string decode(const std::vector<int32_t>& tokens) const;

  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  int32_t eot_token() const { return eot_token_; }

 private:
  struct CompiledPattern;  // PCRE2 state, kept out of this header

  Gpt2Tokenizer() = default;
  // Appends the BPE tokens of one pre-tokenised word to `out`.
  void append_word_tokens(std::string_view word, std::vector<int32_t>& out) const;
  const BpeMerge* find_merge(int32_t left_id, int32_t right_id) const;

  std::vector<std::string> token_bytes_;           // id -> the raw bytes it stands for
  int32_t byte_token_[256] = {};                   // byte value -> id of its one-byte token
  std::unordered_map<uint64_t, BpeMerge> merges_;  // (left_id << 32 | right_id) -> merge
  int32_t eot_token_ = -1;
  std::shared_ptr<const CompiledPattern> pattern_;
};

}  // namespace loom
