// Transformer's backward: a chunk's blocks in reverse with the unit hooks ZeRO drives, the
// head and embeddings, tensor parallelism's partial gradients summed over tp, and the split
// backward (B now, W queued) of the zero-bubble schedules. The rest is in transformer.cpp.
#include <algorithm>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/transformer.hpp"

namespace loom {

template <typename Run>
void Transformer::with_partial_grads(const ParameterList& params, Run run) {
  if (params.empty()) {
    run();
    return;
  }
  std::vector<Tensor> grads;
  for (Parameter* p : params) {
    grads.push_back(p->grad);
    p->grad = Tensor::zeros(p->grad.shape(), DType::F32, MemCategory::Workspace, p->grad.device());
  }
  run();
  plan_->sum_partial_grads(params);
  for (size_t i = 0; i < params.size(); ++i) {
    ops::add_into(grads[i], params[i]->grad);
    params[i]->grad = grads[i];
  }
}

template <typename Run>
void Transformer::backward_part(const ParameterList& partial, const ParameterList& ready,
                                ops::DeferredWeightGrads* weights, Run run) {
  if (!weights) {
    with_partial_grads(partial, run);
    grads_ready(ready);
    return;
  }
  // B: the partial parameters' queued gradients land in fresh tensors, as with_partial_grads'
  // would, so that W can sum them over tp and add them in exactly as it does.
  std::vector<Tensor> fresh, held;
  for (Parameter* p : partial) {
    held.push_back(p->grad);
    p->grad = Tensor::zeros(p->grad.shape(), DType::F32, MemCategory::Workspace, p->grad.device());
    fresh.push_back(p->grad);
  }
  {
    ops::DeferWeightGrads defer(*weights);
    run();
  }
  for (size_t i = 0; i < partial.size(); ++i) partial[i]->grad = held[i];
  weights->add([this, partial, ready, fresh] {
    std::vector<Tensor> whole;
    for (size_t i = 0; i < partial.size(); ++i) {
      whole.push_back(partial[i]->grad);
      partial[i]->grad = fresh[i];
    }
    if (!partial.empty()) plan_->sum_partial_grads(partial);
    for (size_t i = 0; i < partial.size(); ++i) {
      ops::add_into(whole[i], partial[i]->grad);
      partial[i]->grad = whole[i];
    }
    grads_ready(ready);
  });
}

Tensor Transformer::backward_chunk(int64_t chunk_index, ChunkActivations& a,
                                   const Tensor& d_output, ops::DeferredWeightGrads* weights) {
  const ModelChunk& chunk = this->chunk(chunk_index);
  if (!a.grad_ready || a.layers() != chunk.layers())
    throw_error("backward of chunk ", chunk_index, " needs its forward with compute_grad first");
  if (a.format != format_)
    throw_error("backward of chunk ", chunk_index, ": its activations are on ",
                device_name(a.format.device), " ", dtype_name(a.format.dtype),
                ", the model now on ", device_name(format_.device), " ", dtype_name(format_.dtype),
                " (to_device ran between this forward and its backward)");
  if (weights && (unit_hooks_.before_backward || unit_hooks_.after_backward))
    throw_error("a split backward (B now, W later) with ZeRO-3: its parameters are gathered for B and freed "
                "before W; use zero_stage <= 1 with zero-bubble schedules");
  ensure_shape(a.batch, a.seq_len);  // the scratch of this set's shape
  if (!chunk.last_stage() && !d_output.defined())
    throw_error("pipeline stage ", chunk.stage, " needs the gradient of its output from the next stage");
  if (!chunk.last_stage() && d_output.numel() != d_residual_.numel())
    throw_error("pipeline stage ", chunk.stage, ": output gradient ",
                shape_to_string(d_output.shape()), " for ", shape_to_string(d_residual_.shape()));
  const bool sequence_parallel = plan_->sequence_parallel() && plan_->tp() > 1;
  Tensor d_out = d_residual_;  // each block's backward turns it into its input's gradient
  if (chunk.last_stage()) {
    d_out.zero_();
    ParameterList final_norm_params;
    if (sequence_parallel) final_norm->collect(final_norm_params);
    ParameterList head;
    if (!config_.tied_embeddings) head.push_back(&lm_head);
    final_norm->collect(head);
    backward_part(final_norm_params, head, weights, [&] {
      final_norm->backward(d_out, a.d_hidden, a.residual(chunk.layers()), a.final_norm_stash);
    });
  } else {
    d_out.copy_from(d_output);
  }
  const int64_t first_block = chunk_first_block_[static_cast<size_t>(chunk_index)];
  use_layout_of(a);  // recomputation and the attention backward see this micro-batch's documents
  for (int64_t i = chunk.layers() - 1; i >= 0; --i) {
    const int64_t unit = chunk.first_layer + i + 1;
    fire(unit_hooks_.before_backward, unit);
    TransformerBlock& block = *blocks[static_cast<size_t>(first_block + i)];
    backward_part(block.partial_grads(), block_parameters_[static_cast<size_t>(first_block + i)],
                  weights, [&] {
                    block.backward(d_out, a.residual(i), stash_of(a, i), scratch_, recompute_,
                                   a.batch, a.seq_len);
                  });
    fire(unit_hooks_.after_backward, unit);
  }
  if (!chunk.first_stage()) {
    a.grad_ready = false;
    // A copy of the tied token embedding (held with the head, without the embeddings) has its
    // gradient from the head alone.
    if (chunk.last_stage() && config_.tied_embeddings && !holds_embedding_)
      backward_part({}, {&token_embedding}, weights, [] {});
    return d_out;
  }
  // Under sequence parallelism the position table meets this rank's rows only.
  ParameterList position_params;
  if (sequence_parallel && has_position_embedding()) position_params.push_back(&position_embedding);
  ParameterList embeddings{&token_embedding};
  if (has_position_embedding()) embeddings.push_back(&position_embedding);
  backward_part(position_params, embeddings, weights,
                [&] { plan_->embed_backward(d_out, embedding_args(a)); });
  fire(unit_hooks_.after_backward, 0);
  a.grad_ready = false;
  return Tensor();
}

void Transformer::backward() {
  if (!is_whole()) throw_error("backward() runs the whole model; a pipeline stage runs backward_chunk()");
  if (!whole_.grad_ready) throw_error("backward() needs a forward() with compute_grad first");
  backward_chunk(0, whole_, Tensor());
}

}  // namespace loom
