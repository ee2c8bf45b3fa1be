#include "loom/gpu/gpu_trainer.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint.hpp"
#include "loom/core/error.hpp"
#include "loom/data/unigram.hpp"
#include "loom/gpu/gpu_adamw.hpp"
#include "loom/gpu/gpu_model.hpp"
#include "loom/gpu/gpu_peak.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"
#include "loom/kernels/cuda/device_info.hpp"
#include "loom/model/flops.hpp"
#include "loom/obs/loss_plot.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/obs/progress.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/optim/grad_clip.hpp"

namespace loom::gpu {

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}


DType compute_dtype_of(const TrainConfig& config) {
  return config.precision == Precision::BF16 ? DType::BF16 : DType::F32;
}

const char* precision_name(const TrainConfig& config) {
  return config.precision == Precision::BF16 ? "bf16" : "f32";
}

// The device this process runs on, or a loom::Error when there is none.
cuda::DeviceProperties current_device() {
  const cuda::DeviceInfo info = cuda::device_info();
  if (info.count == 0)
    throw_error("--device cuda: no CUDA device is visible (",
                info.error.empty() ? std::string("the CUDA runtime reports 0 devices") : info.error,
                "); run on a machine with an NVIDIA GPU and driver, check CUDA_VISIBLE_DEVICES, or "
                "use --device cpu");
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  return info.devices.at(static_cast<size_t>(device));
}
}  // namespace

GpuTrainer::GpuTrainer(TrainConfig config) : config_(std::move(config)) {
  // Everything that needs no device first: a refused config never touches one.
  check_single_gpu_training(config_);
  check_gpu_model_supports(config_.model);
  if (config_.print_schedule)
    throw_error(
        "--print-schedule draws the pipeline schedule, and this run has none: set parallel.pp > 1 "
        "on the CPU");
  const cuda::DeviceProperties device = current_device();
  device_description_ =
      device.name + " (compute capability " + std::to_string(device.compute_major) + "." +
      std::to_string(device.compute_minor) + ", " + format_bytes(device.total_memory_bytes) + ")";
  peak_tflops_ = dense_peak_tflops(device.name, compute_dtype_of(config_));
  if (config_.threads > 0)
    cpu::set_num_threads(config_.threads);  // the host model samples on the CPU
  // The host model draws the initial weights exactly as the CPU trainer's does.
  host_ = std::make_shared<Transformer>(config_.model, config_.recompute, config_.vocab_chunk);
  host_->init_weights(config_.seed);
  host_->set_bf16_activations(config_.precision == Precision::BF16);
  model_ = std::make_unique<GpuTransformer>(*host_, compute_dtype_of(config_), config_.vocab_chunk);
  optimizer_ = std::make_unique<GpuAdamW>(model_->parameters(), config_.adamw);
  train_loader_ = std::make_unique<DataLoader>(DataLoader::from_pattern(
      config_.train_data, config_.batch_size, config_.seq_len, config_.model.vocab_size));
  if (config_.shuffle) train_loader_->set_shuffle(config_.seed);
  if (!config_.val_data.empty())  // fail now, not at the first evaluation
    (void)DataLoader::from_pattern(config_.val_data, config_.batch_size, config_.seq_len,
                                   config_.model.vocab_size);
  inputs_.resize(static_cast<size_t>(tokens_per_batch()));
  targets_.resize(inputs_.size());
  device_inputs_ = DeviceBuffer::of<int32_t>(tokens_per_batch(), MemCategory::Workspace);
  device_targets_ = DeviceBuffer::of<int32_t>(tokens_per_batch(), MemCategory::Workspace);
}

GpuTrainer::~GpuTrainer() = default;

std::shared_ptr<Transformer> GpuTrainer::host_model() {
  model_->download_to(*host_);
  return host_;
}

nlohmann::json GpuTrainer::trainer_state(int64_t step) const {
  // The CPU trainer's keys, so either trainer resumes from the other's checkpoints.
  const LoaderState loader = train_loader_->state();
  return {{"step", step},
          {"optimizer_steps", optimizer_->steps_taken()},
          {"seed", config_.seed},
          {"tokens_seen", step * config_.tokens_per_step()},
          {"loader",
           {{"epoch", loader.epoch},
            {"shard_index", loader.shard_index},
            {"position", loader.position}}},
          {"tokens_per_step", config_.tokens_per_step()},
          {"precision", precision_name(config_)}};
}

std::string GpuTrainer::save(int64_t step) {
  model_->download_to(*host_);
  return save_checkpoint(
      config_.checkpoint_dir, step,
      make_checkpoint_payload(*host_, optimizer_->state_tensors(), trainer_state(step)),
      static_cast<int>(config_.keep_last));
}

