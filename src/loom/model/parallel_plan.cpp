#include "loom/model/parallel_plan.hpp"

#include <numeric>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/tensor_shard.hpp"

namespace loom {

namespace {

int64_t total(const std::vector<int64_t>& widths) {
  return std::accumulate(widths.begin(), widths.end(), int64_t{0});
}

// One Linear per part, writing side by side.
class LocalFanOut final : public FanOutProjection {
 public:
  explicit LocalFanOut(const FanOutSpec& spec) {
    for (const ProjectionPart& part : spec.parts) {
      linears_.emplace_back(part.name, spec.in_features, total(part.segments), spec.bias,
                            spec.hf_transposed);
      width_ += linears_.back().out_features();
    }
  }
  void forward(const Tensor& out, const Tensor& input) override {
    int64_t column = 0;
    for (const Linear& linear : linears_) {
      linear.forward(out, column, input);
      column += linear.out_features();
    }
  }
  void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) override {
    int64_t column = 0;
    for (size_t i = 0; i < linears_.size(); ++i) {
      linears_[i].backward(d_input, i > 0, d_out, column, input);
      column += linears_[i].out_features();
    }
  }
  int64_t width() const override { return width_; }
  bool forward_gelu(const Tensor& act, const Tensor& pre, const Tensor& input) override {
    return linears_.size() == 1 && linears_[0].forward_gelu(act, pre, input);
  }
  void collect(ParameterList& out) override {
    for (Linear& linear : linears_) linear.collect(out);
  }
  std::vector<Linear*> linears() override {
    std::vector<Linear*> out;
    for (Linear& linear : linears_) out.push_back(&linear);
    return out;
  }

 private:
  std::vector<Linear> linears_;
  int64_t width_ = 0;
};

class LocalFanIn final : public FanInProjection {
 public:
  explicit LocalFanIn(const FanInSpec& spec)
      : linear_(spec.name, spec.in_features, spec.out_features, spec.bias, spec.hf_transposed) {}
  void forward(const Tensor& out, const Tensor& input) override { linear_.forward(out, 0, input); }
  void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) override {
    linear_.backward(d_input, false, d_out, 0, input);
  }
  bool backward_through_gelu(const Tensor& d_pre, const Tensor& d_out, const Tensor& input,
                             const Tensor& pre) override {
    return linear_.backward_through_gelu(d_pre, d_out, input, pre);
  }
  void collect(ParameterList& out) override { linear_.collect(out); }
  std::vector<Linear*> linears() override { return {&linear_}; }

 private:
  Linear linear_;
};

int64_t split(const char* what, int64_t full, int tp) {
  if (full % tp != 0)
    throw_error("tensor parallelism: ", what, " = ", full, " does not divide by tp = ", tp,
                "; use a tp that divides it");
  return full / tp;
}

}  // namespace

int64_t ParallelPlan::local_rows(int64_t rows) const {
  if (!sequence_parallel()) return rows;
  if (rows % tp() != 0)
    throw_error("sequence parallelism: batch x sequence = ", rows, " rows do not divide by tp = ",
                tp(), "; choose a batch size or sequence length whose product divides");
  return rows / tp();
}

LocalDims ParallelPlan::local_dims(const ModelConfig& c) const {
  LocalDims dims;
  dims.heads = split("model.n_head", c.n_head, tp());
  dims.kv_heads = split("model.n_kv_head", c.n_kv_head, tp());
  dims.head_dim = c.head_dim();
  dims.ffn_hidden = split("model.ffn_hidden", c.ffn_hidden, tp());
  return dims;
}

std::unique_ptr<FanOutProjection> ParallelPlan::fan_out(const FanOutSpec& spec) const {
  return std::make_unique<LocalFanOut>(spec);
}

std::unique_ptr<FanInProjection> ParallelPlan::fan_in(const FanInSpec& spec) const {
  return std::make_unique<LocalFanIn>(spec);
}

Placement ParallelPlan::vocab_placement(int64_t vocab, int64_t dim) const {
  return shard_placement({vocab, dim}, 0, tp_rank(), tp());
}

void ParallelPlan::embed(const Tensor& out, const EmbeddingArgs& a) const {
  ops::embedding_forward(out, a.tokens, a.token_table->value,
                         a.position_table ? &a.position_table->value : nullptr, a.batch,
                         a.seq_len, a.positions);
}

void ParallelPlan::embed_backward(const Tensor& d_out, const EmbeddingArgs& a) const {
  ops::embedding_backward(a.token_table->grad,
                          a.position_table ? &a.position_table->grad : nullptr, d_out, a.tokens,
                          a.batch, a.seq_len, a.positions);
}

double ParallelPlan::head_loss(const ops::CrossEntropyArgs& args, int64_t rows,
                               int64_t vocab) const {
  LOOM_CHECK(args.hidden.size(0) == rows && args.weight.size(0) == vocab,
             "the one-process head loss takes all ", rows, " rows and all ", vocab,
             " vocabulary entries; got hidden ", shape_to_string(args.hidden.shape()), " and head ",
             shape_to_string(args.weight.shape()));
  return ops::lm_head_cross_entropy(args);
}

std::vector<float> ParallelPlan::last_position_logits(const Tensor& hidden, const Tensor& head,
                                                      int64_t batch, int64_t seq_len,
                                                      int64_t vocab) const {
  // One row at a time: the product of each sequence's last row alone, as it always was.
  Tensor logits = Tensor::empty({batch, vocab}, hidden.dtype(), MemCategory::Workspace, hidden.device());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t last = b * seq_len + seq_len - 1;
    ops::linear_forward(logits.narrow_rows(b, b + 1), 0, hidden.narrow_rows(last, last + 1), head, nullptr);
  }
  return logits.to_f32_vector();
}

std::shared_ptr<const ParallelPlan> single_process_plan() {
  static const auto plan = std::make_shared<const ParallelPlan>();
  return plan;
}

}  // namespace loom
