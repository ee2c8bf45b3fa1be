#pragma once
// train.precision = "fp8" and its keys (train.fp8_recipe, fp8_format, fp8_amax_history,
// fp8_margin), read and checked before any work starts. What FP8 does is in model/fp8_linear.hpp.
#include "loom/model/fp8_linear.hpp"
#include "loom/train/config_reader.hpp"

namespace loom {

struct TrainConfig;

// The fp8 keys; when train.precision is not "fp8" any of them is an error naming it.
Fp8Config parse_fp8_config(ConfigReader& reader, bool fp8_precision);
// What FP8 needs of a run: blockwise tiles that tensor- and context-parallel slices do not cut;
// on CUDA, GEMM dimensions cuBLASLt's FP8 kernels take.
// Anything else is a loom::Error naming the key, its value and what works. Also called by the
// trainer, since a caller may hand it any config.
void check_fp8_training(const TrainConfig& config);

}  // namespace loom
