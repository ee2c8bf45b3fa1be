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
                                   std::shared_ptr<ProcessGroup> embedding, bool overlap_pairs)
    : model_(model),
      activations_(model),
      tied_(split_tied_embedding(model)),
      pp_(std::move(pp)),
      embedding_(std::move(embedding)),
      channels_(*pp_, stage_placement(schedule) == StagePlacement::V),
      schedule_(schedule),
      placement_(stage_placement(schedule)),
      overlap_pairs_(overlap_pairs) {
  if (overlap_pairs_ && schedule_ != PipelineSchedule::DualPipeV)
    throw_error("pipeline: overlapped forward/backward pairs are DualPipeV's; schedule ",
                schedule_name(schedule_), " has none (use schedule dualpipev, or no overlap)");
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
  const std::string problem =
      pipeline_transfer_problem(actions, pp_->size(), static_cast<int64_t>(model_.chunks().size()),
                                placement_, overlap_pairs_ && train);
  if (!problem.empty())
    throw_error("pipeline ", train ? schedule_name(schedule_) : "forward-only", " schedule with ",
                pp_->size(), " ranks and ", m, " micro-batches: ", problem,
                " (parallel/pipeline_schedule)");
  checked_.emplace_back(train, m);
}

Tensor PipelineExecutor::receive(const PipeTransfer& transfer, Tensor& buffer) {
  const int64_t count = rows_elements();
  if (transfer.from_rank == pp_->rank()) {
    // The V's turn: this rank's own earlier send, in the order sent (as a channel would).
    if (local_.empty() || local_.front().first != transfer)
      throw_error("pipeline: rank ", pp_->rank(), " expects its own ",
                  transfer.kind == PipeMessage::Activation ? "activation" : "gradient", " of micro-batch ",
                  transfer.micro_batch, " for stage ", transfer.stage, ", which it has not sent");
    buffer = std::move(local_.front().second);
    local_.pop_front();
    return buffer.view({rows_, model_.config().n_embd});
  }
  if (buffer.numel() != count)
    buffer = Tensor::empty({count}, DType::F32, MemCategory::CommBuffers, pp_->memory());
  channels_.recv(transfer.kind, buffer, static_cast<int>(transfer.from_rank))->wait();
  return buffer.view({rows_, model_.config().n_embd});
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
                             const std::function<void(bool)>& set_sync, LossSum* loss_sum) {
  check_transfers(actions, train, micro.count);
  const auto& chunks = model_.chunks();
  const int64_t p = pp_->size(), rank = pp_->rank(), v = static_cast<int64_t>(chunks.size());
  rows_ = model_.local_rows(micro.batch, micro.seq_len);
  if (train) timings_.clear();
  const double step_start = TraceRecorder::now_s();
  double loss = 0.0;
  const std::vector<PipeAction>& list = actions[static_cast<size_t>(rank)];
  // One action's work, on the current stream; returns what it sends on (undefined if nothing).
  auto compute = [&](const PipeAction& action, const Tensor& received) {
    const int64_t mb = action.micro_batch;
    const int32_t* tokens = micro.tokens + mb * micro.stride;
    const int32_t* targets = micro.targets + mb * micro.stride;
    const bool sends = transfer_out_of(action, rank, p, v, placement_).has_value();
    Tensor out;
    if (action.op == PipeOp::Forward) {
      loss += activations_.forward(action.chunk, mb, tokens, targets, received, micro.batch,
                                   micro.seq_len, {train, grad_scale, loss_sum});
      if (sends) out = activations_.output(action.chunk, mb);
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
    return out;
  };
  auto timed = [&](const PipeAction& action, double start, double end) {
    if (train)
      timings_.push_back(
          {action.op, action.micro_batch, action.chunk, start - step_start, end - step_start});
  };
  for (size_t i = 0; i < list.size(); ++i) {
    const PipeAction& action = list[i];
    if (overlap_pairs_ && train && starts_forward_backward_pair(list, i)) {
      // dualpipev.py's _forward_backward_chunk: both inputs, both computations, both outputs.
      // The forward is issued first, as in the list: it takes its activation set before the
      // backward gives one back (else it would overwrite the set the backward still reads), and
      // on the CPU the pair then computes exactly what the list in sequence does.
      const PipeAction& backward = list[i + 1];
      if (!streams_) streams_ = std::make_unique<OverlapStreams>(model_.device());
      // The two run at once unless they share memory: recomputation's one stash (Full) or
      // shared recomputables (Selective), and on the rank holding both ends of a tied embedding
      // its one gradient, which the forward's loss adds the head's part into while the first
      // stage's backward scatters the embedding's. Those pairs share one stream.
      const bool tied_ends =
          model_.config().tied_embeddings && model_.holds_embedding() && model_.holds_head();
      const int b_stream = model_.recompute() == Recompute::None && !tied_ends ? 1 : 0;
      const auto f_in = transfer_into(action, rank, p, v, placement_);
      const auto b_in = transfer_into(backward, rank, p, v, placement_);
      const Tensor f_received = f_in ? receive(*f_in, inputs_[0]) : Tensor();
      const Tensor b_received = b_in ? receive(*b_in, inputs_[1]) : Tensor();
      const double start = TraceRecorder::now_s();
      streams_->fork();
      Tensor f_out, b_out;
      {
        const OverlapStreams::Use on = streams_->use(0);
        f_out = compute(action, f_received);
      }
      const double f_issued = TraceRecorder::now_s();
      {
        const OverlapStreams::Use on = streams_->use(b_stream);
        b_out = compute(backward, b_received);
      }
      const double b_issued = TraceRecorder::now_s();
      {
        const OverlapStreams::Use on = streams_->use(0);
        if (const auto to = transfer_out_of(action, rank, p, v, placement_)) send(f_out, *to);
      }
      {
        const OverlapStreams::Use on = streams_->use(b_stream);
        if (const auto to = transfer_out_of(backward, rank, p, v, placement_)) send(b_out, *to);
      }
      streams_->join();
      // Host times: on the CPU each computation's span; on a GPU when each was issued (the
      // sends' copies to the host wait for their streams).
      timed(action, start, f_issued);
      timed(backward, f_issued, b_issued);
      ++i;
      continue;
    }
    const auto in = transfer_into(action, rank, p, v, placement_);
    const Tensor received = in ? receive(*in, inputs_[0]) : Tensor();
    const double start = TraceRecorder::now_s();
    const Tensor out = compute(action, received);
    if (const auto to = transfer_out_of(action, rank, p, v, placement_)) send(out, *to);
    timed(action, start, TraceRecorder::now_s());
  }
  wait_sends();
  return loss;
}

double PipelineExecutor::train_step(const MicroBatches& micro, float grad_scale,
                                    const std::function<void(bool)>& set_sync, LossSum* loss_sum) {
  const double loss = run(pipeline_actions(schedule_, pp_->size(), micro.count,
                                           static_cast<int64_t>(model_.chunks().size())),
                          micro, true, grad_scale, set_sync, loss_sum);
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
