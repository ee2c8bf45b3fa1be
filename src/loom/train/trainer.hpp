#pragma once
// The single-process training loop: micro-batches with gradient accumulation, global-norm
// clipping, the LR schedule, AdamW, evaluation, checkpoints with exact resume, and the
// metrics a user watches (console line, progress bar, JSONL, SVG loss curve).
#include <memory>
#include <optional>
#include <string>

#include "loom/data/data_loader.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/model/transformer.hpp"
#include "loom/obs/step_line.hpp"
#include "loom/obs/trace.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/pipeline_executor.hpp"
#include "loom/parallel/zero_optimizer.hpp"
#include "loom/train/async_checkpoint.hpp"
#include "loom/train/stragglers.hpp"
#include "loom/train/train_config.hpp"
#include "loom/train/trainer_mesh.hpp"

namespace loom {

class GroupExpertExchange;  // parallel/expert_parallel.hpp

struct TrainSummary {
  int64_t first_step = 0;  // > 0 when resumed
  int64_t steps_done = 0;
  double last_train_loss = 0;
  std::optional<double> last_val_loss;
  int64_t skipped_steps = 0;  // bad steps dropped ([bad_steps]), over the whole run
  int64_t rollbacks = 0;      // returns to a checkpoint after bad steps in a row
  std::optional<double> unigram_baseline;  // val cross-entropy under train token frequencies
  double tokens_per_s = 0;
  double mfu = 0;
  std::string last_checkpoint;
};

class Trainer {
 public:
  // `world` (null: one process) is laid out as pp x dp x tp with tp = parallel.tp innermost
  // and pp = parallel.pp outermost (DeviceMesh). Each of the dp replicas trains on its 1/dp
  // slice of every global batch of dp x batch_size sequences, gradients averaged over dp in
  // buckets during backward (or sharded by ZeRO); the tp ranks of a replica split every layer
  // (TensorParallelPlan) and see the same tokens; the pp ranks hold consecutive stages of
  // layers and run the grad_accum micro-batches through them on a pipeline schedule
  // (PipelineExecutor). World rank 0 alone prints and logs; checkpoints name whole tensors,
  // so they load at any dp, tp, pp and ZeRO stage.
  explicit Trainer(TrainConfig config, std::shared_ptr<ProcessGroup> world = nullptr);
  TrainSummary run();
  // Mean per-token loss over `batches` batches from a fresh pass of `pattern` (deterministic).
  double evaluate(const std::string& pattern, int64_t batches);
  Transformer& model() { return *model_; }
  const PipelineExecutor* pipeline() const { return pipeline_.get(); }  // null without pp
  // Loads weights, optimizer state and data position from a checkpoint of any layout (a
  // directory or a root's latest); returns its step. Collective under data parallelism.
  int64_t restore(const std::string& dir_or_root);
  // train.init_from: the weights of a Hugging Face model directory, on this run's layout.
  void initialise_from(const std::string& hf_dir);
  // Writes a checkpoint of the current state as step `step`; returns its directory (empty on
  // ranks other than 0 for the single-file format). Collective under data parallelism.
  std::string save(int64_t step);
  const GradientBucketReducer* reducer() const { return reducer_.get(); }
  // The optimizer, and the same object as ZeRO's when parallel.zero_stage shards it.
  Optimizer& optimizer() { return *optimizer_; }
  ZeroOptimizer* zero_optimizer() { return dynamic_cast<ZeroOptimizer*>(optimizer_.get()); }
  int64_t global_tokens_per_step() const { return config_.tokens_per_step() * groups_.dp_size; }
  // train.precision = "fp8": the whole model's amax histories (Fp8Training::amax_history),
  // assembled from the pipeline stages and ep ranks holding its layers; empty otherwise.
  // Collective over pp and ep.
  std::vector<float> fp8_amax_history() const;