int64_t GpuTrainer::restore(const std::string& dir_or_root) {
  const CheckpointReader reader(dir_or_root);
  require_resumable(reader, config_.model, config_.tokens_per_step(), precision_name(config_));
  const nlohmann::json& state = reader.trainer_state();
  // Read on the host, into the host model's values and host tensors shaped like the optimizer
  // state, exactly as the CPU trainer reads its own; then upload.
  NamedTensors optimizer_state = optimizer_->state_tensors();
  std::map<std::string, Tensor> by_name(optimizer_state.begin(), optimizer_state.end());
  auto state_of = [&](const std::string& name) -> Tensor {
    auto it = by_name.find(name);
    return it == by_name.end() ? Tensor() : it->second.view({it->second.numel()});
  };
  std::vector<OwnedSlice> owned;
  for (Parameter* p : host_->parameters())
    owned.push_back({p, p->value.shape(), 0, p->value.numel(), p->value.view({p->value.numel()}),
                     state_of(p->name + ".exp_avg"), state_of(p->name + ".exp_avg_sq"),
                     state_of(p->name + ".master")});
  load_owned_state(reader, owned);
  model_->upload_from(*host_);
  optimizer_->load_state(optimizer_state);  // under bf16 the masters replace the rounded values
  optimizer_->set_steps_taken(state.value("optimizer_steps", int64_t{0}));
  const auto& loader = state.at("loader");
  train_loader_->restore({loader.at("epoch").get<int64_t>(),
                          loader.at("shard_index").get<int64_t>(),
                          loader.at("position").get<int64_t>()});
  return state.at("step").get<int64_t>();
}

void GpuTrainer::upload_batch() {
  // The kernels index tables by these ids unchecked: an id outside the vocabulary would read
  // and (in the embedding backward) write outside them. The shards were checked when read;
  // this keeps the guarantee local, as Transformer::forward's check_inputs does on the CPU.
  const int64_t vocab = config_.model.vocab_size;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (inputs_[i] < 0 || inputs_[i] >= vocab)
      throw_error("token id ", inputs_[i], " at position ", i, " is outside the vocabulary [0, ", vocab, ")");
    if (targets_[i] >= vocab)
      throw_error("target id ", targets_[i], " at position ", i, " is outside the vocabulary [0, ", vocab, ")");
  }
  copy_to_device(device_inputs_.as<int32_t>(), inputs_.data(), inputs_.size() * sizeof(int32_t));
  copy_to_device(device_targets_.as<int32_t>(), targets_.data(), targets_.size() * sizeof(int32_t));
}

double GpuTrainer::train_step(int64_t step) {
  model_->zero_grad();
  const int64_t tokens = tokens_per_batch();
  // Mean over every token of every micro-batch: each micro-batch's summed loss is scaled so
  // the accumulated gradient equals the gradient of the mean (Trainer::train_step).
  const float grad_scale = 1.0f / static_cast<float>(tokens * config_.grad_accum);
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
    train_loader_->next_batch(inputs_.data(), targets_.data());
    upload_batch();
    loss_sum += model_->forward(device_inputs_.as<int32_t>(), device_targets_.as<int32_t>(),
                                config_.batch_size, config_.seq_len, {true, grad_scale});
    model_->backward();
  }
  last_grad_norm_ = std::sqrt(model_->parameters().grad_sum_of_squares());
  optimizer_->step(config_.schedule.at(step), clip_factor(last_grad_norm_, config_.grad_clip));
  // The step's time then covers its last kernels, and a fault inside one surfaces here.
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  return loss_sum / static_cast<double>(tokens * config_.grad_accum);
}

double GpuTrainer::evaluate(const std::string& pattern, int64_t batches) {
  DataLoader loader = DataLoader::from_pattern(pattern, config_.batch_size, config_.seq_len,
                                               config_.model.vocab_size);
  loader.set_shuffle(kEvalShuffleSeed);
  double total = 0.0;
  for (int64_t b = 0; b < batches; ++b) {
    loader.next_batch(inputs_.data(), targets_.data());
    upload_batch();
    total += model_->forward(device_inputs_.as<int32_t>(), device_targets_.as<int32_t>(),
                             config_.batch_size, config_.seq_len, {false, 1.0f});
  }
  return total / static_cast<double>(batches * tokens_per_batch());
}

nlohmann::json GpuTrainer::step_record(const StepReport& report) const {
  nlohmann::json record = step_report_json(report);
  // Device memory by category (peak within the step), as the CPU trainer reports host memory.
  const MemStats mem = cuda::DeviceAllocator::current().stats();
  for (size_t i = 0; i < kMemCategoryCount; ++i)
    record["memory_peak_bytes"][mem_category_name(static_cast<MemCategory>(i))] = mem.peak_bytes[i];
  record["device"] = "cuda";
  return record;
}

