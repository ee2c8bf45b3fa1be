#pragma once
// The GPU model's activation buffers, twins of model/stash.hpp for one process without
// recomputation: what each block's forward keeps for its backward, the residual stream, the
// final norm's output, and the gradient scratch every block's backward reuses in turn.
// Activations and their gradients are in the compute dtype (`dtype`), norm statistics and the
// attention log-sum-exp in f32, as the kernels take them.
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/gpu/device_buffer.hpp"
#include "loom/model/config.hpp"

namespace loom::gpu {

struct GpuBlockStash {
  DeviceBuffer norm1_out;     // [rows, C]
  DeviceBuffer norm1_mean;    // [rows] f32, LayerNorm only
  DeviceBuffer norm1_rstd;    // [rows] f32
  DeviceBuffer qkv;           // [rows, (H + 2 KV) D], q and k after RoPE
  DeviceBuffer attn_out;      // [rows, H D]
  DeviceBuffer attn_lse;      // [B, H, T] f32
  DeviceBuffer residual_mid;  // [rows, C] x + attention(x)
  DeviceBuffer norm2_out;     // [rows, C]
  DeviceBuffer norm2_mean, norm2_rstd;
  DeviceBuffer mlp_pre;  // [rows, F] (GELU input) or [rows, 2F] (gate | up)
  DeviceBuffer mlp_act;  // [rows, F]
};

struct GpuActivations {
  DeviceBuffer tokens;     // [rows] int32: the embedding's backward reads them
  DeviceBuffer residuals;  // [layers + 1, rows, C]: each block's input, then the output
  std::vector<GpuBlockStash> blocks;
  DeviceBuffer final_norm_out;  // [rows, C]
  DeviceBuffer final_norm_mean, final_norm_rstd;
};

struct GpuGradScratch {
  DeviceBuffer d_residual_a, d_residual_b;  // [rows, C] the residual stream's gradient, ping-pong
  DeviceBuffer d_residual_mid, d_norm_out;  // [rows, C]
  DeviceBuffer d_qkv;                       // [rows, (H + 2 KV) D]
  DeviceBuffer d_attn_out;                  // [rows, H D]
  DeviceBuffer d_mlp_pre;                   // like mlp_pre
  DeviceBuffer d_mlp_act;                   // [rows, F]
  DeviceBuffer d_hidden;  // [rows, C] gradient of final_norm_out from the fused loss
};

// Columns of the MLP's first projection: F (GELU input) or 2F (gate | up).
int64_t mlp_pre_width(const ModelConfig& config);

GpuActivations make_gpu_activations(const ModelConfig& config, int64_t batch, int64_t seq_len,
                                    DType dtype);
GpuGradScratch make_gpu_grad_scratch(const ModelConfig& config, int64_t batch, int64_t seq_len,
                                     DType dtype);

}  // namespace loom::gpu
