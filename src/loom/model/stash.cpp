#include "loom/model/stash.hpp"

namespace loom {

int64_t mlp_pre_width(const ModelConfig& c) {
  return c.arch == Architecture::Llama ? 2 * c.ffn_hidden : c.ffn_hidden;
}

namespace {
Tensor activation(const Shape& shape) {
  return Tensor::empty(shape, DType::F32, MemCategory::Activations);
}
}  // namespace

BlockStash make_block_stash(const ModelConfig& c, int64_t batch, int64_t seq_len,
                            const BlockStash* shared) {
  const int64_t rows = batch * seq_len;
  const bool layer_norm = c.arch == Architecture::GPT2;
  BlockStash s;
  s.norm1_out = activation({rows, c.n_embd});
  s.norm1.rstd = activation({rows});
  if (layer_norm) s.norm1.mean = activation({rows});
  s.qkv = activation({rows, c.n_embd + 2 * c.kv_dim()});
  s.residual_mid = activation({rows, c.n_embd});
  s.norm2_out = activation({rows, c.n_embd});
  s.norm2.rstd = activation({rows});
  if (layer_norm) s.norm2.mean = activation({rows});
  s.mlp_pre = activation({rows, mlp_pre_width(c)});
  if (shared) {
    s.attn_out = shared->attn_out;
    s.attn_lse = shared->attn_lse;
    s.mlp_act = shared->mlp_act;
  } else {
    s.attn_out = activation({rows, c.n_embd});
    s.attn_lse = activation({batch, c.n_head, seq_len});
    s.mlp_act = activation({rows, c.ffn_hidden});
  }
  return s;
}

BlockGradScratch make_block_grad_scratch(const ModelConfig& c, int64_t rows) {
  auto scratch = [](const Shape& shape) {
    return Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  };
  BlockGradScratch g;
  g.d_residual_mid = scratch({rows, c.n_embd});
  g.d_norm_out = scratch({rows, c.n_embd});
  g.d_qkv = scratch({rows, c.n_embd + 2 * c.kv_dim()});
  g.d_attn_out = scratch({rows, c.n_embd});
  g.d_mlp_pre = scratch({rows, mlp_pre_width(c)});
  g.d_mlp_act = scratch({rows, c.ffn_hidden});
  return g;
}

}  // namespace loom
