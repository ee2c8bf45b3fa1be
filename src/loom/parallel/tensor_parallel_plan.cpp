#include "loom/parallel/tensor_parallel_plan.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_linear.hpp"
#include "loom/parallel/vocab_parallel.hpp"

namespace loom {

namespace {

// The tensor-parallel layers exchange host buffers so far: a tensor handed to them must be a
// host f32 one (Transformer::to_device refuses tp on a device before this is reached).
float* host_f32(const Tensor& t, const char* what) {
  if (t.device() != Device::CPU || t.dtype() != DType::F32)
    throw_error("tensor parallelism: ", what, " is a ", dtype_name(t.dtype()), " tensor on ",
                device_name(t.device()), "; its layers take host f32 tensors so far");
  return t.f32();
}

// Several column-parallel projections of one input (Llama's q, k, v under their own names, or
// one fused c_attn), run by column_parallel_forward / _backward: the input is gathered once
// under sequence parallelism, and the summed d_input is reduced once, overlapped with the
// weight gradients.
class ColumnParallelFanOut final : public FanOutProjection {
 public:
  ColumnParallelFanOut(const FanOutSpec& spec, const std::shared_ptr<ProcessGroup>& group,
                       bool sequence_parallel) {
    for (const ProjectionPart& part : spec.parts) {
      owned_.push_back(std::make_unique<ColumnParallelLinear>(
          part.name, spec.in_features, part.segments, spec.bias, group, sequence_parallel,
          spec.hf_transposed));
      layers_.push_back(owned_.back().get());
      width_ += layers_.back()->local_out_features();
    }
  }

  void forward(const Tensor& out, const Tensor& input) override {
    column_parallel_forward(layers_, host_f32(out, "the output"), out.size(1),
                            host_f32(input, "the input"), out.size(0), scratch_);
  }
  void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) override {
    column_parallel_backward(layers_, host_f32(d_input, "the input gradient"), false,
                             host_f32(d_out, "the output gradient"), d_out.size(1),
                             host_f32(input, "the input"), d_out.size(0), scratch_);
  }
  int64_t width() const override { return width_; }
  void collect(ParameterList& out) override {
    for (ColumnParallelLinear* layer : layers_) layer->collect(out);
  }

 private:
  std::vector<std::unique_ptr<ColumnParallelLinear>> owned_;
  std::vector<ColumnParallelLinear*> layers_;
  int64_t width_ = 0;
  ColumnParallelLinear::Scratch scratch_;
};

class RowParallelFanIn final : public FanInProjection {
 public:
  RowParallelFanIn(const FanInSpec& spec, const std::shared_ptr<ProcessGroup>& group,
                   bool sequence_parallel)
      : layer_(spec.name, spec.in_features, spec.out_features, spec.bias, group,
               sequence_parallel, spec.hf_transposed) {}
  void forward(const Tensor& out, const Tensor& input) override {
    layer_.forward(host_f32(out, "the output"), host_f32(input, "the input"), input.size(0));
  }
  void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) override {
    layer_.backward(host_f32(d_input, "the input gradient"), false,
                    host_f32(d_out, "the output gradient"), host_f32(input, "the input"),
                    input.size(0));
  }
  void collect(ParameterList& out) override { layer_.collect(out); }
  ParameterList partial_grads() override { return layer_.sequence_parallel_partial_grads(); }

 private:
  RowParallelLinear layer_;
};

VocabLookup vocab_lookup(const EmbeddingArgs& a, int rank, int ranks, bool sequence_parallel) {
  const ShardRange owned = shard_range(a.vocab, rank, ranks);
  return {a.tokens, a.batch * a.seq_len, a.dim, owned.begin, owned.begin + owned.length,
          sequence_parallel};
}

}  // namespace

TensorParallelPlan::TensorParallelPlan(std::shared_ptr<ProcessGroup> tp_group,
                                       bool sequence_parallel)
    : group_(std::move(tp_group)), sequence_parallel_(sequence_parallel) {
  if (!group_) throw_error("TensorParallelPlan: no tp process group given");
}

std::unique_ptr<FanOutProjection> TensorParallelPlan::fan_out(const FanOutSpec& spec) const {
  return std::make_unique<ColumnParallelFanOut>(spec, group_, sequence_parallel_);
}

std::unique_ptr<FanInProjection> TensorParallelPlan::fan_in(const FanInSpec& spec) const {
  return std::make_unique<RowParallelFanIn>(spec, group_, sequence_parallel_);
}

int64_t TensorParallelPlan::first_local_row(int64_t rows) const {
  return sequence_parallel_ ? tp_rank() * local_rows(rows) : 0;
}

