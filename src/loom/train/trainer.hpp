#pragma once
// The single-process training loop: micro-batches with gradient accumulation, global-norm
// clipping, the LR schedule, AdamW, evaluation, checkpoints with exact resume, and the
// metrics a user watches (console line, progress bar, JSONL, SVG loss curve).
#include <memory>
#include <optional>

#include "loom/data/data_loader.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/zero_optimizer.hpp"
#include "loom/model/transformer.hpp"
#include "loom/obs/step_line.hpp"
#include "loom/obs/trace.hpp"
#include "loom/train/adamw.hpp"
#include "loom/train/train_config.hpp"

namespace loom {

struct TrainSummary {
  int64_t first_step = 0;  // > 0 when resumed
  int64_t steps_done = 0;
  double last_train_loss = 0;
  std::optional<double> last_val_loss;
  std::optional<double> unigram_baseline;  // val cross-entropy under train token frequencies
  double tokens_per_s = 0;
  double mfu = 0;
  std::string last_checkpoint;
};

class Trainer {
 public:
  // `world` (null: one process) is laid out as dp x tp with tp = parallel.tp innermost
  // (DeviceMesh). Each of the dp replicas trains on its 1/dp slice of every global batch of
  // dp x batch_size sequences, gradients averaged over dp in buckets during backward (or
  // sharded by ZeRO); the tp ranks of a replica split every layer (TensorParallelPlan) and see
  // the same tokens. World rank 0 alone prints and logs; checkpoints name whole tensors, so
  // they load at any dp, tp and ZeRO stage.
  explicit Trainer(TrainConfig config, std::shared_ptr<ProcessGroup> world = nullptr);
  TrainSummary run();
  // Mean per-token loss over `batches` batches from a fresh pass of `pattern` (deterministic).
  double evaluate(const std::string& pattern, int64_t batches);
  Transformer& model() { return *model_; }
  // Loads weights, optimizer state and data position from a checkpoint of any layout (a
  // directory or a root's latest); returns its step. Collective under data parallelism.
  int64_t restore(const std::string& dir_or_root);
  // Writes a checkpoint of the current state as step `step`; returns its directory (empty on
  // ranks other than 0 for the single-file format). Collective under data parallelism.
  std::string save(int64_t step);
  const GradientBucketReducer* reducer() const { return reducer_.get(); }
  ZeroOptimizer* zero_optimizer() { return zero_.get(); }
  int64_t global_tokens_per_step() const { return config_.tokens_per_step() * dp_size_; }

 private:
  double train_step(int64_t step);
  nlohmann::json trainer_state(int64_t step) const;

  TrainConfig config_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<DataLoader> train_loader_;
  bool is_rank0() const { return world_rank_ == 0; }
  double average_over_ranks(double value) const;
  nlohmann::json step_record(const StepReport& report) const;

  std::shared_ptr<ProcessGroup> world_, dp_, tp_;  // null without a world; tp_ only when tp > 1
  std::unique_ptr<GradientBucketReducer> reducer_;
  std::unique_ptr<ZeroOptimizer> zero_;  // replaces optimizer_ + reducer_ under ZeRO 1-3
  int64_t optimizer_steps() const;
  int dp_rank_ = 0, dp_size_ = 1, tp_size_ = 1, world_rank_ = 0;
  // What this rank owns of the checkpointed state, in whole-tensor coordinates.
  std::vector<OwnedSlice> owned_state();
  std::vector<int32_t> inputs_, targets_;              // one rank-sized batch (evaluation)
  std::vector<int32_t> global_inputs_, global_targets_;  // the global batch (training)
  std::unique_ptr<TraceRecorder> trace_;
  double last_grad_norm_ = 0;
};

}  // namespace loom
