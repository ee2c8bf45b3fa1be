#pragma once
// What one transformer block's forward keeps for its backward (the activation stash).
// Tensors are handles, so blocks can share storage: with selective recomputation all blocks
// share the cheap-to-recompute buffers (attention output, log-sum-exp, MLP activation), and
// with full recomputation they share the whole stash and keep only their input.
#include "loom/core/tensor.hpp"
#include "loom/model/config.hpp"
#include "loom/model/norm.hpp"

namespace loom {

struct BlockStash {
  Tensor norm1_out;   // [rows, C]
  NormStash norm1;
  Tensor qkv;         // [rows, (H + 2 KV) D], q and k after RoPE
  Tensor attn_out;    // [rows, H D]        (recomputed under selective)
  Tensor attn_lse;    // [B, H, T]          (recomputed under selective)
  Tensor residual_mid;  // [rows, C] x + attention(x)
  Tensor norm2_out;   // [rows, C]
  NormStash norm2;
  Tensor mlp_pre;     // [rows, F] (GELU input) or [rows, 2F] (gate | up)
  Tensor mlp_act;     // [rows, F]          (recomputed under selective)
};

// Allocates a stash for `rows` = batch * seq tokens. `shared` (may be null) supplies the
// tensors that recomputation lets blocks share.
BlockStash make_block_stash(const ModelConfig& config, int64_t batch, int64_t seq_len,
                            const BlockStash* shared_recomputable);

// Gradient scratch space used by every block's backward in turn (one copy per model).
struct BlockGradScratch {
  Tensor d_residual_mid, d_norm_out, d_qkv, d_attn_out, d_mlp_pre, d_mlp_act;
};
BlockGradScratch make_block_grad_scratch(const ModelConfig& config, int64_t rows);

int64_t mlp_pre_width(const ModelConfig& config);

}  // namespace loom
