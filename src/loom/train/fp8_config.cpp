#include "loom/train/fp8_config.hpp"

#include <utility>

#include "loom/core/error.hpp"
#include "loom/train/train_config.hpp"

namespace loom {

namespace {
// Transformer Engine keeps up to 1024 steps of history; a margin past 2^30 leaves nothing of E4M3.
constexpr int64_t kMaxAmaxHistory = 1024;
constexpr int64_t kMaxMargin = 30;
}  // namespace

Fp8Config parse_fp8_config(ConfigReader& r, bool fp8_precision) {
  if (!fp8_precision)
    for (const char* key :
         {"train.fp8_recipe", "train.fp8_format", "train.fp8_amax_history", "train.fp8_margin"})
      if (r.has(key))
        throw_error("config key '", key,
                    "' is set but train.precision is not \"fp8\": set train.precision = "
                    "\"fp8\" or drop the key");
  Fp8Config c;
  const std::string recipe = r.get_string("train.fp8_recipe", fp8_recipe_name(c.recipe));
  if (recipe == "delayed")
    c.recipe = Fp8Recipe::Delayed;
  else if (recipe == "current")
    c.recipe = Fp8Recipe::Current;
  else if (recipe == "blockwise")
    c.recipe = Fp8Recipe::Blockwise;
  else
    throw_error("config key 'train.fp8_recipe' has value '", recipe,
                "', expected delayed, current or blockwise");
  const std::string format = r.get_string("train.fp8_format", fp8_formats_name(c.formats));
  if (format == "hybrid")
    c.formats = Fp8Formats::Hybrid;
  else if (format == "e4m3")
    c.formats = Fp8Formats::E4M3;
  else
    throw_error("config key 'train.fp8_format' has value '", format,
                "', expected hybrid (E4M3 forward, E5M2 gradients) or e4m3 (both)");
  c.amax_history = r.get_int("train.fp8_amax_history", c.amax_history);
  if (c.amax_history < 1 || c.amax_history > kMaxAmaxHistory)
    throw_error("config key 'train.fp8_amax_history' has value ", c.amax_history,
                ", expected 1 to ", kMaxAmaxHistory, " steps");
  const int64_t margin = r.get_int("train.fp8_margin", c.margin);
  if (margin < 0 || margin > kMaxMargin)
    throw_error("config key 'train.fp8_margin' has value ", margin, ", expected 0 to ", kMaxMargin,
                " (the scale is divided by 2^margin)");
  c.margin = static_cast<int>(margin);
  return c;
}

void check_fp8_training(const TrainConfig& c) {
  if (c.precision != Precision::FP8) return;
  const char* works =
      "; FP8 runs on the CPU in one process or under data parallelism (plain or ZeRO)";
  if (c.device == Device::CUDA) {
    // cuBLASLt's FP8 kernels take every GEMM dimension a multiple of 16; its block-scaled ones
    // (blockwise) a multiple of the 128-element tiles, and the 128 x 1 tiles of the weight
    // gradients' token dimension stay inside a sequence.
    const bool blockwise = c.fp8.recipe == Fp8Recipe::Blockwise;
    const int64_t multiple = blockwise ? 128 : 16;
    const int64_t tokens = c.batch_size * c.seq_len, width = c.model.n_embd,
                  hidden = c.model.ffn_hidden, kv = c.model.kv_dim();
    for (const auto& [name, value] :
         {std::pair<const char*, int64_t>{blockwise
                                              ? "train.seq_len"
                                              : "train.batch_size x train.seq_len (tokens per "
                                                "micro-batch)",
                                          blockwise ? c.seq_len : tokens},
          {"model.n_embd", width},
          {"model.ffn_hidden", hidden},
          {"the query width (n_head x head_dim)", c.model.q_dim()},
          {"the key/value width (n_kv_head x head_dim)", kv}})
      if (value % multiple != 0)  // q|k|v's width, q + 2 kv, follows
        throw_error("train.precision = \"fp8\" on CUDA: ", name, " = ", value,
                    " is not a multiple of ", multiple,
                    blockwise ? ", which blockwise FP8's 128-element tiles on cuBLASLt's "
                                "block-scaled GEMMs need (or use fp8_recipe = \"delayed\" or "
                                "\"current\": multiples of 16)"
                              : ", which cuBLASLt's FP8 GEMMs need");
  }
  if (c.tp > 1)
    throw_error("train.precision = \"fp8\" with parallel.tp = ", c.tp, ": not supported", works);
  if (c.pp > 1)
    throw_error("train.precision = \"fp8\" with parallel.pp = ", c.pp, ": not supported", works);
  if (c.cp > 1)
    throw_error("train.precision = \"fp8\" with parallel.cp = ", c.cp, ": not supported", works);
  if (c.ep > 1)
    throw_error("train.precision = \"fp8\" with parallel.ep = ", c.ep, ": not supported", works);
  if (c.model.is_moe())
    throw_error("train.precision = \"fp8\" with model.n_experts = ", c.model.n_experts,
                ": the experts' grouped GEMMs have no FP8 path; use a dense model or "
                "train.precision = \"bf16\"");
}

}  // namespace loom
