#include "loom/model/stash.hpp"

namespace loom {

namespace {
// Activations of the format's dtype, and F32 statistics, on its device.
struct Allocate {
  const ActivationFormat& format;
  MemCategory category = MemCategory::Activations;
  Tensor operator()(const Shape& shape) const {
    return Tensor::empty(shape, format.dtype, category, format.device);
  }
  Tensor f32(const Shape& shape) const {
    return Tensor::empty(shape, DType::F32, category, format.device);
  }
};

// Columns of the MLP's first projection on this rank: F (GELU input) or 2F (gate | up).
int64_t mlp_pre_width(const ModelConfig& c, const LocalDims& dims) {
  return c.arch == Architecture::Llama ? 2 * dims.ffn_hidden : dims.ffn_hidden;
}
}  // namespace

BlockStash make_block_stash(const ModelConfig& c, const ParallelPlan& plan,
                            const ActivationFormat& format, int64_t batch, int64_t seq_len,
                            const BlockStash* shared, bool dense) {
  const Allocate activation{format};
  const int64_t rows = batch * seq_len, local_rows = plan.local_rows(rows);
  const LocalDims dims = plan.local_dims(c);
  const bool layer_norm = c.arch == Architecture::GPT2;
  BlockStash s;
  s.norm1_out = activation({local_rows, c.n_embd});
  s.norm1.rstd = activation.f32({local_rows});
  if (layer_norm) s.norm1.mean = activation.f32({local_rows});
  s.qkv = activation({rows, dims.qkv_width()});
  s.residual_mid = activation({local_rows, c.n_embd});
  s.norm2_out = activation({local_rows, c.n_embd});
  s.norm2.rstd = activation.f32({local_rows});
  if (layer_norm) s.norm2.mean = activation.f32({local_rows});
  // A mixture-of-experts block keeps its MLP's activations in s.moe, sized by its routing.
  if (dense) s.mlp_pre = activation({rows, mlp_pre_width(c, dims)});
  if (shared) {
    s.attn_out = shared->attn_out;
    s.attn_lse = shared->attn_lse;
    s.mlp_act = shared->mlp_act;
    if (dense && !s.mlp_act.defined()) s.mlp_act = activation({rows, dims.ffn_hidden});
  } else {
    s.attn_out = activation({rows, dims.heads * dims.head_dim});
    s.attn_lse = activation.f32({batch, dims.heads, seq_len});
    if (dense) s.mlp_act = activation({rows, dims.ffn_hidden});
  }
  return s;
}

BlockGradScratch make_block_grad_scratch(const ModelConfig& c, const ParallelPlan& plan,
                                         const ActivationFormat& format, int64_t rows) {
  const Allocate scratch{format, MemCategory::Workspace};
  const int64_t local_rows = plan.local_rows(rows);
  const LocalDims dims = plan.local_dims(c);
  BlockGradScratch g;
  g.d_norm_out = scratch({local_rows, c.n_embd});
  g.d_qkv = scratch({rows, dims.qkv_width()});
  g.d_attn_out = scratch({rows, dims.heads * dims.head_dim});
  if (c.moe_layer_count() < c.n_layer) {  // some block has a dense MLP
    g.d_mlp_pre = scratch({rows, mlp_pre_width(c, dims)});
    g.d_mlp_act = scratch({rows, dims.ffn_hidden});
  }
  return g;
}

Tensor ChunkActivations::residual(int64_t index) const {
  const int64_t rows = residuals.size(1), c = residuals.size(2);
  return residuals.slice_as(index * rows * c, {rows, c});
}

void add_last_stage_activations(const ModelConfig& c, const ParallelPlan& plan,
                                const ActivationFormat& format, int64_t batch, int64_t seq_len,
                                ChunkActivations& a) {
  const Allocate activation{format};
  const int64_t local_rows = plan.local_rows(batch * seq_len);
  a.final_norm_out = activation({local_rows, c.n_embd});
  a.final_norm_stash.rstd = activation.f32({local_rows});
  if (c.arch == Architecture::GPT2) a.final_norm_stash.mean = activation.f32({local_rows});
  a.d_hidden = Allocate{format, MemCategory::Workspace}({local_rows, c.n_embd});
}

ChunkActivations make_chunk_activations(const ModelConfig& c, const ParallelPlan& plan,
                                        const ActivationFormat& format, const ModelChunk& chunk,
                                        Recompute recompute, int64_t batch, int64_t seq_len,
                                        BlockStash& selective_shared) {
  const int64_t local_rows = plan.local_rows(batch * seq_len);
  ChunkActivations a;
  a.format = format;
  a.batch = batch;
  a.seq_len = seq_len;
  a.residuals = Allocate{format}({chunk.layers() + 1, local_rows, c.n_embd});
  if (chunk.last_stage()) add_last_stage_activations(c, plan, format, batch, seq_len, a);
  if (recompute == Recompute::Full) return a;
  for (int64_t l = 0; l < chunk.layers(); ++l) {
    const bool share = recompute == Recompute::Selective && selective_shared.attn_out.defined();
    a.stashes.push_back(make_block_stash(c, plan, format, batch, seq_len,
                                         share ? &selective_shared : nullptr, !c.is_moe_layer(chunk.first_layer + l)));
    if (recompute == Recompute::Selective && !share) selective_shared = a.stashes.back();
    if (recompute == Recompute::Selective && !selective_shared.mlp_act.defined())
      selective_shared.mlp_act = a.stashes.back().mlp_act;  // the first dense block's, for the rest
  }
  return a;
}

}  // namespace loom
