#pragma once
// `loom plan --config FILE.toml`: everything the flags say, in a file a team can keep next to
// its training config. Flags given on the command line win over the file.
#include "loom/cli/commands.hpp"
#include "loom/plan/hardware.hpp"

namespace loom::cli {

// Reads args.config into the fields of `args` the command line did not set (args.given), and
// rejects unknown keys before any planning starts. Tables and keys:
//   [model]    preset = "llama-70b", or the dimensions as in a training config
//   [cluster]  gpu, gpus, gpus_per_node, inter_node_gbit_per_gpu, nvlink_gb_per_s, bf16_tflops,
//              hbm_gib, hbm_tb_per_s, tdp_watts, pue, node_overhead_watts,
//              storage_write_gb_per_s, restart_seconds, price_per_gpu_hour, gpu_mtbf_hours,
//              node_mtbf_hours
//   [training] seq_len, global_batch (sequences) or global_batch_tokens, precision, fp8_recipe,
//              attention, train_tokens
//   [plan]     layout, top
void apply_plan_file(PlanArgs& args);

// The cluster of `gpus` GPUs the arguments describe: the preset, the generation's network,
// then every setting from the file. Throws loom::Error naming a bad value.
plan::ClusterSpec plan_cluster(const PlanArgs& args, int64_t gpus);

}  // namespace loom::cli
