#include "loom/parallel/pipeline_activations.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom {

void PipelineActivations::match(int64_t batch, int64_t seq_len) {
  const ActivationFormat format{model_.device(), model_.compute_dtype()};
  if (batch == batch_ && seq_len == seq_len_ && format == format_) return;
  if (!in_flight_.empty()) {
    if (format != format_)
      throw_error("the model moved to ", device_name(format.device), " ", dtype_name(format.dtype),
                  " while ", in_flight_.size(), " micro-batch(es) on ", device_name(format_.device),
                  " await their backward");
    throw_error("batch ", batch, " x sequence ", seq_len, " while ", in_flight_.size(),
                " micro-batch(es) of ", batch_, " x ", seq_len_,
                " await their backward: finish them first");
  }
  idle_.clear();
  last_released_ = {-1, -1};
  batch_ = batch;
  seq_len_ = seq_len;
  format_ = format;
}

double PipelineActivations::forward(int64_t chunk_index, int64_t micro, const int32_t* tokens,
                                    const int32_t* targets, const Tensor& input, int64_t batch,
                                    int64_t seq_len, const ForwardOptions& options) {
  const ModelChunk& chunk = model_.chunk(chunk_index);
  match(batch, seq_len);
  const Key key{chunk_index, micro};
  if (in_flight_.count(key))
    throw_error("micro-batch ", micro, " of chunk ", chunk_index,
                " ran forward twice without a backward");
  last_released_ = {-1, -1};
  // Any idle set of as many layers will do (the model adds the last stage's extras); with
  // none, an empty one, which the model makes once it has checked the inputs.
  ChunkActivations set;
  auto fits = [&](const ChunkActivations& a) { return a.layers() == chunk.layers(); };
  if (auto it = std::find_if(idle_.rbegin(), idle_.rend(), fits); it != idle_.rend()) {
    set = std::move(*it);
    idle_.erase(std::next(it).base());
  }
  double loss = 0.0;
  try {
    loss = model_.forward_chunk(chunk_index, set, tokens, targets, input, batch, seq_len, options);
  } catch (...) {
    if (set.allocated()) idle_.push_back(std::move(set));
    throw;
  }
  if (options.compute_grad) {
    in_flight_.emplace(key, std::move(set));
  } else {
    idle_.push_back(std::move(set));
    last_released_ = key;
  }
  return loss;
}

Tensor PipelineActivations::output(int64_t chunk, int64_t micro) const {
  const Key key{chunk, micro};
  if (auto it = in_flight_.find(key); it != in_flight_.end()) return it->second.output();
  if (last_released_ == key && !idle_.empty()) return idle_.back().output();
  throw_error("chunk ", chunk, " has no output for micro-batch ", micro, ": run its forward first");
}

Tensor PipelineActivations::backward(int64_t chunk, int64_t micro, const Tensor& d_output,
                                     bool defer_weights) {
  auto it = in_flight_.find({chunk, micro});
  if (it == in_flight_.end())
    throw_error("backward of micro-batch ", micro, " (chunk ", chunk,
                ") needs its forward with compute_grad first");
  const Key key{chunk, micro};
  if (defer_weights && deferred_.count(key))
    throw_error("micro-batch ", micro, " of chunk ", chunk, " ran its B twice without its W");
  ops::DeferredWeightGrads weights;
  const Tensor d_input =
      model_.backward_chunk(chunk, it->second, d_output, defer_weights ? &weights : nullptr);
  idle_.push_back(std::move(it->second));
  in_flight_.erase(it);
  if (defer_weights) {
    deferred_bytes_ += weights.kept_bytes();
    peak_deferred_bytes_ = std::max(peak_deferred_bytes_, deferred_bytes_);
    deferred_.emplace(key, std::move(weights));
  }
  return d_input;
}

void PipelineActivations::backward_weights(int64_t chunk, int64_t micro) {
  auto it = deferred_.find({chunk, micro});
  if (it == deferred_.end())
    throw_error("the W of micro-batch ", micro, " (chunk ", chunk, ") needs its B first");
  deferred_bytes_ -= it->second.kept_bytes();
  it->second.run();
  deferred_.erase(it);
}

}  // namespace loom
