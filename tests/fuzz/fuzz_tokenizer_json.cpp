// libFuzzer target: a Hugging Face tokenizer.json, as BpeTokenizer::parse_tokenizer_json (what
// load_tokenizer_json reads) sees it. A file that loads must encode and decode a fixed text
// without added tokens, and with them and the template it must still give ids it can decode.
// Malformed or unsupported files must end in a loom::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/core/error.hpp"
#include "loom/data/bpe_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    const loom::BpeTokenizer tokenizer = loom::BpeTokenizer::parse_tokenizer_json(input, "fuzz/tokenizer.json");
    const std::string text = "Hello world! It's 2024:  tabs\tand ünïcödé, <|endoftext|> 12345.";
    const std::vector<int32_t> plain = tokenizer.encode(text, {.recognise_added_tokens = false});
    if (tokenizer.decode(plain) != text) __builtin_trap();  // byte-level BPE must round-trip
    const std::vector<int32_t> full = tokenizer.encode(text, {.add_special_tokens = true});
    for (const int32_t id : full) {
      if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
    }
    (void)tokenizer.decode(full);
  } catch (const loom::Error&) {
  }
  return 0;
}
