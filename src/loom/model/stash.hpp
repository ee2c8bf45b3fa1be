#pragma once
// What one transformer block's forward keeps for its backward (the activation stash).
// Tensors are handles, so blocks can share storage: with selective recomputation all blocks
// share the cheap-to-recompute buffers (attention output, log-sum-exp, MLP activation), and
// with full recomputation they share the whole stash and keep only their input.
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/model/config.hpp"
#include "loom/model/moe.hpp"
#include "loom/model/norm.hpp"
#include "loom/model/parallel_plan.hpp"
#include "loom/model/pipeline_layout.hpp"

namespace loom {

// Where a model's activations live: the device, and the dtype of the activations and their
// gradients (F32; BF16 on CUDA under bf16 mixed precision). Norm statistics and attention
// log-sum-exps are F32 always.
struct ActivationFormat {
  Device device = Device::CPU;
  DType dtype = DType::F32;
  bool operator==(const ActivationFormat&) const = default;
};

// Shapes are one rank's: `local_rows` is rows / tp under sequence parallelism (else rows), and
// H, KV, F are the heads and MLP columns this rank computes (ParallelPlan::local_dims).
struct BlockStash {
  Tensor norm1_out;   // [local_rows, C]
  NormStash norm1;
  Tensor qkv;         // [rows, (H + 2 KV) D], q and k after RoPE
  Tensor attn_out;    // [rows, H D]        (recomputed under selective)
  Tensor attn_lse;    // [B, H, T]          (recomputed under selective)
  Tensor residual_mid;  // [local_rows, C] x + attention(x)
  Tensor norm2_out;   // [local_rows, C]
  NormStash norm2;
  Tensor mlp_pre;     // [rows, F] (GELU input) or [rows, 2F] (gate | up); dense blocks
  Tensor mlp_act;     // [rows, F]          (recomputed under selective); dense blocks
  MoeStash moe;       // mixture-of-experts blocks: routing and the experts' activations
  // What multiplies the MoE layer's balancing and z-loss coefficients in backward: the
  // gradient scale of the summed token losses x this micro-batch's rows, so the losses weigh
  // as means over the micro-batch, like the cross-entropy.
  float moe_loss_scale = 0.0f;
};

// Allocates a stash for batch x seq_len tokens laid out by `plan`, for a block with a dense MLP
// (`dense_mlp`) or a mixture of experts. `shared` (may be null) supplies the tensors that
// recomputation lets blocks share (a dense block allocates its MLP activation when the shared
// set, made by an expert block, has none).
BlockStash make_block_stash(const ModelConfig& config, const ParallelPlan& plan,
                            const ActivationFormat& format, int64_t batch, int64_t seq_len,
                            const BlockStash* shared_recomputable, bool dense_mlp);

// Gradient scratch space used by every block's backward in turn (one copy per model).
struct BlockGradScratch {
  Tensor d_norm_out, d_qkv, d_attn_out, d_mlp_pre, d_mlp_act;
};
BlockGradScratch make_block_grad_scratch(const ModelConfig& config, const ParallelPlan& plan,
                                         const ActivationFormat& format, int64_t rows);

// What one model chunk (pipeline stage) keeps of one micro-batch from its forward to its
// backward. Whoever runs the chunk holds it (the whole model keeps one; a pipeline one per
// micro-batch in flight, which is the activation memory a schedule costs).
struct ChunkActivations {
  ActivationFormat format;         // where it was made
  int64_t batch = 0, seq_len = 0;  // the micro-batch shape it was made for
  std::vector<int32_t> tokens;  // first stage: the embedding backward reads them
  std::vector<int32_t> key_ranges;  // packed documents: (begin, end) per row, else empty
  std::vector<int32_t> positions;   // positions restarting per document, else empty
  std::vector<int32_t>
      window_key_ranges;        // sliding-window layers' (begin, end) per row, else empty
  Tensor residuals;             // [layers + 1, local_rows, C]: each block's input, then the output
  Tensor final_norm_out;        // last stage: [local_rows, C]
  NormStash final_norm_stash;   // last stage
  Tensor d_hidden;              // last stage: gradient of final_norm_out from the fused loss
  std::vector<BlockStash> stashes;  // one per block; none under full recomputation, whose
                                    // blocks share the model's single stash
  bool grad_ready = false;          // forward ran with compute_grad and its backward has not
  float moe_loss_scale = 0.0f;      // the forward's gradient scale x its rows (BlockStash's)

  bool allocated() const { return residuals.defined(); }
  int64_t layers() const { return allocated() ? residuals.size(0) - 1 : 0; }
  Tensor residual(int64_t index) const;  // [local_rows, C] view: block `index`'s input
  Tensor output() const { return residual(layers()); }  // the chunk's output, a view
};

// Adds what the last stage keeps besides the residual stream (final norm output and stash,
// the loss gradient), so a set made for another chunk of as many layers can serve it.
void add_last_stage_activations(const ModelConfig& config, const ParallelPlan& plan,
                                const ActivationFormat& format, int64_t batch, int64_t seq_len,
                                ChunkActivations& activations);

// Under Selective every block of every micro-batch shares one set of recomputable tensors,
// `selective_shared`'s: taken from the first stash made while it is empty.
ChunkActivations make_chunk_activations(const ModelConfig& config, const ParallelPlan& plan,
                                        const ActivationFormat& format, const ModelChunk& chunk,
                                        Recompute recompute, int64_t batch, int64_t seq_len,
                                        BlockStash& selective_shared);

}  // namespace loom
