#pragma once
// Runs a pipeline schedule (parallel/pipeline_schedule's action lists) on this rank's model
// chunks: forwards and backwards of micro-batches in the listed order, activations and their
// gradients passed to the neighbouring stages with point-to-point sends and receives over the
// pp group. The same lists drive the planner's timeline simulation, so AFAB, 1F1B and
// interleaved 1F1B differ here only in their data.
//
// Sends are asynchronous and receives block, so a rank waits only for the data its next
// action needs. Messages travel on parallel/pipeline_channels' one-way channels, which match
// in issue order on MPI as on NCCL; before a step runs, pipeline_transfer_problem checks that
// its lists agree on every channel's order and cannot deadlock, so a schedule that breaks
// either is refused by name instead of hanging or swapping micro-batches.
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "loom/core/overlap_streams.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/model/transformer.hpp"
#include "loom/parallel/pipeline_activations.hpp"
#include "loom/parallel/pipeline_channels.hpp"
#include "loom/parallel/pipeline_schedule.hpp"

namespace loom {

// `count` micro-batches of batch x seq_len tokens, micro-batch k at tokens + k * stride.
struct MicroBatches {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t count = 0, batch = 0, seq_len = 0, stride = 0;
};

// One action as it ran: seconds since the step began on this rank.
struct ActionTiming {
  PipeOp op;
  int64_t micro_batch, chunk;
  double start_s, end_s;
};

// Tied embeddings cut over pipeline stages: the first stage's token embedding and the last
// stage's copy (Parameter::pipeline_copy) each get part of the gradient, whole only once the two
// are summed (Megatron-LM's embedding group). Returns this rank's part (empty when it holds none,
// or holds both ends).
ParameterList split_tied_embedding(Transformer& model);

class PipelineExecutor {
 public:
  // `model` holds this rank's chunks (pipeline_chunks of the pp group's rank; the chunk count
  // is v). `embedding` is the group of the first and last stage (the pp group's ranks 0 and
  // pp - 1), needed when the model's tied embeddings span stages, else null. The model's
  // backward then leaves the tied embedding's gradient for this executor to report ready.
  // `overlap_pairs` (DualPipeV only) runs each forward/backward pair of the schedule
  // (starts_forward_backward_pair) as DeepSeek's dualpipev.py does: both inputs received, then
  // the forward and the backward issued, on a GPU each on its own stream (OverlapStreams) so
  // that they run at once, then both outputs sent. On the CPU the two run one after the other.
  // Pairs that share memory share a stream (recomputation's shared stash; the tied
  // embedding's one gradient where a rank holds both ends).
  PipelineExecutor(Transformer& model, std::shared_ptr<ProcessGroup> pp, PipelineSchedule schedule,
                   std::shared_ptr<ProcessGroup> embedding = nullptr, bool overlap_pairs = false);

  // Forward and backward of every micro-batch in the schedule's order; gradients accumulate.
  // `set_sync(last)` is called before each backward with whether it is its chunk's last of
  // the step, so gradient reduction hooks (data parallelism, ZeRO) fire on the final
  // gradients only. With tied embeddings across stages, their two gradient parts are summed
  // over `embedding` at the end and only then reported ready. Returns the summed loss of
  // every micro-batch on ranks that hold the last stage, 0 on others; with `loss_sum`, adds it
  // there instead (ForwardOptions::loss_sum) and returns 0.
  double train_step(const MicroBatches& micro, float grad_scale,
                    const std::function<void(bool)>& set_sync = {}, LossSum* loss_sum = nullptr);
  // Forwards only (no gradients), every rank in micro-batch order. The loss as train_step.
  double forward_only(const MicroBatches& micro);

  const std::vector<ActionTiming>& last_timings() const { return timings_; }
  const PipelineActivations& activations() const { return activations_; }
  PipelineSchedule schedule() const { return schedule_; }
  int64_t stages() const { return stages_; }

 private:
  // Runs `actions` (this rank's list is actions[pp rank]) after checking the whole set with
  // pipeline_transfer_problem (once per distinct shape).
  double run(const std::vector<std::vector<PipeAction>>& actions, const MicroBatches& micro,
             bool train, float grad_scale, const std::function<void(bool)>& set_sync,
             LossSum* loss_sum = nullptr);
  void check_transfers(const std::vector<std::vector<PipeAction>>& actions, bool train, int64_t m);
  // Blocks until `transfer` has arrived in `buffer` (one of inputs_); returns it as [rows, C].
  // Messages travel as f32 buffers in the pp group's memory (the host for MPI, the GPU for NCCL);
  // the model's tensors are copied in and out, from any device and dtype.
  Tensor receive(const PipeTransfer& transfer, Tensor& buffer);
  void send(const Tensor& data, const PipeTransfer& transfer);
  void wait_sends();
  int64_t rows_elements() const { return rows_ * model_.config().n_embd; }

  Transformer& model_;
  PipelineActivations activations_;
  ParameterList tied_;  // split_tied_embedding(model_)
  std::shared_ptr<ProcessGroup> pp_, embedding_;
  PipelineChannels channels_;
  std::vector<std::pair<bool, int64_t>> checked_;  // (train, micro-batches) already checked
  PipelineSchedule schedule_;
  StagePlacement placement_;
  int64_t stages_ = 1;
  int64_t rows_ = 0;  // this rank's rows of a micro-batch
  bool overlap_pairs_ = false;
  std::unique_ptr<OverlapStreams> streams_;  // for overlapped pairs, made on first use
  Tensor inputs_[2];  // CommBuffers: the received activation or gradient (a pair's second: [1])
  struct PendingSend {
    Tensor data;      // CommBuffers: the send's own copy, reused once the send completes
    WorkHandle work;  // null once complete
  };
  std::vector<PendingSend> sends_;
  // Transfers between this rank's own chunks (the V's turn), oldest first.
  std::deque<std::pair<PipeTransfer, Tensor>> local_;
  std::vector<ActionTiming> timings_;
};

}  // namespace loom
