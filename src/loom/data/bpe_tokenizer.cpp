#include "loom/data/bpe_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "loom/core/error.hpp"

namespace loom {
namespace {

// openai/gpt-2 src/encoder.py, `pat`. PCRE2 with UTF+UCP gives \p{L}, \p{N} and \s their
// Unicode meanings, as Python's `regex` module does.
constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kEndOfTextToken = "<|endoftext|>";

// GPT-2's bytes_to_unicode() (encoder.py): printable Latin-1 bytes stand for themselves, the
// other 68 bytes are shifted to U+0100.. so that every byte has a visible, non-space character.
std::array<char32_t, 256> gpt2_byte_to_unicode() {
  std::array<char32_t, 256> table{};
  char32_t next_shifted = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? static_cast<char32_t>(b) : next_shifted++;
  }
  return table;
}

void append_utf8(char32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// Length of the valid UTF-8 sequence starting at text[i], or 0 if it is malformed (overlong
// forms, surrogates and code points above U+10FFFF are rejected, as PCRE2 would).
size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const auto continuation = [&](size_t k) { return k < text.size() && (byte(k) & 0xC0) == 0x80; };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(i + 1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (!continuation(i + 1) || !continuation(i + 2)) return 0;
    if (lead == 0xE0 && byte(i + 1) < 0xA0) return 0;   // overlong
    if (lead == 0xED && byte(i + 1) >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (!continuation(i + 1) || !continuation(i + 2) || !continuation(i + 3)) return 0;
    if (lead == 0xF0 && byte(i + 1) < 0x90) return 0;   // overlong
    if (lead == 0xF4 && byte(i + 1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

// Decodes a string already checked by utf8_sequence_length(); empty result means malformed.
std::u32string decode_utf8(std::string_view text) {
  std::u32string code_points;
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) return {};
    const auto byte = [&](size_t k) {
      return static_cast<char32_t>(static_cast<unsigned char>(text[i + k]));
    };
    static constexpr char32_t kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    char32_t code_point = byte(0) & kLeadMask[length];
    for (size_t k = 1; k < length; ++k) code_point = (code_point << 6) | (byte(k) & 0x3F);
    code_points += code_point;
    i += length;
  }
  return code_points;
}

void require_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      throw_error("Gpt2Tokenizer::encode: text is not valid UTF-8 at byte offset ", i, " (byte value ",
                  static_cast<int>(static_cast<unsigned char>(text[i])),
                  "); GPT-2 tokenises Unicode text, so fix the input's encoding first");
    }
    i += length;
  }
}

std::string read_whole_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error("cannot open ", what, " '", path, "': ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) throw_error("error reading ", what, " '", path, "'");
  return contents.str();
}

uint64_t pair_key(int32_t left_id, int32_t right_id) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left_id)) << 32) | static_cast<uint32_t>(right_id);
}

struct EncoderTable {
  std::vector<std::string> token_bytes;                  // id -> raw bytes
  std::unordered_map<std::string, int32_t> id_of_token;  // GPT-2 alphabet string -> id
};

EncoderTable parse_encoder_json(const std::string& text, const std::string& path) {
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_error("GPT-2 encoder file '", path, "' is not valid JSON: ", e.what());
  }
  if (!encoder.is_object() || encoder.empty()) {
    throw_error("GPT-2 encoder file '", path, "': expected a non-empty JSON object mapping token ",
                "strings to ids, found ", encoder.type_name());
  }
  std::unordered_map<char32_t, char> unicode_to_byte;
  const std::array<char32_t, 256> byte_to_unicode = gpt2_byte_to_unicode();
  for (int b = 0; b < 256; ++b) unicode_to_byte[byte_to_unicode[b]] = static_cast<char>(b);

  const auto vocab_size = static_cast<int64_t>(encoder.size());
  EncoderTable table;
  table.token_bytes.resize(encoder.size());
  table.id_of_token.reserve(encoder.size());
  std::vector<bool> id_seen(encoder.size(), false);
  for (const auto& [token, id_json] : encoder.items()) {
    if (!id_json.is_number_integer()) {
      throw_error("GPT-2 encoder file '", path, "': token '", token, "' maps to ", id_json.dump(),
                  ", expected an integer id");
    }
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      throw_error("GPT-2 encoder file '", path, "': token '", token, "' has id ", id,
                  ", expected ids in [0, ", vocab_size, ") (one per entry)");
    }
    if (id_seen[id]) throw_error("GPT-2 encoder file '", path, "': id ", id, " is used by two tokens");
    id_seen[id] = true;
    const std::u32string code_points = decode_utf8(token);
    for (const char32_t code_point : code_points) {
      const auto byte = unicode_to_byte.find(code_point);
      if (byte == unicode_to_byte.end()) {
        throw_error("GPT-2 encoder file '", path, "': token '", token, "' (id ", id, ") contains U+",
                    std::hex, static_cast<uint32_t>(code_point),
                    ", which is outside GPT-2's byte-to-unicode alphabet");
      }
      table.token_bytes[id] += byte->second;
    }
    if (code_points.empty())
      throw_error("GPT-2 encoder file '", path, "': id ", id, " has an empty or malformed token");
    table.id_of_token.emplace(token, static_cast<int32_t>(id));
  }
  return table;
}

