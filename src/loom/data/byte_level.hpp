#pragma once
// The pieces every byte-level BPE file format shares: GPT-2's byte-to-unicode alphabet (the
// vocabularies of encoder.json and tokenizer.json spell raw bytes in it) and strict UTF-8.
#include <array>
#include <string>
#include <string_view>

namespace loom {

// openai/gpt-2 src/encoder.py, `pat`; also what Hugging Face's ByteLevel pre-tokeniser splits
// with when `use_regex` is set. PCRE2 with UTF+UCP gives \p{L}, \p{N} and \s their Unicode
// meanings, as Python's `regex` module does.
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode() (openai/gpt-2 encoder.py): printable Latin-1 bytes stand for
// themselves, the other 68 bytes are shifted to U+0100.. so every byte has a visible character.
std::array<char32_t, 256> byte_level_alphabet();

// Raw bytes of a token spelled in that alphabet; false if a character is outside it or the
// spelling is not valid UTF-8.
bool byte_level_to_bytes(std::string_view spelled, std::string& bytes);

void append_utf8(char32_t code_point, std::string& out);

// Length of the valid UTF-8 sequence starting at text[i], or 0 if it is malformed (overlong
// forms, surrogates and code points above U+10FFFF are rejected, as PCRE2 would).
size_t utf8_sequence_length(std::string_view text, size_t i);

// Throws, naming `who`, the byte offset and value, unless `text` is valid UTF-8.
void require_valid_utf8(std::string_view text, const char* who);

// The whole file; `what` names it in errors ("GPT-2 encoder file").
std::string read_whole_file(const std::string& path, const char* what);

}  // namespace loom
