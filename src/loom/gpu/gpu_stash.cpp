#include "loom/gpu/gpu_stash.hpp"

namespace loom::gpu {

namespace {
DeviceBuffer of_dtype(int64_t count, DType dtype, MemCategory category) {
  return DeviceBuffer(static_cast<size_t>(count) * dtype_size_bytes(dtype), category);
}
DeviceBuffer f32(int64_t count, MemCategory category) {
  return DeviceBuffer::of<float>(count, category);
}
}  // namespace

int64_t mlp_pre_width(const ModelConfig& c) {
  return c.arch == Architecture::Llama ? 2 * c.ffn_hidden : c.ffn_hidden;
}

GpuActivations make_gpu_activations(const ModelConfig& c, int64_t batch, int64_t seq_len,
                                    DType dtype) {
  constexpr MemCategory kAct = MemCategory::Activations;
  const int64_t rows = batch * seq_len;
  const bool layer_norm = c.arch == Architecture::GPT2;
  GpuActivations a;
  a.tokens = DeviceBuffer::of<int32_t>(rows, kAct);
  a.residuals = of_dtype((c.n_layer + 1) * rows * c.n_embd, dtype, kAct);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    GpuBlockStash& s = a.blocks.emplace_back();
    s.norm1_out = of_dtype(rows * c.n_embd, dtype, kAct);
    if (layer_norm) s.norm1_mean = f32(rows, kAct);
    s.norm1_rstd = f32(rows, kAct);
    s.qkv = of_dtype(rows * (c.n_head + 2 * c.n_kv_head) * c.head_dim(), dtype, kAct);
    s.attn_out = of_dtype(rows * c.n_head * c.head_dim(), dtype, kAct);
    s.attn_lse = f32(batch * c.n_head * seq_len, kAct);
    s.residual_mid = of_dtype(rows * c.n_embd, dtype, kAct);
    s.norm2_out = of_dtype(rows * c.n_embd, dtype, kAct);
    if (layer_norm) s.norm2_mean = f32(rows, kAct);
    s.norm2_rstd = f32(rows, kAct);
    s.mlp_pre = of_dtype(rows * mlp_pre_width(c), dtype, kAct);
    s.mlp_act = of_dtype(rows * c.ffn_hidden, dtype, kAct);
  }
  a.final_norm_out = of_dtype(rows * c.n_embd, dtype, kAct);
  if (layer_norm) a.final_norm_mean = f32(rows, kAct);
  a.final_norm_rstd = f32(rows, kAct);
  return a;
}

GpuGradScratch make_gpu_grad_scratch(const ModelConfig& c, int64_t batch, int64_t seq_len,
                                     DType dtype) {
  constexpr MemCategory kWork = MemCategory::Workspace;
  const int64_t rows = batch * seq_len;
  GpuGradScratch g;
  g.d_residual_a = of_dtype(rows * c.n_embd, dtype, kWork);
  g.d_residual_b = of_dtype(rows * c.n_embd, dtype, kWork);
  g.d_residual_mid = of_dtype(rows * c.n_embd, dtype, kWork);
  g.d_norm_out = of_dtype(rows * c.n_embd, dtype, kWork);
  g.d_qkv = of_dtype(rows * (c.n_head + 2 * c.n_kv_head) * c.head_dim(), dtype, kWork);
  g.d_attn_out = of_dtype(rows * c.n_head * c.head_dim(), dtype, kWork);
  g.d_mlp_pre = of_dtype(rows * mlp_pre_width(c), dtype, kWork);
  g.d_mlp_act = of_dtype(rows * c.ffn_hidden, dtype, kWork);
  g.d_hidden = of_dtype(rows * c.n_embd, dtype, kWork);
  return g;
}

}  // namespace loom::gpu
