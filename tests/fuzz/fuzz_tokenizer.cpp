// libFuzzer target: GPT-2 tokenizer files. The input is encoder.json, a NUL byte, then
// vocab.bpe (JSON cannot hold a raw NUL, so the split is unambiguous); a tokenizer that loads
// must then encode and decode a fixed text. Malformed files must end in a loom::Error; anything
// else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/core/error.hpp"
#include "loom/data/bpe_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string encoder = input.substr(0, split);
  const std::string merges = split == std::string::npos ? std::string() : input.substr(split + 1);
  try {
    const loom::BpeTokenizer tokenizer =
        loom::BpeTokenizer::parse_gpt2(encoder, merges, "fuzz/encoder.json", "fuzz/vocab.bpe");
    const std::string text = "Hello world! It's 2024:  tabs\tand ünïcödé, <|endoftext|> and more.";
    const std::vector<int32_t> tokens = tokenizer.encode(text);
    if (tokenizer.decode(tokens) != text) __builtin_trap();  // byte-level BPE must round-trip
  } catch (const loom::Error&) {
  }
  return 0;
}
