#include "loom/data/bpe_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <queue>

#include "loom/core/error.hpp"
#include "loom/data/byte_level.hpp"

namespace loom {
namespace {

uint64_t pair_key(int32_t left_id, int32_t right_id) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left_id)) << 32) |
         static_cast<uint32_t>(right_id);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

std::string pcre2_message(int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof(message));
  return reinterpret_cast<const char*>(message);
}

}  // namespace

struct BpeTokenizer::CompiledPatterns {
  std::vector<pcre2_code*> codes;

  CompiledPatterns(const std::vector<std::string>& patterns, const std::string& source) {
    for (const std::string& pattern : patterns) {
      int error_code = 0;
      PCRE2_SIZE error_offset = 0;
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
      if (code == nullptr) {
        free_all();
        throw_error("tokenizer '", source, "': PCRE2 cannot compile the pre-tokeniser pattern '",
                    pattern, "' at offset ", error_offset, ": ", pcre2_message(error_code));
      }
      // JIT is several times faster; where unavailable pcre2_match interprets the same pattern.
      pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
      codes.push_back(code);
    }
  }
  ~CompiledPatterns() { free_all(); }
  CompiledPatterns(const CompiledPatterns&) = delete;
  CompiledPatterns& operator=(const CompiledPatterns&) = delete;

 private:
  void free_all() {
    for (pcre2_code* code : codes) pcre2_code_free(code);
    codes.clear();
  }
};

