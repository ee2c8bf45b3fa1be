#include "loom/cli/plan_file.hpp"

#include <algorithm>
#include <type_traits>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/train_config.hpp"

namespace loom::cli {

namespace {

std::optional<double> optional_double(ConfigReader& r, const std::string& key) {
  if (!r.has(key)) return std::nullopt;
  return r.get_double(key, 0);
}

}  // namespace

void apply_plan_file(PlanArgs& args) {
  if (args.config.empty()) return;
  ConfigReader r = ConfigReader::from_file(args.config);
  auto unless_given = [&](const char* flag) { return args.given.count(flag) == 0; };
  // Every key is read (so none looks unknown); the command line wins where it set the value.
  auto set_unless_given = [&](const char* flag, auto& field, auto value) {
    if (unless_given(flag)) field = static_cast<std::remove_reference_t<decltype(field)>>(value);
  };
  // [model]: the same keys as a training config, read by the same code.
  bool has_model = false;
  for (const char* key : {"model.preset", "model.arch", "model.n_layer", "model.n_embd"}) has_model = has_model || r.has(key);
  if (has_model) {
    parse_model_config(r);  // validates now, before any planning
    if (unless_given("model")) args.model = args.config;
  }
  set_unless_given("gpu", args.gpu, r.get_string("cluster.gpu", args.gpu));
  set_unless_given("gpus", args.gpus, r.get_int("cluster.gpus", args.gpus));
  set_unless_given("gpus-per-node", args.gpus_per_node, r.get_int("cluster.gpus_per_node", args.gpus_per_node));
  // Settings with no flag: read when present, else the preset's or ClusterSpec's default.
  const std::pair<const char*, std::optional<double> PlanClusterSettings::*> settings[] = {
      {"bf16_tflops", &PlanClusterSettings::bf16_tflops},
      {"hbm_gib", &PlanClusterSettings::hbm_gib},
      {"hbm_tb_per_s", &PlanClusterSettings::hbm_tb_per_s},
      {"nvlink_gb_per_s", &PlanClusterSettings::nvlink_gb_per_s},
      {"tdp_watts", &PlanClusterSettings::tdp_watts},
      {"inter_node_gbit_per_gpu", &PlanClusterSettings::inter_node_gbit_per_gpu},
      {"pue", &PlanClusterSettings::pue},
      {"node_overhead_watts", &PlanClusterSettings::node_overhead_watts},
      {"storage_write_gb_per_s", &PlanClusterSettings::storage_write_gb_per_s},
      {"restart_seconds", &PlanClusterSettings::restart_seconds},
      {"price_per_gpu_hour", &PlanClusterSettings::price_per_gpu_hour},
      {"gpu_mtbf_hours", &PlanClusterSettings::gpu_mtbf_hours},
      {"node_mtbf_hours", &PlanClusterSettings::node_mtbf_hours},
  };
  for (const auto& [key, member] : settings) args.cluster.*member = optional_double(r, std::string("cluster.") + key);
  set_unless_given("seq", args.seq_len, r.get_int("training.seq_len", args.seq_len));
  set_unless_given("global-batch", args.global_batch, r.get_int("training.global_batch", args.global_batch));
  // A batch given on the command line in either unit beats the file's in either unit.
  const int64_t file_tokens = r.get_int("training.global_batch_tokens", 0);
  if (unless_given("global-batch") && unless_given("global-batch-tokens") && file_tokens > 0) args.global_batch_tokens = file_tokens;
  set_unless_given("precision", args.precision, r.get_string("training.precision", args.precision));
  set_unless_given("fp8-recipe", args.fp8_recipe,
                   r.get_string("training.fp8_recipe", args.fp8_recipe));
  set_unless_given("attention", args.attention, r.get_string("training.attention", args.attention));
  set_unless_given("train-tokens", args.train_tokens, r.get_double("training.train_tokens", args.train_tokens));
  set_unless_given("moe-imbalance", args.moe_imbalance, r.get_double("training.moe_imbalance", args.moe_imbalance));
  set_unless_given("finetune", args.finetune, r.get_string("training.finetune", args.finetune));
  set_unless_given("layout", args.layout, r.get_string("plan.layout", args.layout));
  set_unless_given("top", args.top, r.get_int("plan.top", args.top));
  r.reject_unknown_keys();
  if (args.precision != "bf16" && args.precision != "fp8" && args.precision != "mxfp8" &&
      args.precision != "nvfp4" && args.precision != "f32")
    throw_error(args.config, ": training.precision = '", args.precision,
                "'; expected bf16, fp8, mxfp8, nvfp4 or f32");
  if (args.fp8_recipe != "delayed" && args.fp8_recipe != "current" &&
      args.fp8_recipe != "blockwise")
    throw_error(args.config, ": training.fp8_recipe = '", args.fp8_recipe,
                "'; expected delayed, current or blockwise");
  if (args.finetune != "full" && args.finetune != "lora")
    throw_error(args.config, ": training.finetune = '", args.finetune, "'; expected full or lora");
  if (args.attention != "flash" && args.attention != "materialized")
    throw_error(args.config, ": training.attention = '", args.attention, "'; expected flash or materialized");
  if (!(args.moe_imbalance >= 1 && args.moe_imbalance <= 1e6))
    throw_error(args.config, ": training.moe_imbalance = ", args.moe_imbalance,
                "; expected 1 (balanced) or more: the busiest expert-parallel rank's routed rows over the mean");
  if (args.gpus < 0 || args.gpus_per_node < 1 || args.seq_len < 1 || args.global_batch < 1 || args.top < 1)
    throw_error(args.config, ": cluster.gpus must be >= 0, and gpus_per_node, seq_len, global_batch and top >= 1");
}

plan::ClusterSpec plan_cluster(const PlanArgs& args, int64_t gpus) {
  const PlanClusterSettings& s = args.cluster;
  plan::ClusterSpec cluster;
  cluster.gpu = plan::gpu_preset(args.gpu);
  cluster.inter_node_bytes_per_s_per_gpu = plan::default_inter_node_bytes_per_s(cluster.gpu);
  cluster.gpu.bf16_tflops = s.bf16_tflops.value_or(cluster.gpu.bf16_tflops);
  if (s.hbm_gib) cluster.gpu.hbm_bytes = *s.hbm_gib * 1024.0 * 1024.0 * 1024.0;
  if (s.hbm_tb_per_s) cluster.gpu.hbm_bandwidth_bytes_per_s = *s.hbm_tb_per_s * 1e12;
  if (s.nvlink_gb_per_s) cluster.gpu.nvlink_bytes_per_s = *s.nvlink_gb_per_s * 1e9;
  cluster.gpu.tdp_watts = s.tdp_watts.value_or(cluster.gpu.tdp_watts);
  if (s.inter_node_gbit_per_gpu) cluster.inter_node_bytes_per_s_per_gpu = *s.inter_node_gbit_per_gpu * 1e9 / 8;
  cluster.pue = s.pue.value_or(cluster.pue);
  cluster.node_overhead_watts = s.node_overhead_watts.value_or(cluster.node_overhead_watts);
  if (s.storage_write_gb_per_s) cluster.storage_write_bytes_per_s = *s.storage_write_gb_per_s * 1e9;
  cluster.restart_seconds = s.restart_seconds.value_or(cluster.restart_seconds);
  cluster.price_per_gpu_hour = s.price_per_gpu_hour.value_or(cluster.price_per_gpu_hour);
  cluster.gpu_mtbf_hours = s.gpu_mtbf_hours.value_or(cluster.gpu_mtbf_hours);
  cluster.node_mtbf_hours = s.node_mtbf_hours.value_or(cluster.node_mtbf_hours);
  cluster.gpus_per_node = std::min(args.gpus_per_node, gpus);
  if (gpus % cluster.gpus_per_node != 0)
    throw_error("plan: ", gpus, " GPUs do not fill whole nodes of ", cluster.gpus_per_node);
  cluster.nodes = gpus / cluster.gpus_per_node;
  cluster.validate();
  return cluster;
}

}  // namespace loom::cli
