#pragma once
// What one transformer block's forward keeps for its backward (the activation stash).
// Tensors are handles, so blocks can share storage: with selective recomputation all blocks
// share the cheap-to-recompute buffers (attention output, log-sum-exp, MLP activation), and
// with full recomputation they share the whole stash and keep only their input.
#include "loom/core/tensor.hpp"
#include "loom/model/config.hpp"
#include "loom/model/norm.hpp"
#include "loom/model/parallel_plan.hpp"

namespace loom {

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
  Tensor mlp_pre;     // [rows, F] (GELU input) or [rows, 2F] (gate | up)
  Tensor mlp_act;     // [rows, F]          (recomputed under selective)
};

// Allocates a stash for batch x seq_len tokens laid out by `plan`. `shared` (may be null)
// supplies the tensors that recomputation lets blocks share.
BlockStash make_block_stash(const ModelConfig& config, const ParallelPlan& plan, int64_t batch,
                            int64_t seq_len, const BlockStash* shared_recomputable);

// Gradient scratch space used by every block's backward in turn (one copy per model).
struct BlockGradScratch {
  Tensor d_residual_mid, d_norm_out, d_qkv, d_attn_out, d_mlp_pre, d_mlp_act;
};
BlockGradScratch make_block_grad_scratch(const ModelConfig& config, const ParallelPlan& plan,
                                         int64_t rows);

}  // namespace loom