// vocab.bpe: a "#version" line, then "left right" per line; the line order is the merge rank.
std::unordered_map<uint64_t, BpeMerge> parse_merges(const std::string& text, const std::string& path,
                                                    const EncoderTable& encoder, const std::string& encoder_path) {
  std::unordered_map<uint64_t, BpeMerge> merges;
  std::istringstream lines(text);
  std::string line;
  int64_t line_number = 0;
  int32_t rank = 0;
  std::vector<int32_t> last_rank_creating(encoder.token_bytes.size(), -1);
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      throw_error("GPT-2 merges file '", path, "' line ", line_number,
                  ": expected two tokens separated by one space, found '", line, "'");
    }
    const std::string left = line.substr(0, space);
    const std::string right = line.substr(space + 1);
    int32_t ids[3];
    const std::string parts[3] = {left, right, left + right};
    for (int k = 0; k < 3; ++k) {
      const auto it = encoder.id_of_token.find(parts[k]);
      if (it == encoder.id_of_token.end()) {
        throw_error("GPT-2 merges file '", path, "' line ", line_number, ": token '", parts[k],
                    "' is not in the encoder file '", encoder_path, "' (files from different models?)");
      }
      ids[k] = it->second;
    }
    if (!merges.emplace(pair_key(ids[0], ids[1]), BpeMerge{rank, ids[2]}).second) {
      throw_error("GPT-2 merges file '", path, "' line ", line_number, ": merge '", line, "' appears twice");
    }
    last_rank_creating[ids[2]] = rank;
    ++rank;
  }
  if (merges.empty()) throw_error("GPT-2 merges file '", path, "' contains no merges");
  // The heap-based merge loop reproduces encoder.py's pass-by-pass order only if every merge
  // comes after all merges that create its parts; GPT-2's trained file satisfies this.
  for (const auto& [key, merge] : merges) {
    for (const auto part : {static_cast<uint32_t>(key >> 32), static_cast<uint32_t>(key)}) {
      if (last_rank_creating[part] >= merge.rank) {
        throw_error("GPT-2 merges file '", path, "': merge number ", merge.rank + 1,
                    " uses a token that the later merge number ", last_rank_creating[part] + 1,
                    " creates; merges must follow the merges that create their parts");
      }
    }
  }
  return merges;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

struct Gpt2Tokenizer::CompiledPattern {
  pcre2_code* code = nullptr;

  CompiledPattern() {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2SplitPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      throw_error("PCRE2 could not compile GPT-2's split pattern at offset ", error_offset, ": ",
                  reinterpret_cast<const char*>(message));
    }
    // JIT is several times faster; where unavailable pcre2_match interprets the same pattern.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~CompiledPattern() { pcre2_code_free(code); }
  CompiledPattern(const CompiledPattern&) = delete;
  CompiledPattern& operator=(const CompiledPattern&) = delete;
};

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  return parse(read_whole_file(encoder_json_path, "GPT-2 encoder file"),
               read_whole_file(vocab_bpe_path, "GPT-2 merges file"), encoder_json_path, vocab_bpe_path);
}