BpeTokenizer::BpeTokenizer(BpeDefinition definition)
    : source_(std::move(definition.source)),
      token_bytes_(std::move(definition.token_bytes)),
      ignore_merges_(definition.ignore_merges),
      template_prefix_(std::move(definition.template_prefix)),
      template_suffix_(std::move(definition.template_suffix)),
      document_token_(definition.document_token) {
  const auto defined = [&](int64_t id) {
    return id >= 0 && id < vocab_size() && !token_bytes_[static_cast<size_t>(id)].empty();
  };
  vocabulary_ids_.reserve(token_bytes_.size());
  for (size_t id = 0; id < token_bytes_.size(); ++id) {
    if (token_bytes_[id].empty()) continue;
    if (!vocabulary_ids_.emplace(token_bytes_[id], static_cast<int32_t>(id)).second) {
      throw_error("tokenizer '", source_, "': ids ", vocabulary_ids_.at(token_bytes_[id]), " and ",
                  id, " stand for the same bytes");
    }
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocabulary_ids_.find(std::string(1, static_cast<char>(b)));
    if (it == vocabulary_ids_.end()) {
      std::string spelled;
      append_utf8(byte_level_alphabet()[b], spelled);
      throw_error("tokenizer '", source_, "' has no token for byte ", b, " (spelled '", spelled,
                  "'); byte-level BPE needs all 256 bytes");
    }
    byte_token_[b] = it->second;
  }
  merges_.reserve(definition.merges.size());
  for (size_t rank = 0; rank < definition.merges.size(); ++rank) {
    const auto [left, right, merged] = definition.merges[rank];
    LOOM_CHECK(defined(left) && defined(right) && defined(merged), "merge ", rank, " of '", source_,
               "' names an id without a token");
    merges_[pair_key(left, right)] = Merge{static_cast<int32_t>(rank), merged};
  }
  for (BpeDefinition::AddedToken& added : definition.added_tokens) {
    if (added.content.empty())
      throw_error("tokenizer '", source_, "': added token ", added.id, " has no text");
    if (added.id < 0 || added.id > kMaxTokenId) {
      throw_error("tokenizer '", source_, "': added token '", added.content, "' has id ", added.id,
                  ", outside [0, ", kMaxTokenId, "]");
    }
    if (defined(added.id) && token_bytes_[static_cast<size_t>(added.id)] != added.content) {
      throw_error("tokenizer '", source_, "': added token '", added.content, "' has id ", added.id,
                  ", which the vocabulary already gives to another token");
    }
    if (!added_ids_.emplace(added.content, added.id).second) {
      throw_error("tokenizer '", source_, "': the added token '", added.content,
                  "' is listed twice");
    }
    if (added.id >= vocab_size()) token_bytes_.resize(static_cast<size_t>(added.id) + 1);
    token_bytes_[static_cast<size_t>(added.id)] = added.content;
    added_by_first_byte_[static_cast<unsigned char>(added.content[0])].emplace_back(added.content,
                                                                                    added.id);
  }
  for (auto& candidates : added_by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  for (const int32_t id : template_prefix_) LOOM_CHECK(defined(id), "template token ", id);
  for (const int32_t id : template_suffix_) LOOM_CHECK(defined(id), "template token ", id);
  if (document_token_) LOOM_CHECK(defined(*document_token_), "document token ", *document_token_);
  patterns_ = std::make_shared<const CompiledPatterns>(definition.split_patterns, source_);
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    const fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json"))
      return load_tokenizer_json((dir / "tokenizer.json").string());
    if (fs::exists(dir / "encoder.json") || fs::exists(dir / "vocab.bpe"))
      return load_gpt2((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
    throw_error(
        "tokenizer directory '", path,
        "' holds neither tokenizer.json (Hugging Face) nor encoder.json and vocab.bpe (GPT-2)");
  }
  if (!fs::exists(path)) throw_error("tokenizer '", path, "' does not exist");
  return load_tokenizer_json(path);
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view text) const {
  if (const auto added = added_ids_.find(text); added != added_ids_.end()) return added->second;
  if (const auto entry = vocabulary_ids_.find(text); entry != vocabulary_ids_.end())
    return entry->second;
  return std::nullopt;
}

int32_t BpeTokenizer::document_token() const {
  if (!document_token_) {
    throw_error(
        "tokenizer '", source_,
        "' names no document token (its post-processor adds no BOS and it has no '<|endoftext|>'); "
        "name the token that starts each document, e.g. --document-token '<|begin_of_text|>'");
  }
  return *document_token_;
}

const BpeTokenizer::Merge* BpeTokenizer::find_merge(int32_t left_id, int32_t right_id) const {
  const auto it = merges_.find(pair_key(left_id, right_id));
  return it == merges_.end() ? nullptr : &it->second;
}

// encoder.py's bpe() rescans the word for the lowest-rank pair after every merge, which is
// quadratic in the word length (long runs of spaces or symbols are single words). A min-heap
// of candidate pairs over a linked list of symbols gives the same result in O(n log n): ties
// in rank are the same pair, merged left to right exactly as encoder.py's inner loop does.
// Hugging Face's tokenizers (models/bpe/word.rs, merge_all) is this very heap loop.
void BpeTokenizer::append_piece_tokens(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    if (const auto whole = vocabulary_ids_.find(piece); whole != vocabulary_ids_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;    // -1 once merged into its left neighbour
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // index of the left symbol; orders equal ranks left to right
    int32_t left_id;
    int32_t right_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  const auto length = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(piece.size());
  for (int32_t i = 0; i < length; ++i) {
    symbols[i] = {byte_token_[static_cast<unsigned char>(piece[i])], i - 1,
                  i + 1 < length ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> candidates;
  const auto push_candidate = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const int32_t left_id = symbols[left].id;
    const int32_t right_id = symbols[symbols[left].next].id;
    if (const Merge* merge = find_merge(left_id, right_id)) {
      candidates.push({merge->rank, left, left_id, right_id});
    }
  };
  for (int32_t i = 0; i + 1 < length; ++i) push_candidate(i);

  while (!candidates.empty()) {
    const Candidate candidate = candidates.top();
    candidates.pop();
    Symbol& left = symbols[candidate.left];
    // Stale if either side has merged since the candidate was pushed.
    if (left.id != candidate.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != candidate.right_id) continue;
    left.id = find_merge(candidate.left_id, candidate.right_id)->merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = candidate.left;
    right.id = -1;
    push_candidate(left.prev);
    push_candidate(candidate.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text,
                                          const EncodeOptions& options) const {
  require_valid_utf8(text, "BpeTokenizer::encode");
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() / 4 + 16);  // English averages about 4 bytes per token
  if (options.add_special_tokens) tokens = template_prefix_;

  const size_t stages = patterns_->codes.size();
  std::vector<MatchData> match(stages);
  for (size_t s = 0; s < stages; ++s) {
    match[s].reset(pcre2_match_data_create_from_pattern(patterns_->codes[s], nullptr));
    if (!match[s]) throw_error("BpeTokenizer::encode: out of memory creating PCRE2 match data");
  }
  // Pieces repeat a lot (Zipf); copy the tokens of a piece seen before instead of re-merging.
  // Maps the piece to where its tokens first landed in `tokens`.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen_pieces;
  const auto emit_piece = [&](std::string_view piece) {
    const auto [seen, is_new] = seen_pieces.try_emplace(piece, tokens.size(), 0);
    if (is_new) {
      append_piece_tokens(piece, tokens);
      seen->second.second = tokens.size() - seen->second.first;
      return;
    }
    const auto [first, count] = seen->second;
    // Grow first so that reading tokens[i] while appending never sees a reallocation.
    if (tokens.capacity() < tokens.size() + count) tokens.reserve(2 * (tokens.size() + count));
    for (size_t i = first; i < first + count; ++i) tokens.push_back(tokens[i]);
  };
  // Stage `stage` splits `text` into matches and the gaps between them, each handed on.
  std::function<void(std::string_view, size_t)> split = [&](std::string_view part, size_t stage) {
    if (part.empty()) return;
    if (stage == stages) return emit_piece(part);
    pcre2_code* code = patterns_->codes[stage];
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(part.data());
    PCRE2_SIZE offset = 0, gap_begin = 0;
    while (offset < part.size()) {
      // Validity was checked once above, and every part starts and ends on a character
      // boundary; letting PCRE2 re-check would rescan the text per piece.
      const int rc = pcre2_match(code, subject, part.size(), offset, PCRE2_NO_UTF_CHECK,
                                 match[stage].get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        throw_error("BpeTokenizer::encode: PCRE2 match failed at byte offset ", offset, ": ",
                    pcre2_message(rc));
      }
      const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match[stage].get());
      if (span[1] == span[0]) {  // an empty match splits nothing; try from the next character
        offset = span[0] + std::max<size_t>(1, utf8_sequence_length(part, span[0]));
        continue;
      }
      split(part.substr(gap_begin, span[0] - gap_begin), stage + 1);
      split(part.substr(span[0], span[1] - span[0]), stage + 1);
      offset = gap_begin = span[1];
    }
    split(part.substr(gap_begin), stage + 1);
  };

  const bool find_added = options.recognise_added_tokens && !added_ids_.empty();
  size_t section_begin = 0;
  for (size_t i = 0; find_added && i < text.size(); ++i) {
    const auto& candidates = added_by_first_byte_[static_cast<unsigned char>(text[i])];
    for (const auto& [content, id] : candidates) {
      if (text.compare(i, content.size(), content) != 0) continue;
      split(text.substr(section_begin, i - section_begin), 0);
      tokens.push_back(id);
      i += content.size() - 1;
      section_begin = i + 1;
      break;
    }
  }
  split(text.substr(section_begin), 0);
  if (options.add_special_tokens)
    tokens.insert(tokens.end(), template_suffix_.begin(), template_suffix_.end());
  return tokens;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    if (id < 0 || id >= vocab_size() || token_bytes_[static_cast<size_t>(id)].empty()) {
      throw_error("BpeTokenizer::decode: token ", i, " has id ", id,
                  ", outside the vocabulary [0, ", vocab_size(), ") of '", source_, "'");
    }
    text += token_bytes_[static_cast<size_t>(id)];
  }
  return text;
}

}  // namespace loom