void TensorParallelPlan::embed(const Tensor& out_tensor, const EmbeddingArgs& a) const {
  const int64_t rows = a.batch * a.seq_len, local = local_rows(rows), dim = a.dim;
  float* out = host_f32(out_tensor, "the embedding output");
  vocab_parallel_lookup(out, host_f32(a.token_table->value, "the token table"),
                        vocab_lookup(a, tp_rank(), tp(), sequence_parallel_), *group_,
                        lookup_scratch_);
  if (!a.position_table) return;
  // Position rows after the sum: every rank adds them to the rows it holds, once.
  const float* positions = host_f32(a.position_table->value, "the position table");
  const int64_t first = first_local_row(rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < local; ++r) {
    const float* p = positions + ((first + r) % a.seq_len) * dim;
    float* o = out + r * dim;
    for (int64_t c = 0; c < dim; ++c) o[c] += p[c];
  }
}

void TensorParallelPlan::embed_backward(const Tensor& d_out_tensor, const EmbeddingArgs& a) const {
  const int64_t rows = a.batch * a.seq_len, local = local_rows(rows), dim = a.dim;
  const float* d_out = host_f32(d_out_tensor, "the embedding output gradient");
  if (a.position_table) {  // this rank's rows only under sequence parallelism: a partial sum
    float* grad = host_f32(a.position_table->grad, "the position table gradient");
    const int64_t first = first_local_row(rows);
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
      const int64_t c0 = dim * thread / threads, c1 = dim * (thread + 1) / threads;
      for (int64_t r = 0; r < local; ++r) {
        const float* src = d_out + r * dim;
        float* dst = grad + ((first + r) % a.seq_len) * dim;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }
  vocab_parallel_lookup_backward(host_f32(a.token_table->grad, "the token table gradient"), d_out,
                                 vocab_lookup(a, tp_rank(), tp(), sequence_parallel_), *group_,
                                 lookup_scratch_);
}

double TensorParallelPlan::head_loss(const ops::CrossEntropyArgs& a, int64_t rows,
                                     int64_t vocab) const {
  VocabParallelCrossEntropyArgs args;
  args.hidden = host_f32(a.hidden, "the head input");
  args.weight = host_f32(a.weight, "the head");
  args.targets = a.targets;
  args.rows = rows;
  args.dim = a.hidden.size(1);
  args.vocab = vocab;
  args.vocab_chunk = a.vocab_chunk;
  args.grad_scale = a.grad_scale;
  if (a.d_hidden.defined()) args.d_hidden = host_f32(a.d_hidden, "the head input gradient");
  if (a.d_weight.defined()) args.d_weight = host_f32(a.d_weight, "the head gradient");
  args.sequence_parallel = sequence_parallel_;
  return vocab_parallel_cross_entropy(args, *group_);
}

std::vector<float> TensorParallelPlan::last_position_logits(const Tensor& hidden_tensor,
                                                            const Tensor& head_tensor,
                                                            int64_t batch, int64_t seq_len,
                                                            int64_t vocab) const {
  const int64_t rows = batch * seq_len, dim = hidden_tensor.size(1);
  const float* hidden = host_f32(hidden_tensor, "the head input");
  const float* head = host_f32(head_tensor, "the head");
  std::vector<float> result(static_cast<size_t>(batch * vocab));
  float* logits = result.data();
  std::vector<float> whole;
  if (sequence_parallel_ && tp() > 1) {
    whole.resize(static_cast<size_t>(rows * dim));
    gather_sequence_rows(*group_, hidden, whole.data(), local_rows(rows), dim)->wait();
    hidden = whole.data();
  }
  // Each rank's logits over its vocabulary block, padded to the largest block so one
  // all-gather collects them; then unpadded in rank order.
  const int64_t block = shard_range(vocab, 0, tp()).length;
  const ShardRange owned = shard_range(vocab, tp_rank(), tp());
  std::vector<float> mine(static_cast<size_t>(batch * block), 0.0f);
  std::vector<float> all(mine.size() * static_cast<size_t>(tp()));
  for (int64_t b = 0; b < batch; ++b)
    if (owned.length > 0)
      cpu::sgemm(false, true, 1, owned.length, dim, 1.0f,
                 hidden + (b * seq_len + seq_len - 1) * dim, dim, head, dim, 0.0f,
                 mine.data() + b * block, block);
  group_->all_gather(mine.data(), all.data(), batch * block)->wait();
  for (int r = 0; r < tp(); ++r) {
    const ShardRange range = shard_range(vocab, r, tp());
    for (int64_t b = 0; b < batch; ++b)
      std::copy_n(all.data() + (r * batch + b) * block, range.length,
                  logits + b * vocab + range.begin);
  }
  return result;
}

void TensorParallelPlan::sum_partial_grads(const ParameterList& params) const {
  all_reduce_sequence_parallel_grads(params, *group_);
}

}  // namespace loom
