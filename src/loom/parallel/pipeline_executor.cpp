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
      schedule_(schedule) {
  const auto& chunks = model_.chunks();
  const int64_t p = pp_->size(), v = static_cast<int64_t>(chunks.size());
  stages_ = p * v;
  for (int64_t c = 0; c < v; ++c) {
    const ModelChunk& chunk = chunks[static_cast<size_t>(c)];
    if (chunk.stages != stages_ || chunk.stage != c * p + pp_->rank())
      throw_error("pipeline: chunk ", c, " of pp rank ", pp_->rank(), " is stage ", chunk.stage,
                  " of ", chunk.stages, ", expected stage ", c * p + pp_->rank(), " of ", stages_,
                  " (model/pipeline_layout)");
  }
  if (!tied_.empty() && (!embedding_ || embedding_->size() != 2))
    throw_error(
        "pipeline: tied embeddings span the first and last stage, which need an embedding group of "
        "those two ranks");
  model_.defer_grads_ready(tied_);
}

int PipelineExecutor::tag(int64_t micro, int64_t stage, Direction direction) const {
  return static_cast<int>((micro * stages_ + stage) * 2 + direction);
}

Tensor PipelineExecutor::receive(int64_t micro, int64_t stage, Direction direction) {
  const int64_t count = rows_elements();
  if (input_.numel() != count)
    input_ = Tensor::empty({count}, DType::F32, MemCategory::CommBuffers, pp_->memory());
  const int64_t from = direction == kActivation ? stage - 1 : stage + 1;
  comm::recv(*pp_, input_, peer_of_stage(from), tag(micro, stage, direction))->wait();
  return input_.view({rows_, model_.config().n_embd});
}

void PipelineExecutor::send(const Tensor& data, int64_t micro, int64_t to_stage,
                            Direction direction) {
  const int64_t count = rows_elements();
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
  slot->work = comm::send(*pp_, slot->data, peer_of_stage(to_stage), tag(micro, to_stage, direction));
}

void PipelineExecutor::wait_sends() {
  for (PendingSend& s : sends_)
    if (s.work) {
      s.work->wait();
      s.work.reset();
    }
}

double PipelineExecutor::train_step(const MicroBatches& micro, float grad_scale,
                                    const std::function<void(bool)>& set_sync) {
  const auto& chunks = model_.chunks();
  const auto actions =
      pipeline_actions(schedule_, pp_->size(), micro.count, static_cast<int64_t>(chunks.size()));
  rows_ = model_.plan().local_rows(micro.batch * micro.seq_len);
  timings_.clear();
  const double step_start = TraceRecorder::now_s();
  double loss = 0.0;
  for (const PipeAction& action : actions[static_cast<size_t>(pp_->rank())]) {
    const ModelChunk& chunk = chunks[static_cast<size_t>(action.chunk)];
    const int64_t mb = action.micro_batch;
    const int32_t* tokens = micro.tokens + mb * micro.stride;
    const int32_t* targets = micro.targets + mb * micro.stride;
    double start = 0;
    if (action.op == PipeOp::Forward) {
      const Tensor input = chunk.first_stage() ? Tensor() : receive(mb, chunk.stage, kActivation);
      start = TraceRecorder::now_s();
      loss += activations_.forward(action.chunk, mb, tokens, targets, input, micro.batch,
                                   micro.seq_len, {true, grad_scale});
      if (!chunk.last_stage())
        send(activations_.output(action.chunk, mb), mb, chunk.stage + 1, kActivation);
    } else {
      const Tensor d_output = chunk.last_stage() ? Tensor() : receive(mb, chunk.stage, kGradient);
      if (set_sync) set_sync(mb == micro.count - 1);
      start = TraceRecorder::now_s();
      const Tensor d_input = activations_.backward(action.chunk, mb, d_output);
      if (!chunk.first_stage()) send(d_input, mb, chunk.stage - 1, kGradient);
    }
    timings_.push_back(
        {action.op, mb, action.chunk, start - step_start, TraceRecorder::now_s() - step_start});
  }
  wait_sends();
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
  const auto& chunks = model_.chunks();
  rows_ = model_.plan().local_rows(micro.batch * micro.seq_len);
  double loss = 0.0;
  // Every rank goes through (micro-batch, chunk) in increasing order, which is each stage's
  // order of dependence on the one before: no rank waits on one that waits on it.
  for (int64_t mb = 0; mb < micro.count; ++mb) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      const ModelChunk& chunk = chunks[c];
      const Tensor input = chunk.first_stage() ? Tensor() : receive(mb, chunk.stage, kActivation);
      loss += activations_.forward(static_cast<int64_t>(c), mb, micro.tokens + mb * micro.stride,
                                   micro.targets + mb * micro.stride, input, micro.batch,
                                   micro.seq_len, {false, 1.0f});
      if (!chunk.last_stage())
        send(activations_.output(static_cast<int64_t>(c), mb), mb, chunk.stage + 1, kActivation);
    }
  }
  wait_sends();
  return loss;
}

}  // namespace loom
