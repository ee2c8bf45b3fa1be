#pragma once
// The whole language model on one CUDA GPU, the device twin of loom::Transformer for one
// process (llm.c's train_gpt2.cu beside train_gpt2.c): built from a host Transformer, which
// gives the parameters' names, shapes and initial values and later takes the trained weights
// back for checkpoints, evaluation and sampling on the CPU. Forward and backward make the same
// kernel calls, in the same order and with the same arguments, as the CPU modules make to the
// CPU kernels (Transformer, TransformerBlock, CausalSelfAttention, Mlp, Norm, the one-process
// ParallelPlan), so the two can be checked against each other op for op.
//
// Compute dtype f32: activations f32, the kernels read the fp32 masters. bf16: activations and
// their gradients bf16, the kernels read bf16 working copies of the masters; parameter
// gradients, norm statistics and the loss stay f32 (the kernels' bf16 variants). One code path,
// templated on the compute dtype.
#include <memory>
#include <vector>

#include "loom/gpu/gpu_layers.hpp"
#include "loom/gpu/gpu_parameters.hpp"
#include "loom/gpu/gpu_stash.hpp"
#include "loom/kernels/cpu/attention.hpp"
#include "loom/model/transformer.hpp"

namespace loom::cuda {
class RopeTableDevice;
}

namespace loom::gpu {

// What the CUDA kernels cannot take (head_dim above the attention kernel's limit): a loom::Error
// naming the model keys. Needs no device.
void check_gpu_model_supports(const ModelConfig& config);

struct GpuBlock {
  GpuNorm norm1;
  GpuFanOut attention_in;  // GPT-2: c_attn; Llama: q, k, v
  GpuLinear attention_out;
  GpuNorm norm2;
  GpuFanOut mlp_in;  // GPT-2: c_fc; Llama: gate, up
  GpuLinear mlp_out;
};

class GpuTransformer {
 public:
  // `host` must be a whole one-process model without recomputation (the only layout the GPU
  // path has so far); its current values are uploaded as the masters. `compute_dtype` is F32 or
  // BF16; `vocab_chunk` as loom::Transformer's (train.vocab_chunk).
  GpuTransformer(const Transformer& host, DType compute_dtype,
                 int64_t vocab_chunk = kDefaultVocabChunk);
  ~GpuTransformer();
  GpuTransformer(const GpuTransformer&) = delete;
  GpuTransformer& operator=(const GpuTransformer&) = delete;

  // Returns the sum of per-token losses over the batch. tokens and targets are device arrays of
  // [batch, seq_len] ids in [0, vocab) (targets may be negative: ignored); they are NOT
  // checked here (the kernels would index outside the tables): GpuTrainer checks them on the
  // host before upload. The tokens are copied, so they may change once this returns. With
  // compute_grad, also accumulates the output projection's gradient and keeps the gradient of
  // the final hidden states for backward().
  double forward(const int32_t* tokens_device, const int32_t* targets_device, int64_t batch,
                 int64_t seq_len, const ForwardOptions& options = {});
  // Accumulates every parameter's gradient (after forward with compute_grad).
  void backward();
  void zero_grad() { params_.zero_grads(); }

  // Masters from `host`'s values (and the working copies from them).
  void upload_from(const Transformer& host) { params_.upload_from(host.parameters()); }
  // `host`'s values from the weights this model computes with (see GpuParameterSet::download_to).
  void download_to(Transformer& host) const { params_.download_to(host.parameters()); }

  GpuParameterSet& parameters() { return params_; }
  const GpuParameterSet& parameters() const { return params_; }
  const ModelConfig& config() const { return config_; }
  DType compute_dtype() const { return params_.compute_dtype(); }

 private:
  void ensure_shape(int64_t batch, int64_t seq_len);
  cpu::AttentionShape attention_shape() const;
  template <typename T>
  double forward_as(const int32_t* targets, const ForwardOptions& options);
  template <typename T>
  void backward_as();
  template <typename T>
  void block_forward(const GpuBlock& block, GpuBlockStash& stash, T* x_out, const T* x_in);
  template <typename T>
  void block_backward(const GpuBlock& block, const GpuBlockStash& stash, T* d_x_in,
                      const T* d_x_out, const T* x_in);

  ModelConfig config_;
  int64_t vocab_chunk_;
  GpuParameterSet params_;
  const GpuParameter* token_embedding_ = nullptr;
  const GpuParameter* position_embedding_ = nullptr;  // GPT-2 only
  const GpuParameter* head_ = nullptr;                // the token embedding when tied, else lm_head
  std::vector<GpuBlock> blocks_;
  GpuNorm final_norm_;
  std::unique_ptr<cuda::RopeTableDevice> rope_;  // Llama only

  // Buffers for the current (batch, seq_len).
  int64_t batch_ = 0, seq_len_ = 0;
  GpuActivations activations_;
  GpuGradScratch scratch_;
  DeviceBuffer loss_workspace_;
  bool grad_ready_ = false;  // the last forward ran with compute_grad and backward has not yet
};

}  // namespace loom::gpu
