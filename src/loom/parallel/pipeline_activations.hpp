#pragma once
// The activation sets of the micro-batches a pipeline rank has in flight. A schedule runs
// several micro-batches through a chunk before their backwards (m under AFAB, pp - r under
// 1F1B), each keeping its own set (model/stash's ChunkActivations) from its forward to its
// backward; the model runs one chunk on one set and does not know how many there are.
//
// Sets are kept by (chunk, micro-batch) while they await their backward, then go idle and
// serve any later forward of a chunk of as many layers, so a rank holds as many sets as it
// ever had micro-batch-chunks in flight at once: what the planner's replay of the same
// schedule predicts (plan/pipeline_sim's peak_in_flight).
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "loom/model/transformer.hpp"

namespace loom {

class PipelineActivations {
 public:
  explicit PipelineActivations(Transformer& model) : model_(model) {}

  // Transformer::forward_chunk of micro-batch `micro` on chunk `chunk`, on a set of this pool.
  // With compute_grad the set awaits backward(chunk, micro); without, it is idle again at once.
  // Every set holds one shape and format: a forward of another batch x seq_len, or after the
  // model moved (Transformer::to_device), drops the idle sets and is refused while any
  // micro-batch awaits its backward.
  double forward(int64_t chunk, int64_t micro, const int32_t* tokens, const int32_t* targets,
                 const Tensor& input, int64_t batch, int64_t seq_len,
                 const ForwardOptions& options);
  // The chunk's output of micro-batch `micro` [local_rows, C], a view: valid until its
  // backward, or after a forward without gradients until this pool's next forward.
  Tensor output(int64_t chunk, int64_t micro) const;
  // Transformer::backward_chunk of micro-batch `micro` on chunk `chunk`; its set goes idle.
  // With defer_weights it is the B of a split backward: the parameter gradients wait, with
  // copies of what they read, for backward_weights(chunk, micro), the W.
  Tensor backward(int64_t chunk, int64_t micro, const Tensor& d_output, bool defer_weights = false);
  void backward_weights(int64_t chunk, int64_t micro);
  // Bytes the W's still to run hold, now and at most since construction.
  int64_t deferred_bytes() const { return deferred_bytes_; }
  int64_t peak_deferred_bytes() const { return peak_deferred_bytes_; }
  int64_t awaiting_weights() const { return static_cast<int64_t>(deferred_.size()); }

  int64_t awaiting_backward() const { return static_cast<int64_t>(in_flight_.size()); }
  // Sets held now, awaiting their backward or idle for reuse: the memory a schedule costs.
  int64_t sets_allocated() const { return static_cast<int64_t>(in_flight_.size() + idle_.size()); }

 private:
  using Key = std::pair<int64_t, int64_t>;  // (chunk, micro-batch)
  // Makes the pool's shape and format the model's for batch x seq_len, dropping idle sets.
  void match(int64_t batch, int64_t seq_len);

  Transformer& model_;
  int64_t batch_ = 0, seq_len_ = 0;
  ActivationFormat format_;
  std::map<Key, ChunkActivations> in_flight_;
  std::vector<ChunkActivations> idle_;
  Key last_released_{-1, -1};  // idle_.back(), after a forward without gradients
  std::map<Key, ops::DeferredWeightGrads> deferred_;  // B's whose W has not run
  int64_t deferred_bytes_ = 0, peak_deferred_bytes_ = 0;
};

}  // namespace loom