 private:
  // What one step did: the loss and norm every rank agrees on, and whether it was dropped.
  struct StepOutcome {
    double loss = 0, grad_norm = 0;
    BadStepVerdict bad;  // bad(): the step was skipped, and why
  };
  StepOutcome train_step(int64_t step);
  // Whether a fault [debug] asks for fires at 0-based `step` (each fires once).
  bool inject_now(const std::vector<int64_t>& steps, int64_t step);
  // Agrees over the world on whether a step is bad: the worst rank's verdict counts. A rank
  // that found nothing wrong itself reports which rank did and why in general terms.
  BadStepVerdict agree_bad_step(BadStepVerdict local) const;
  // Back to the latest checkpoint's weights, optimizer state and step, with the data position
  // kept where the bad steps left it (so their data and what came before them since the
  // checkpoint are skipped). Collective.
  struct Rollback {
    std::string checkpoint;
    int64_t to_step = 0;
  };
  Rollback roll_back();
  nlohmann::json trainer_state(int64_t step) const;
  // A save inside run(): through checkpointer_ (checkpoint.async) or save(); appends the
  // metrics records of what it cost (async_checkpoint.hpp) to `records`.
  std::string checkpoint_in_run(int64_t step, std::vector<nlohmann::json>& records);
  AsyncCheckpointOptions checkpoint_options() const;
  bool writes_sharded() const;  // every rank its pieces (sharded format), not rank 0 one file
  std::unique_ptr<AsyncCheckpointer> checkpointer_;  // run() with checkpoint.async

  TrainConfig config_;
  std::unique_ptr<Transformer> model_;
  // The step's summed loss on the model's device: the host reads it once a step, after the
  // optimizer's gradient norm (which waits for the device anyway), not once per micro-batch.
  std::unique_ptr<LossSum> loss_sum_;
  Fp8Training* fp8_ = nullptr;  // the model's FP8 scaling state under train.precision = "fp8"
  // AdamW, or ZeRO's sharded AdamW under data parallelism with zero_stage > 0.
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<DataLoader> train_loader_;
  bool is_rank0() const { return groups_.world_rank == 0; }
  nlohmann::json step_record(const StepReport& report) const;

  TrainerGroups groups_;  // world, dp, tp, pp and embedding groups, this rank's coordinates
  std::unique_ptr<GradientBucketReducer> reducer_;  // plain data parallelism (ZeRO reduces itself)
  std::unique_ptr<PipelineExecutor> pipeline_;  // pp > 1
  std::shared_ptr<ContextAttention> cp_attention_;  // cp > 1
  std::shared_ptr<GroupExpertExchange> expert_exchange_;  // ep > 1
  int64_t optimizer_steps() const;
  // The loss of this step, from the stages that compute it, the same on every rank.
  void update_moe_bias();
  double mean_loss_over_ranks(double local_sum, double tokens) const;
  // What the last pipeline stage holds of `value`, on every pp rank (no pipeline: `value`).
  double from_last_stage(double value) const;
  void run_micro_batches(double& loss_sum, float grad_scale);
  void report_pipeline(int64_t step);
  // What this rank owns of the checkpointed state, in whole-tensor coordinates.
  std::vector<OwnedSlice> owned_state();
  std::vector<int32_t> inputs_, targets_;              // one rank-sized batch (evaluation)
  // The global batch of every micro-batch of a step (training): pipelining needs them all.
  std::vector<int32_t> global_inputs_, global_targets_;
  std::unique_ptr<TraceRecorder> trace_;
  BadStepGuard bad_steps_;
  // The world again, for the trainer's own small agreements (the bad-step verdict, the ranks'
  // compute times), so that they never show in the data groups' wire bytes. Null: one process.
  std::shared_ptr<ProcessGroup> control_;
  // Stragglers: this rank's forward + backward seconds since the last log point, and the
  // ranks' compared at the log point (collective over the world).
  double compute_seconds_since_log_ = 0;
  int64_t steps_since_log_ = 0;
  RankTimes gather_rank_times();
  std::vector<std::pair<int64_t, bool>> fired_;  // (0-based step, nan?) injections already done
};

}  // namespace loom
