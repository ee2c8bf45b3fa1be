#include "loom/train/fp8_config.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

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
  const bool blockwise = c.fp8.recipe == Fp8Recipe::Blockwise;
  // What each rank's GEMMs see: its tensor-parallel slices of the split widths (the model
  // width itself is whole on every rank), and its seq_len / cp tokens of each sequence, in two
  // runs of seq_len / 2cp under context parallelism. Widths tp does not divide are refused by
  // the model's own check, which names them.
  const int tp = std::max(c.tp, 1), cp = std::max(c.cp, 1);
  const int64_t run_tokens = cp > 1 ? c.seq_len / (2 * cp) : c.seq_len;
  const std::string per_rank = tp > 1 ? " / parallel.tp" : "";
  struct Width {
    std::string name;
    int64_t value;
  };
  std::vector<Width> split_widths;
  for (const auto& [name, full] :
       {std::pair<const char*, int64_t>{"model.ffn_hidden", c.model.ffn_hidden},
        {"the query width (n_head x head_dim)", c.model.q_dim()},
        {"the key/value width (n_kv_head x head_dim)", c.model.kv_dim()}})
    if (full % tp == 0) split_widths.push_back({name + per_rank, full / tp});
  if (blockwise) {
    const std::string cut = blockwise_tiles_cut(c.model, tp, cp, c.seq_len);
    if (!cut.empty()) throw_error(cut);
  }
  if (c.device == Device::CUDA) {
    // cuBLASLt's FP8 kernels take every GEMM dimension a multiple of 16; its block-scaled ones
    // (blockwise) a multiple of the 128-element tiles, and the 128 x 1 tiles of the weight
    // gradients' token dimension stay inside a run of a sequence's tokens.
    const int64_t multiple = blockwise ? kFp8TileSize : 16;
    std::vector<Width> dims = {
        blockwise ? Width{cp > 1 ? "train.seq_len / 2 parallel.cp (tokens in a row on a rank)"
                                 : "train.seq_len",
                          run_tokens}
                  : Width{"train.batch_size x train.seq_len" +
                              std::string(cp > 1 ? " / parallel.cp" : "") +
                              " (tokens per micro-batch on a rank)",
                          c.batch_size * c.seq_len / cp},
        {"model.n_embd", c.model.n_embd}};
    dims.insert(dims.end(), split_widths.begin(), split_widths.end());
    // A mixture of experts' experts run whole on every tp rank (their rows, any count, are
    // padded on the device).
    if (c.model.is_moe()) {
      dims.push_back(
          {"the experts' width (model.moe_ffn_hidden, or ffn_hidden)", c.model.expert_ffn()});
      if (c.model.n_shared_experts > 0)
        dims.push_back({"the shared experts' width (n_shared_experts x the experts')",
                        c.model.n_shared_experts * c.model.expert_ffn()});
    }
    for (const Width& w : dims)
      if (w.value % multiple != 0)  // q|k|v's width, q + 2 kv, follows
        throw_error("train.precision = \"fp8\" on CUDA: ", w.name, " = ", w.value,
                    " is not a multiple of ", multiple,
                    blockwise ? ", which blockwise FP8's 128-element tiles on cuBLASLt's "
                                "block-scaled GEMMs need (or use fp8_recipe = \"delayed\" or "
                                "\"current\": multiples of 16)"
                              : ", which cuBLASLt's FP8 GEMMs need");
  }
}

}  // namespace loom
