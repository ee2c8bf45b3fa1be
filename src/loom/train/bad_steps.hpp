#pragma once
// Bad steps: a step whose loss or gradient norm is not finite, or whose loss is far above its
// recent median (a spike), is dropped before the optimizer touches anything; after several in
// a row the trainer returns to its last checkpoint and skips the data that led there (PaLM,
// Chowdhery et al. 2022, sec. 5.1). This file holds the judgement and the counters; the
// trainer makes every rank agree on it and does the skipping (docs/CONFIG.md, [bad_steps]).
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom {

struct BadStepConfig {
  bool skip = true;  // false: a non-finite loss stops the run, as before
  double loss_spike_factor =
      0.0;  // > 1: a loss above this multiple of the running median is bad; 0: off
  int64_t median_window = 20;  // good steps' losses the median is taken over
  int64_t rollback_after =
      0;  // bad steps in a row that send the run back to its checkpoint; 0: never
  int64_t max_rollbacks = 3;  // one more and the run stops with an error
};

// Faults a test provokes on purpose (the [debug] table). Steps are 1-based, as printed; each
// fires the first time the run reaches its step, not again when a rollback replays it.
struct FaultInjection {
  std::vector<int64_t> nan_at_steps;         // the last rank's backward scaled by NaN
  std::vector<int64_t> loss_spike_at_steps;  // the last rank's loss multiplied by loss_spike_scale
  double loss_spike_scale = 100.0;
  int slow_rank = -1;  // this world rank sleeps slow_rank_ms in every step's compute; -1: none
  double slow_rank_ms = 0.0;
  // This world rank kills itself (SIGKILL, as a lost node) when step kill_at_step starts, on
  // the first attempt under `loom launch` only (LOOM_LAUNCH_ATTEMPT 0 or unset); 0: never.
  int64_t kill_at_step = 0;
  int kill_rank = 0;
  // kill_rank SIGKILLs itself in the middle of writing this step's checkpoint (after its
  // first file, before the checkpoint is complete), on the first attempt only; 0: never.
  int64_t kill_in_checkpoint_write = 0;
  // Every checkpoint write first sleeps this long (a slow disk), so tests see training go on.
  double slow_checkpoint_write_ms = 0.0;
};

// What is wrong with a step, worst last: the trainer takes the worst verdict over the ranks.
enum class BadStep { None = 0, LossSpike = 1, NonFiniteNorm = 2, NonFiniteLoss = 3 };
const char* bad_step_name(BadStep kind);

struct BadStepVerdict {
  BadStep kind = BadStep::None;
  std::string reason;  // "loss 9.3 is above 2.5 x the median 3.1 of the last 20 steps"
  bool bad() const { return kind != BadStep::None; }
};

class BadStepGuard {
 public:
  explicit BadStepGuard(BadStepConfig config) : config_(config) {}

  // Whether, and why, a step with this loss and gradient norm is bad. Local: the trainer
  // reduces the verdict over every rank before acting on it.
  BadStepVerdict judge(double loss, double grad_norm) const;
  // The agreed verdict: a good step's loss joins the median window, a bad one counts.
  void record(bool bad, double loss);
  // The median of the window, or 0 while it holds fewer than median_window losses (the spike
  // test is off until then).
  double median() const;

  int64_t bad_in_a_row() const { return bad_in_a_row_; }
  int64_t skipped_total() const { return skipped_total_; }
  int64_t rollbacks() const { return rollbacks_; }
  bool rollback_due() const {
    return config_.rollback_after > 0 && bad_in_a_row_ >= config_.rollback_after;
  }
  // Counts a rollback; throws loom::Error when it would be one more than max_rollbacks.
  void count_rollback(int64_t step);

  // The window and the counters, for checkpoints (exact resume keeps judging the same way).
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);
  // A rollback returns to the checkpoint's window; the counters keep what happened since.
  void restore_window(const nlohmann::json& state);
  void restore_counters(const nlohmann::json& state);

  const BadStepConfig& config() const { return config_; }

 private:
  BadStepConfig config_;
  std::deque<double> window_;
  int64_t bad_in_a_row_ = 0, skipped_total_ = 0, rollbacks_ = 0;
};

}  // namespace loom
