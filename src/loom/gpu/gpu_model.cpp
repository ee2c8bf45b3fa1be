#include "loom/gpu/gpu_model.hpp"

#include <utility>

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/activations.hpp"
#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/cross_entropy.hpp"
#include "loom/kernels/cuda/elementwise.hpp"
#include "loom/kernels/cuda/embedding.hpp"
#include "loom/kernels/cuda/rope.hpp"

namespace loom::gpu {

namespace {
// What the GPU path can take, checked before any device memory is touched.
const ModelConfig& checked_config(const Transformer& host, DType compute_dtype,
                                  int64_t vocab_chunk) {
  const ModelConfig& c = host.config();
  if (host.recompute() != Recompute::None)
    throw_error("model.recompute = \"", recompute_name(host.recompute()),
                "\": the GPU model keeps every activation (recompute = \"none\") so far; set "
                "model.recompute = "
                "\"none\" or train on the CPU");
  if (!host.is_whole() || host.plan().tp() != 1)
    throw_error(
        "the GPU model needs the whole model in one process (parallel.tp = 1, parallel.pp = 1); "
        "this host "
        "model is a pipeline stage or a tensor-parallel shard");
  if (compute_dtype != DType::F32 && compute_dtype != DType::BF16)
    throw_error("the GPU model computes in f32 or bf16, not ", dtype_name(compute_dtype));
  if (vocab_chunk <= 0)
    throw_error("train.vocab_chunk: got ", vocab_chunk, ", expected a positive count");
  check_gpu_model_supports(c);
  return c;
}
}  // namespace

void check_gpu_model_supports(const ModelConfig& c) {
  if (c.head_dim() > cuda::kMaxAttentionHeadDim)
    throw_error("model.n_embd / model.n_head = ", c.n_embd, " / ", c.n_head, " = head_dim ",
                c.head_dim(), ": the CUDA attention kernel takes head_dim up to ",
                cuda::kMaxAttentionHeadDim, "; use more heads or train on the CPU");
}

GpuTransformer::GpuTransformer(const Transformer& host, DType compute_dtype, int64_t vocab_chunk)
    : config_(checked_config(host, compute_dtype, vocab_chunk)),
      vocab_chunk_(vocab_chunk),
      params_(host.parameters(), compute_dtype) {
  const auto eps = static_cast<float>(config_.norm_eps);
  const int64_t c = config_.n_embd;
  token_embedding_ = &params_.of(host.token_embedding);
  if (host.has_position_embedding()) position_embedding_ = &params_.of(host.position_embedding);
  head_ = &params_.of(host.output_weight());
  for (const auto& block : host.blocks)
    blocks_.push_back({gpu_norm(block->norm1, c, eps, params_),
                       gpu_fan_out(*block->attention.input_projection, params_),
                       gpu_fan_in(*block->attention.output_projection, params_),
                       gpu_norm(block->norm2, c, eps, params_),
                       gpu_fan_out(*block->mlp.input_projection, params_),
                       gpu_fan_in(*block->mlp.output_projection, params_)});
  final_norm_ = gpu_norm(*host.final_norm, c, eps, params_);
  if (config_.arch == Architecture::Llama)  // the CPU's table, so both rotate by the same angles
    rope_ = std::make_unique<cuda::RopeTableDevice>(
        cpu::make_rope_table(config_.head_dim(), config_.max_seq_len, config_.rope_theta));
  upload_from(host);
}

GpuTransformer::~GpuTransformer() = default;

cpu::AttentionShape GpuTransformer::attention_shape() const {
  return {batch_, seq_len_, config_.n_head, config_.n_kv_head, config_.head_dim()};
}

void GpuTransformer::ensure_shape(int64_t batch, int64_t seq_len) {
  if (batch == batch_ && seq_len == seq_len_) return;
  if (batch <= 0 || seq_len <= 0)
    throw_error("batch ", batch, " x sequence ", seq_len, " is empty");
  if (seq_len > config_.max_seq_len)
    throw_error("sequence length ", seq_len, " exceeds the model's max_seq_len ",
                config_.max_seq_len);
  // Release the old set first, so its blocks can serve the new one. Until the new set exists
  // the model has no shape, so a failed allocation (out of memory) is never mistaken for it.
  activations_ = GpuActivations{};
  scratch_ = GpuGradScratch{};
  loss_workspace_ = DeviceBuffer{};
  batch_ = seq_len_ = 0;
  const DType dtype = compute_dtype();
  activations_ = make_gpu_activations(config_, batch, seq_len, dtype);
  scratch_ = make_gpu_grad_scratch(config_, batch, seq_len, dtype);
  loss_workspace_ = DeviceBuffer(
      cuda::cross_entropy_workspace_bytes(batch * seq_len, config_.n_embd, config_.vocab_size,
                                          vocab_chunk_, dtype == DType::BF16),
      MemCategory::Workspace);
  batch_ = batch;
  seq_len_ = seq_len;
  grad_ready_ = false;
}

// ---- forward ----------------------------------------------------------------------------

double GpuTransformer::forward(const int32_t* tokens_device, const int32_t* targets_device,
                               int64_t batch, int64_t seq_len, const ForwardOptions& options) {
  ensure_shape(batch, seq_len);
  grad_ready_ = false;
  copy_on_device(activations_.tokens.as<int32_t>(), tokens_device,
                 static_cast<size_t>(batch * seq_len) * sizeof(int32_t));
  return compute_dtype() == DType::BF16 ? forward_as<bf16>(targets_device, options)
                                        : forward_as<float>(targets_device, options);
}

template <typename T>
double GpuTransformer::forward_as(const int32_t* targets, const ForwardOptions& options) {
  const int64_t rows = batch_ * seq_len_, c = config_.n_embd, layers = config_.n_layer;
  T* residual = activations_.residuals.as<T>();
  cuda::embedding_forward(residual, activations_.tokens.as<int32_t>(), token_embedding_->value<T>(),
                          position_embedding_ ? position_embedding_->value<T>() : nullptr, batch_,
                          seq_len_, c);
  for (int64_t l = 0; l < layers; ++l)
    block_forward<T>(blocks_[static_cast<size_t>(l)], activations_.blocks[static_cast<size_t>(l)],
                     residual + (l + 1) * rows * c, residual + l * rows * c);
  T* hidden = activations_.final_norm_out.as<T>();
  final_norm_.forward(hidden, activations_.final_norm_mean.as<float>(),
                      activations_.final_norm_rstd.as<float>(), residual + layers * rows * c, rows);
  // The fused head + loss writes the head's gradient (Transformer::forward_chunk, head_loss).
  cuda::CrossEntropyArgsT<T> args;
  args.hidden = hidden;
  args.weight = head_->value<T>();
  args.targets = targets;
  args.rows = rows;
  args.dim = c;
  args.vocab = config_.vocab_size;
  args.vocab_chunk = vocab_chunk_;
  args.grad_scale = options.grad_scale;
  args.d_hidden = options.compute_grad ? scratch_.d_hidden.as<T>() : nullptr;
  args.d_weight = options.compute_grad ? head_->grad : nullptr;
  args.workspace = loss_workspace_.as<void>();
  args.workspace_bytes = loss_workspace_.bytes();
  const double loss = cuda::lm_head_cross_entropy(args);
  grad_ready_ = options.compute_grad;
  return loss;
}

// TransformerBlock::forward with CausalSelfAttention::forward and Mlp::forward inlined.
template <typename T>
void GpuTransformer::block_forward(const GpuBlock& block, GpuBlockStash& s, T* x_out,
                                   const T* x_in) {
  const int64_t rows = batch_ * seq_len_, c = config_.n_embd, n = rows * c, f = config_.ffn_hidden;
  const int64_t qkv_ld = block.attention_in.width, pre_ld = block.mlp_in.width;
  T* norm1_out = s.norm1_out.as<T>();
  T* qkv = s.qkv.as<T>();
  T* attn_out = s.attn_out.as<T>();
  T* residual_mid = s.residual_mid.as<T>();
  T* norm2_out = s.norm2_out.as<T>();
  T* mlp_pre = s.mlp_pre.as<T>();
  T* mlp_act = s.mlp_act.as<T>();

  block.norm1.forward(norm1_out, s.norm1_mean.as<float>(), s.norm1_rstd.as<float>(), x_in, rows);
  block.attention_in.forward(qkv, qkv_ld, norm1_out, rows);
  if (rope_)  // rotate the q and k heads (adjacent in the row), leave v alone
    cuda::rope_apply(qkv, batch_, seq_len_, config_.n_head + config_.n_kv_head, qkv_ld, *rope_,
                     false);
  cuda::attention_forward(attn_out, s.attn_lse.as<float>(), qkv, attention_shape());
  block.attention_out.forward(residual_mid, c, attn_out, rows);
  cuda::add_into(residual_mid, x_in, n);
  block.norm2.forward(norm2_out, s.norm2_mean.as<float>(), s.norm2_rstd.as<float>(), residual_mid,
                      rows);
  block.mlp_in.forward(mlp_pre, pre_ld, norm2_out, rows);
  if (config_.arch == Architecture::GPT2)
    cuda::gelu_forward(mlp_act, mlp_pre, rows * f);
  else
    cuda::swiglu_forward(mlp_act, mlp_pre, mlp_pre + f, rows, f, pre_ld);
  block.mlp_out.forward(x_out, c, mlp_act, rows);
  cuda::add_into(x_out, residual_mid, n);
}

// ---- backward ---------------------------------------------------------------------------

void GpuTransformer::backward() {
  if (!grad_ready_) throw_error("backward() needs a forward() with compute_grad first");
  if (compute_dtype() == DType::BF16)
    backward_as<bf16>();
  else
    backward_as<float>();
  grad_ready_ = false;
}

template <typename T>
void GpuTransformer::backward_as() {
  const int64_t rows = batch_ * seq_len_, c = config_.n_embd, layers = config_.n_layer;
  const T* residual = activations_.residuals.as<T>();
  T* d_out = scratch_.d_residual_a.as<T>();
  T* d_in = scratch_.d_residual_b.as<T>();
  scratch_.d_residual_a.zero();  // the final norm's backward adds into it
  final_norm_.backward(d_out, scratch_.d_hidden.as<T>(), residual + layers * rows * c,
                       activations_.final_norm_mean.as<float>(),
                       activations_.final_norm_rstd.as<float>(), rows);
  for (int64_t l = layers - 1; l >= 0; --l) {
    block_backward<T>(blocks_[static_cast<size_t>(l)], activations_.blocks[static_cast<size_t>(l)],
                      d_in, d_out, residual + l * rows * c);
    std::swap(d_in, d_out);
  }
  // With tied embeddings the token table's gradient already holds the head's part.
  cuda::embedding_backward(token_embedding_->grad,
                           position_embedding_ ? position_embedding_->grad : nullptr, d_out,
                           activations_.tokens.as<int32_t>(), batch_, seq_len_, c);
}

// TransformerBlock::backward (no recomputation) with Mlp::backward and
// CausalSelfAttention::backward inlined.
template <typename T>
void GpuTransformer::block_backward(const GpuBlock& block, const GpuBlockStash& s, T* d_x_in,
                                    const T* d_x_out, const T* x_in) {
  const int64_t rows = batch_ * seq_len_, c = config_.n_embd, n = rows * c, f = config_.ffn_hidden;
  const int64_t qkv_ld = block.attention_in.width, pre_ld = block.mlp_in.width;
  const size_t residual_bytes = static_cast<size_t>(n) * sizeof(T);
  T* d_mid = scratch_.d_residual_mid.as<T>();
  T* d_norm_out = scratch_.d_norm_out.as<T>();
  T* d_qkv = scratch_.d_qkv.as<T>();
  T* d_attn_out = scratch_.d_attn_out.as<T>();
  T* d_mlp_pre = scratch_.d_mlp_pre.as<T>();
  T* d_mlp_act = scratch_.d_mlp_act.as<T>();
  const T* qkv = s.qkv.as<T>();
  const T* attn_out = s.attn_out.as<T>();
  const T* mlp_pre = s.mlp_pre.as<T>();

  copy_on_device(d_mid, d_x_out, residual_bytes);  // the residual passes the gradient through
  block.mlp_out.backward(d_mlp_act, false, d_x_out, c, s.mlp_act.as<T>(), rows);
  if (config_.arch == Architecture::GPT2)
    cuda::gelu_backward(d_mlp_pre, d_mlp_act, mlp_pre, rows * f);
  else
    cuda::swiglu_backward(d_mlp_pre, d_mlp_pre + f, d_mlp_act, mlp_pre, mlp_pre + f, rows, f,
                          pre_ld);
  block.mlp_in.backward(d_norm_out, d_mlp_pre, pre_ld, s.norm2_out.as<T>(), rows);
  block.norm2.backward(d_mid, d_norm_out, s.residual_mid.as<T>(), s.norm2_mean.as<float>(),
                       s.norm2_rstd.as<float>(), rows);
  block.attention_out.backward(d_attn_out, false, d_mid, c, attn_out, rows);
  cuda::attention_backward(d_qkv, d_attn_out, qkv, attn_out, s.attn_lse.as<float>(),
                           attention_shape());
  if (rope_)  // the rotation is orthogonal: its backward rotates by the negative angle
    cuda::rope_apply(d_qkv, batch_, seq_len_, config_.n_head + config_.n_kv_head, qkv_ld, *rope_,
                     true);
  block.attention_in.backward(d_norm_out, d_qkv, qkv_ld, s.norm1_out.as<T>(), rows);
  copy_on_device(d_x_in, d_mid, residual_bytes);
  block.norm1.backward(d_x_in, d_norm_out, x_in, s.norm1_mean.as<float>(), s.norm1_rstd.as<float>(),
                       rows);
}

}  // namespace loom::gpu
