#pragma once
// The parallel plan that makes a Transformer tensor-parallel (and, optionally,
// sequence-parallel) over a tp process group: attention's q|k|v and the MLP's first
// projections become column-parallel (this rank's heads and hidden columns), their output
// projections row-parallel, the token table and output head vocabulary-parallel (uneven
// blocks of ceil(V/tp) rows), and the loss the vocabulary-parallel cross-entropy that never
// gathers the logits. Under sequence parallelism the residual stream, the norms and the
// embeddings' output hold rows / tp rows per rank.
//
//   auto plan = std::make_shared<TensorParallelPlan>(mesh.group({"tp"}), sequence_parallel);
//   Transformer model(config, recompute, vocab_chunk, plan);
//
// Every tp rank must be given the same tokens and targets.
#include <memory>

#include "loom/dist/process_group.hpp"
#include "loom/model/parallel_plan.hpp"

namespace loom {

class TensorParallelPlan final : public ParallelPlan {
 public:
  TensorParallelPlan(std::shared_ptr<ProcessGroup> tp_group, bool sequence_parallel);

  int tp() const override { return group_->size(); }
  int tp_rank() const override { return group_->rank(); }
  bool sequence_parallel() const override { return sequence_parallel_; }

  std::unique_ptr<FanOutProjection> fan_out(const FanOutSpec& spec) const override;
  std::unique_ptr<FanInProjection> fan_in(const FanInSpec& spec) const override;

  void embed(const Tensor& out, const EmbeddingArgs& args) const override;
  void embed_backward(const Tensor& d_out, const EmbeddingArgs& args) const override;
  double head_loss(const ops::CrossEntropyArgs& args, int64_t rows, int64_t vocab) const override;
  std::vector<float> last_position_logits(const Tensor& hidden, const Tensor& head, int64_t batch,
                                          int64_t seq_len, int64_t vocab) const override;
  void sum_partial_grads(const ParameterList& params) const override;

  ProcessGroup& group() const { return *group_; }

 private:
  // Row offset of this rank's first residual row in the whole [batch * seq_len] rows.
  int64_t first_local_row(int64_t rows) const;

  std::shared_ptr<ProcessGroup> group_;
  bool sequence_parallel_;
  mutable Tensor lookup_scratch_;  // the vocabulary lookup's whole rows under SP
};

}  // namespace loom
