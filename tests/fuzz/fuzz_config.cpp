// libFuzzer target: a training config (TOML) through ConfigReader and parse_train_config, as
// `loom train CONFIG` reads it: TOML syntax, types, ranges, layouts. Malformed input must end in
// a loom::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/core/error.hpp"
#include "loom/train/train_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    loom::ConfigReader reader = loom::ConfigReader::from_string(text, "fuzz.toml");
    (void)loom::parse_train_config(reader);
  } catch (const loom::Error&) {
  }
  return 0;
}
