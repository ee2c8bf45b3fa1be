// The FP8 recipes' and formats' config names, apart from the emulation so that the config
// parser (and its fuzz target, which links no kernels) can name them.
#include "loom/model/fp8_linear.hpp"

namespace loom {

const char* fp8_recipe_name(Fp8Recipe recipe) {
  switch (recipe) {
    case Fp8Recipe::Delayed: return "delayed";
    case Fp8Recipe::Current: return "current";
    case Fp8Recipe::Blockwise: return "blockwise";
  }
  return "?";
}

const char* fp8_formats_name(Fp8Formats formats) {
  return formats == Fp8Formats::Hybrid ? "hybrid" : "e4m3";
}

}  // namespace loom
