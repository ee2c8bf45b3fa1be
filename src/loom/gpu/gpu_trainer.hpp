#pragma once
// The training loop on one CUDA GPU: loom::Trainer's loop for one process (micro-batches with
// gradient accumulation, global-norm clipping, the LR schedule, AdamW, evaluation, checkpoints
// with exact resume, the console step line and metrics.jsonl), with the model and optimizer on
// the device. Weights start from the host model's initialisation and come back to it for
// checkpoints, which are the CPU trainer's single-file checkpoints: a run can stop on one
// device and resume on the other.
//
// Only host headers here, so the `loom` binary's main.cpp can include this without CUDA's.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/data_loader.hpp"
#include "loom/gpu/device_buffer.hpp"
#include "loom/model/transformer.hpp"
#include "loom/obs/step_line.hpp"
#include "loom/train/train_config.hpp"
#include "loom/train/trainer.hpp"

namespace loom::gpu {

class GpuTransformer;
class GpuAdamW;

class GpuTrainer {
 public:
  // Validates first (what one GPU cannot train yet, see check_single_gpu_training; then that a
  // device is visible), so a refused config never touches a GPU. config.device is not read:
  // constructing this trainer is asking for the GPU.
  explicit GpuTrainer(TrainConfig config);
  ~GpuTrainer();
  GpuTrainer(const GpuTrainer&) = delete;
  GpuTrainer& operator=(const GpuTrainer&) = delete;

  TrainSummary run();
  // Mean per-token loss over `batches` batches from a fresh pass of `pattern` (deterministic).
  double evaluate(const std::string& pattern, int64_t batches);
  // Loads weights, optimizer state and data position from a single-file checkpoint (written on
  // either device); returns its step.
  int64_t restore(const std::string& dir_or_root);
  // Writes a checkpoint of the current state as step `step`; returns its directory.
  std::string save(int64_t step);
  // The model on the host with the current weights (downloaded by this call): what checkpoints
  // hold as the weights, and what samples and CPU evaluation use.
  std::shared_ptr<Transformer> host_model();
  GpuTransformer& device_model() { return *model_; }

 private:
  double train_step(int64_t step);
  nlohmann::json trainer_state(int64_t step) const;
  nlohmann::json step_record(const StepReport& report) const;
  // Copies one batch to the device token buffers.
  void upload_batch();
  int64_t tokens_per_batch() const { return config_.batch_size * config_.seq_len; }

  TrainConfig config_;
  std::string device_description_;     // name, compute capability, memory
  std::optional<double> peak_tflops_;  // dense peak for the compute dtype; none: no MFU
  std::shared_ptr<Transformer> host_;
  std::unique_ptr<GpuTransformer> model_;
  std::unique_ptr<GpuAdamW> optimizer_;
  std::unique_ptr<DataLoader> train_loader_;
  std::vector<int32_t> inputs_, targets_;  // one batch on the host
  DeviceBuffer device_inputs_, device_targets_;
  double last_grad_norm_ = 0;
};

}  // namespace loom::gpu