TrainSummary GpuTrainer::run() {
  TrainSummary summary;
  std::filesystem::create_directories(config_.run_dir);
  int64_t start_step = 0;
  if (!config_.checkpoint_dir.empty() && config_.resume) {
    if (auto latest = latest_checkpoint(config_.checkpoint_dir)) {
      start_step = restore(*latest);
      std::printf("resumed from %s at step %lld\n", latest->c_str(),
                  static_cast<long long>(start_step));
    }
  }
  summary.first_step = start_step;
  const std::string metrics_path = config_.run_dir + "/metrics.jsonl";
  if (start_step > 0) drop_metrics_after(metrics_path, start_step);
  MetricsLog metrics(metrics_path,
                     start_step > 0 ? MetricsLog::Mode::Append : MetricsLog::Mode::Truncate);

  cuda::DeviceAllocator& allocator = cuda::DeviceAllocator::current();
  const double flops_per_step = flops_per_token(config_.model, config_.seq_len) *
                                static_cast<double>(config_.tokens_per_step());
  // MFU against the dense datasheet peak; NaN (printed "--", logged null) for an unknown GPU.
  auto mfu_of = [&](double flops_per_second) {
    return peak_tflops_ ? flops_per_second / (*peak_tflops_ * 1e12)
                        : std::numeric_limits<double>::quiet_NaN();
  };
  const std::string peak =
      peak_tflops_ ? std::to_string(std::lround(*peak_tflops_)) + " TFLOPS dense " +
                         (config_.precision == Precision::BF16 ? "BF16" : "FP32") + " peak"
                   : std::string("peak unknown (no MFU)");
  std::printf(
      "model %s: %.2fM parameters, %lld layers, d=%lld | %lld tokens/step | %s, recompute %s | "
      "cuda: %s, %s\n",
      architecture_name(config_.model.arch), config_.model.parameter_count() / 1e6,
      static_cast<long long>(config_.model.n_layer), static_cast<long long>(config_.model.n_embd),
      static_cast<long long>(config_.tokens_per_step()),
      config_.precision == Precision::BF16 ? "bf16 (fp32 master)" : "f32",
      recompute_name(config_.recompute), device_description_.c_str(), peak.c_str());
  std::fflush(stdout);

  ProgressBar progress(config_.steps);
  const auto run_start = Clock::now();
  double compute_seconds = 0.0;
  for (int64_t step = start_step; step < config_.steps; ++step) {
    allocator.reset_peaks();
    const auto step_start = Clock::now();
    const double loss = train_step(step);
    const double step_seconds = seconds_since(step_start);
    compute_seconds += step_seconds;
    if (!std::isfinite(loss))
      throw_error("training diverged: loss is ", loss, " at step ", step + 1);
    const StepReport report{step + 1,
                            config_.steps,
                            loss,
                            config_.schedule.at(step),
                            last_grad_norm_,
                            step_seconds * 1e3,
                            static_cast<double>(config_.tokens_per_step()) / step_seconds,
                            mfu_of(flops_per_step / step_seconds),
                            allocator.stats().total_peak_bytes};
    metrics.write(step_record(report));
    summary.last_train_loss = loss;
    summary.steps_done = step + 1;
    const bool last = step + 1 == config_.steps;
    if ((step + 1) % config_.log_every == 0 || last || step == start_step) {
      progress.clear();
      std::printf("%s\n", format_step_line(report).c_str());
      std::fflush(stdout);
    }
    progress.update(step + 1, "loss " + std::to_string(loss).substr(0, 6));
    const bool eval_now =
        !config_.val_data.empty() &&
        ((config_.eval_every > 0 && (step + 1) % config_.eval_every == 0) || last);
    if (eval_now) {
      const double val_loss = evaluate(config_.val_data, config_.eval_batches);
      summary.last_val_loss = val_loss;
      metrics.write({{"kind", "val"}, {"step", step + 1}, {"val_loss", val_loss}});
      progress.clear();
      std::printf("step %6lld | val loss %.4f\n", static_cast<long long>(step + 1), val_loss);
      std::fflush(stdout);
    }
    const bool save_now =
        !config_.checkpoint_dir.empty() &&
        ((config_.checkpoint_every > 0 && (step + 1) % config_.checkpoint_every == 0) || last);
    if (save_now) summary.last_checkpoint = save(step + 1);
  }
  progress.finish();
  const int64_t steps_run = summary.steps_done - start_step;
  summary.mfu = std::numeric_limits<double>::quiet_NaN();
  if (steps_run > 0) {
    summary.tokens_per_s =
        static_cast<double>(steps_run * config_.tokens_per_step()) / compute_seconds;
    summary.mfu = mfu_of(flops_per_step * static_cast<double>(steps_run) / compute_seconds);
  }
  model_->download_to(*host_);  // the host model ends with the trained weights
  if (!config_.val_data.empty())
    summary.unigram_baseline =
        unigram_cross_entropy(config_.train_data, config_.val_data, config_.model.vocab_size);
  write_loss_plot_svg(config_.run_dir + "/loss.svg", MetricsLog::read_all(metrics_path),
                      summary.unigram_baseline);
  char mfu[32] = "--";
  if (std::isfinite(summary.mfu)) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100 * summary.mfu);
  std::printf("done: %lld steps in %s (%.0f tokens/s, MFU %s)\n", static_cast<long long>(steps_run),
              format_duration(seconds_since(run_start)).c_str(), summary.tokens_per_s, mfu);
  return summary;
}

}  // namespace loom::gpu
