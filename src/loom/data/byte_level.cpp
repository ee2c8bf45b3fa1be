#include "loom/data/byte_level.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "loom/core/error.hpp"

namespace loom {

std::array<char32_t, 256> byte_level_alphabet() {
  std::array<char32_t, 256> table{};
  char32_t next_shifted = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? static_cast<char32_t>(b) : next_shifted++;
  }
  return table;
}

bool byte_level_to_bytes(std::string_view spelled, std::string& bytes) {
  // The alphabet's characters are all below U+0144: a flat table beats a hash map here, which
  // matters when 128K-token vocabularies are loaded.
  static const std::array<int, 512> byte_of = [] {
    std::array<int, 512> table{};
    table.fill(-1);
    const std::array<char32_t, 256> alphabet = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) table[alphabet[b]] = b;
    return table;
  }();
  bytes.clear();
  for (size_t i = 0; i < spelled.size();) {
    const size_t length = utf8_sequence_length(spelled, i);
    if (length == 0 || length > 2) return false;  // every character of the alphabet is < U+0800
    char32_t code_point = static_cast<unsigned char>(spelled[i]);
    if (length == 2) {
      code_point = ((code_point & 0x1F) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3F);
    }
    if (code_point >= byte_of.size() || byte_of[code_point] < 0) return false;
    bytes += static_cast<char>(byte_of[code_point]);
    i += length;
  }
  return !bytes.empty();
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

void require_valid_utf8(std::string_view text, const char* who) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      throw_error(who, ": text is not valid UTF-8 at byte offset ", i, " (byte value ",
                  static_cast<int>(static_cast<unsigned char>(text[i])),
                  "); byte-level BPE tokenises Unicode text, so fix the input's encoding first");
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

}  // namespace loom
