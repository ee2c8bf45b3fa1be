#include "loom/parallel/pipeline_executor.hpp"

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/obs/trace.hpp"

namespace loom {

ParameterList split_tied_embedding(Transformer& model) {
  if (model.config().tied_embeddings && model.holds_embedding() != model.holds_head())
    return {&model.token_embedding};
  return {};
}

PipelineExecutor::PipelineExecutor(Transformer& model, std::shared_ptr<ProcessGroup> pp,
                                   PipelineSchedule schedule,
                                   std::shared_ptr<ProcessGroup> embedding)
    : model_(model),
      activations_(model),
      tied_(split_tied_embedding(model)),
      pp_(std::move(pp)),
      embedding_(std::move(embedding)),
      channels_(*pp_, stage_placement(schedule) == StagePlacement::V),
      schedule_(schedule),
      placement_(stage_placement(schedule)) {
  const auto& chunks = model_.chunks();
  const int64_t p = pp_->size(), v = static_cast<int64_t>(chunks.size());
  stages_ = p * v;
  for (int64_t c = 0; c < v; ++c) {
    const ModelChunk& chunk = chunks[static_cast<size_t>(c)];
    const int64_t expected = stage_of(c, pp_->rank(), p, placement_);
    if (chunk.stages != stages_ || chunk.stage != expected)
      throw_error("pipeline: chunk ", c, " of pp rank ", pp_->rank(), " is stage ", chunk.stage,
                  " of ", chunk.stages, ", expected stage ", expected, " of ", stages_, " under schedule ",
                  schedule_name(schedule), " (model/pipeline_layout)");
  }
  if (!tied_.empty() && (!embedding_ || embedding_->size() != 2))
    throw_error(
        "pipeline: tied embeddings span the first and last stage, which need an embedding group of "
        "those two ranks");
  model_.defer_grads_ready(tied_);
}

void PipelineExecutor::check_transfers(const std::vector<std::vector<PipeAction>>& actions,
                                       bool train, int64_t m) {
  for (const auto& seen : checked_)
    if (seen == std::pair{train, m}) return;
  const std::string problem = pipeline_transfer_problem(
      actions, pp_->size(), static_cast<int64_t>(model_.chunks().size()), placement_);
  if (!problem.empty())
    throw_error("pipeline ", train ? schedule_name(schedule_) : "forward-only", " schedule with ",
                pp_->size(), " ranks and ", m, " micro-batches: ", problem,
                " (parallel/pipeline_schedule)");
  checked_.emplace_back(train, m);
}

Tensor PipelineExecutor::receive(const PipeTransfer& transfer) {
  const int64_t count = rows_elements();
  if (transfer.from_rank == pp_->rank()) {
    // The V's turn: this rank's own earlier send, in the order sent (as a channel would).
    if (local_.empty() || local_.front().first != transfer)
      throw_error("pipeline: rank ", pp_->rank(), " expects its own ",
                  transfer.kind == PipeMessage::Activation ? "activation" : "gradient", " of micro-batch ",
                  transfer.micro_batch, " for stage ", transfer.stage, ", which it has not sent");
    input_ = std::move(local_.front().second);
    local_.pop_front();
    return input_.view({rows_, model_.config().n_embd});
  }
  if (input_.numel() != count)
    input_ = Tensor::empty({count}, DType::F32, MemCategory::CommBuffers, pp_->memory());
  channels_.recv(transfer.kind, input_, static_cast<int>(transfer.from_rank))->wait();
  return input_.view({rows_, model_.config().n_embd});
}

void PipelineExecutor::send(const Tensor& data, const PipeTransfer& transfer) {
  const int64_t count = rows_elements();
  if (transfer.to_rank == pp_->rank()) {
    // Copied out now: `data` is a view of an activation set or a gradient that later actions
    // reuse.
    Tensor copy = Tensor::empty({count}, DType::F32, MemCategory::CommBuffers, pp_->memory());
    copy.copy_from(data);
    local_.emplace_back(transfer, std::move(copy));
    return;
  }
  PendingSend* slot = nullptr;
  for (PendingSend& s : sends_) {
    if (s.work && s.work->test()) s.work.reset();  // also drives MPI's progress
    if (!slot && !s.work && s.data.numel() == count) slot = &s;
  }
  if (!slot) {
    sends_.push_back(
        {Tensor::empty({count}, DType::F32, MemCategory::CommBuffers, pp_->memory()), nullptr});
    slot = &sends_.back();
  }
  // From the model's device and dtype into the f32 message buffer in the group's memory.
  slot->data.copy_from(data);
  slot->work = channels_.send(transfer.kind, slot->data, static_cast<int>(transfer.to_rank));
}

void PipelineExecutor::wait_sends() {
  for (PendingSend& s : sends_)
    if (s.work) {
      s.work->wait();
      s.work.reset();
    }
}

double PipelineExecutor::run(const std::vector<std::vector<PipeAction>>& actions,
                             const MicroBatches& micro, bool train, float grad_scale,
                             const std::function<void(bool)>& set_sync) {
  check_transfers(actions, train, micro.count);
  const auto& chunks = model_.chunks();
  const int64_t p = pp_->size(), rank = pp_->rank(), v = static_cast<int64_t>(chunks.size());
  rows_ = model_.local_rows(micro.batch, micro.seq_len);
  if (train) timings_.clear();
  const double step_start = TraceRecorder::now_s();
  double loss = 0.0;
  for (const PipeAction& action : actions[static_cast<size_t>(rank)]) {
    const int64_t mb = action.micro_batch;
    const int32_t* tokens = micro.tokens + mb * micro.stride;
    const int32_t* targets = micro.targets + mb * micro.stride;
    const auto in = transfer_into(action, rank, p, v, placement_);
    const auto to = transfer_out_of(action, rank, p, v, placement_);
    const Tensor received = in ? receive(*in) : Tensor();
    const double start = TraceRecorder::now_s();
    Tensor out;
    if (action.op == PipeOp::Forward) {
      loss += activations_.forward(action.chunk, mb, tokens, targets, received, micro.batch,
                                   micro.seq_len, {train, grad_scale});
      if (to) out = activations_.output(action.chunk, mb);
    } else if (action.op == PipeOp::BackwardInput) {
      out = activations_.backward(action.chunk, mb, received, /*defer_weights=*/true);
    } else {
      // Gradients are reported ready where the parameter gradients are computed: the whole
      // backward, or W.
      if (set_sync) set_sync(mb == micro.count - 1);
      if (action.op == PipeOp::BackwardWeight)
        activations_.backward_weights(action.chunk, mb);
      else
        out = activations_.backward(action.chunk, mb, received);
    }
    if (to) send(out, *to);
    if (train)
      timings_.push_back(
          {action.op, mb, action.chunk, start - step_start, TraceRecorder::now_s() - step_start});
  }
  wait_sends();
  return loss;
}

double PipelineExecutor::train_step(const MicroBatches& micro, float grad_scale,
                                    const std::function<void(bool)>& set_sync) {
  const double loss = run(pipeline_actions(schedule_, pp_->size(), micro.count,
                                           static_cast<int64_t>(model_.chunks().size())),
                          micro, true, grad_scale, set_sync);
  if (!tied_.empty()) {
    // The first stage's embedding gradient plus the last stage's head gradient: the gradient
    // of the one tied matrix, which both copies then step with.
    comm::all_reduce(*embedding_, tied_.front()->grad, ReduceOp::Sum)->wait();
    if (set_sync) set_sync(true);
    model_.report_grads_ready(tied_);
  }
  return loss;
}

double PipelineExecutor::forward_only(const MicroBatches& micro) {
  return run(forward_only_actions(pp_->size(), micro.count,
                                  static_cast<int64_t>(model_.chunks().size())),
             micro, false, 1.0f, {});
}

}  // namespace loom
