// The FP8 recipes' and formats' config names and the blockwise recipe's layout rule, apart from
// the emulation so that the config parser and the planner (and their fuzz target, which links no
// kernels) can use them.
#include <algorithm>
#include <string>
#include <utility>

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

std::string blockwise_tiles_cut(const ModelConfig& model, int64_t tp, int64_t cp, int64_t seq_len) {
  tp = std::max<int64_t>(tp, 1), cp = std::max<int64_t>(cp, 1);
  // Widths tp does not divide are refused by the model's own check, which names them.
  const std::string per_rank = tp > 1 ? " / parallel.tp" : "";
  if (tp > 1)
    for (const auto& [name, full] :
         {std::pair<const char*, int64_t>{"model.ffn_hidden", model.ffn_hidden},
          {"the query width (n_head x head_dim)", model.q_dim()},
          {"the key/value width (n_kv_head x head_dim)", model.kv_dim()}})
      if (full % tp == 0 && (full / tp) % kFp8TileSize != 0)
        return "train.fp8_recipe = \"blockwise\" with parallel.tp = " + std::to_string(tp) + ": " +
               name + per_rank + " = " + std::to_string(full / tp) +
               " is not a multiple of 128, so the tensor-parallel slices would cut the recipe's "
               "128-wide tiles; use widths that are 128 x tp multiples or fp8_recipe = "
               "\"delayed\" or \"current\"";
  const int64_t run_tokens = cp > 1 ? seq_len / (2 * cp) : seq_len;
  if (cp > 1 && run_tokens % kFp8TileSize != 0)
    return "train.fp8_recipe = \"blockwise\" with parallel.cp = " + std::to_string(cp) +
           ": each rank holds two chunks of seq_len / 2cp = " + std::to_string(run_tokens) +
           " tokens of every sequence, not a multiple of 128, so the chunks would cut the weight "
           "gradient's 128-token tiles; use seq_len a multiple of 256 cp or fp8_recipe = "
           "\"delayed\" or \"current\"";
  return "";
}

}  // namespace loom
