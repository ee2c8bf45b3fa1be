#pragma once
// The single-process training loop: micro-batches with gradient accumulation, global-norm
// clipping, the LR schedule, AdamW, evaluation, checkpoints with exact resume, and the
// metrics a user watches (console line, progress bar, JSONL, SVG loss curve).
#include <memory>
#include <optional>

#include "loom/data/data_loader.hpp"
#include "loom/model/transformer.hpp"
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
  explicit Trainer(TrainConfig config);
  TrainSummary run();
  // Mean per-token loss over `batches` batches from a fresh pass of `pattern` (deterministic).
  double evaluate(const std::string& pattern, int64_t batches);
  Transformer& model() { return *model_; }

 private:
  double train_step(int64_t step);
  std::string save(int64_t step);
  nlohmann::json trainer_state(int64_t step) const;

  TrainConfig config_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<DataLoader> train_loader_;
  std::vector<int32_t> inputs_, targets_;
  double last_grad_norm_ = 0;
};

}  // namespace loom
