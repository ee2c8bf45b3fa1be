// libFuzzer target: a safetensors file (header JSON, offsets, dtypes, CRC metadata) as
// parse_safetensors, which read_safetensors and every checkpoint reader use, sees it.
// Malformed input must end in a loom::Error; anything else (a crash, a sanitizer report, another
// exception) is a bug.
#include <cstddef>
#include <cstdint>

#include "loom/ckpt/safetensors.hpp"
#include "loom/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const loom::SafetensorsFile file = loom::parse_safetensors(data, size, "fuzz.safetensors");
    for (const loom::SafetensorsEntry& entry : file.entries) (void)file.at(entry.name);
  } catch (const loom::Error&) {
  }
  return 0;
}