Gpt2Tokenizer Gpt2Tokenizer::parse(const std::string& encoder_json, const std::string& vocab_bpe,
                                   const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  EncoderTable encoder = parse_encoder_json(encoder_json, encoder_json_path);
  Gpt2Tokenizer tokenizer;
  tokenizer.merges_ = parse_merges(vocab_bpe, vocab_bpe_path, encoder, encoder_json_path);

  const std::array<char32_t, 256> byte_to_unicode = gpt2_byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string token;
    append_utf8(byte_to_unicode[b], token);
    const auto it = encoder.id_of_token.find(token);
    if (it == encoder.id_of_token.end()) {
      throw_error("GPT-2 encoder file '", encoder_json_path, "' has no token for byte ", b, " (the string '",
                  token, "'); byte-level BPE needs all 256 bytes");
    }
    tokenizer.byte_token_[b] = it->second;
  }
  const auto eot = encoder.id_of_token.find(kEndOfTextToken);
  if (eot == encoder.id_of_token.end()) {
    throw_error("GPT-2 encoder file '", encoder_json_path, "' has no '", kEndOfTextToken, "' token");
  }
  tokenizer.eot_token_ = eot->second;
  tokenizer.token_bytes_ = std::move(encoder.token_bytes);
  tokenizer.pattern_ = std::make_shared<const CompiledPattern>();
  return tokenizer;
}

const BpeMerge* Gpt2Tokenizer::find_merge(int32_t left_id, int32_t right_id) const {
  const auto it = merges_.find(pair_key(left_id, right_id));
  return it == merges_.end() ? nullptr : &it->second;
}

// encoder.py's bpe() rescans the word for the lowest-rank pair after every merge, which is
// quadratic in the word length (long runs of spaces or symbols are single words). A min-heap
// of candidate pairs over a linked list of symbols gives the same result in O(n log n): ties
// in rank are the same pair, merged left to right exactly as encoder.py's inner loop does.
void Gpt2Tokenizer::append_word_tokens(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_token_[static_cast<unsigned char>(word[0])]);
    return;
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
  const auto length = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(word.size());
  for (int32_t i = 0; i < length; ++i) {
    symbols[i] = {byte_token_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < length ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> candidates;
  const auto push_candidate = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const int32_t left_id = symbols[left].id;
    const int32_t right_id = symbols[symbols[left].next].id;
    if (const BpeMerge* merge = find_merge(left_id, right_id)) {
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

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  require_valid_utf8(text);
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() / 4 + 16);  // English averages about 4 bytes per GPT-2 token
  // Words repeat a lot (Zipf); copy the tokens of a word seen before instead of re-merging.
  // Maps the word to where its tokens first landed in `tokens`.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen_words;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(pattern_->code, nullptr));
  if (!match) throw_error("Gpt2Tokenizer::encode: out of memory creating PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE offset = 0;
  while (offset < text.size()) {
    // Validity was checked once above; letting PCRE2 re-check would rescan the text per word.
    const int rc =
        pcre2_match(pattern_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw_error("Gpt2Tokenizer::encode: PCRE2 match failed at byte offset ", offset, ": ",
                  reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match.get());
    LOOM_CHECK(span[1] > span[0], "GPT-2's split pattern cannot match an empty string");
    const std::string_view word = text.substr(span[0], span[1] - span[0]);
    const auto [seen, is_new] = seen_words.try_emplace(word, tokens.size(), 0);
    if (is_new) {
      append_word_tokens(word, tokens);
      seen->second.second = tokens.size() - seen->second.first;
    } else {
      const auto [first, count] = seen->second;
      // Grow first so that reading tokens[i] while appending never sees a reallocation.
      if (tokens.capacity() < tokens.size() + count) tokens.reserve(2 * (tokens.size() + count));
      for (size_t i = first; i < first + count; ++i) tokens.push_back(tokens[i]);
    }
    offset = span[1];
  }
  return tokens;
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    if (id < 0 || id >= vocab_size()) {
      throw_error("Gpt2Tokenizer::decode: token ", i, " has id ", id, ", outside the vocabulary [0, ",
                  vocab_size(), ")");
    }
    text += token_bytes_[id];
  }
  return text;
}

}  // namespace loom
