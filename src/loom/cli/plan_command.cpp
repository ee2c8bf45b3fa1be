// `loom plan`: what one layout of a training job needs per GPU, before any GPU hour is spent.
// This first part evaluates a given layout's memory; the time model and the search over all
// layouts come next (issue 4).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/cli/commands.hpp"
#include "loom/core/error.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/train_config.hpp"

namespace loom::cli {

namespace {

ModelConfig plan_model(const std::string& name_or_path) {
  if (std::filesystem::is_regular_file(name_or_path)) {
    ConfigReader reader = ConfigReader::from_file(name_or_path);
    return parse_model_config(reader);
  }
  return model_preset(name_or_path);
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

int run_plan(const PlanArgs& args) {
  const ModelConfig model = plan_model(args.model);
  const plan::GpuSpec& gpu = plan::gpu_preset(args.gpu);
  if (args.layout.empty())
    throw_error("plan: give --layout (the search over all layouts is not built yet)");
  const plan::PlanLayout layout = plan::parse_layout(args.layout);
  plan::check_layout(layout, model, args.seq_len);
  if (args.gpus != 0 && layout.gpus() != args.gpus)
    throw_error("plan: layout ", layout.describe(), " uses ", layout.gpus(), " GPUs, but --gpus is ", args.gpus);
  const int64_t per_step = layout.dp * layout.micro_batch;
  if (args.global_batch % per_step != 0)
    throw_error("plan: global batch ", args.global_batch, " sequences is not a multiple of dp x mbs = ", per_step);
  plan::GpuJob job;
  job.seq_len = args.seq_len;
  job.micro_batches = args.global_batch / per_step;
  job.activation_bytes = args.precision == "f32" ? 4 : 2;
  job.state = args.precision == "f32" ? plan::kF32Adam : plan::kMixedPrecisionAdam;
  const plan::MemoryBreakdown mem = plan::predict_gpu_memory(model, layout, job);
  const bool fits = mem.total() <= gpu.hbm_bytes;

  if (args.json) {
    const nlohmann::json out = {
        {"model", args.model}, {"parameters", model.parameter_count()}, {"gpu", gpu.name}, {"layout", layout.describe()},
        {"seq_len", args.seq_len}, {"global_batch", args.global_batch}, {"micro_batches", job.micro_batches},
        {"memory_bytes",
         {{"parameters", mem.parameters}, {"gradients", mem.gradients}, {"optimizer_state", mem.optimizer_state},
          {"activations", mem.activations}, {"comm_buffers", mem.comm_buffers}, {"workspace", mem.workspace},
          {"total", mem.total()}}},
        {"hbm_bytes", gpu.hbm_bytes}, {"fits", fits}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("model %s: %.2fB parameters | %s | %lld GPUs (%s) | seq %lld, global batch %lld, %lld micro-batches\n",
              args.model.c_str(), static_cast<double>(model.parameter_count()) / 1e9, layout.describe().c_str(),
              static_cast<long long>(layout.gpus()), gpu.name.c_str(), static_cast<long long>(args.seq_len),
              static_cast<long long>(args.global_batch), static_cast<long long>(job.micro_batches));
  std::printf("\nmemory of the most loaded GPU (first pipeline stage)\n");
  const std::pair<const char*, double> rows[] = {
      {"parameters", mem.parameters},         {"gradients", mem.gradients},       {"optimizer state", mem.optimizer_state},
      {"activations", mem.activations},       {"comm buffers", mem.comm_buffers}, {"workspace", mem.workspace}};
  for (const auto& [name, bytes] : rows) std::printf("  %-16s %9.2f GiB\n", name, bytes / kGiB);
  std::printf("  %-16s %9.2f GiB of %.0f GiB HBM: %s\n", "total", mem.total() / kGiB, gpu.hbm_bytes / kGiB,
              fits ? "fits" : "does NOT fit");
  return fits ? 0 : 1;
}

}  // namespace loom::cli
