#pragma once
// The CUDA implementation of kernels/ops.hpp, one function per op with the same arguments
// (kernels/ops.cpp has checked devices and shapes). Plain C++ declarations: ops.cpp calls
// them without seeing a CUDA header. Each picks the f32 or the bf16 kernel of loom::cuda from
// the activations' dtype and runs on the default stream.
#include <memory>
#include <span>

#include "loom/kernels/ops.hpp"

namespace loom::ops::cuda_impl {

void linear_forward(const Tensor& out, int64_t out_col, const Tensor& input, const Tensor& weight,
                    const Tensor* bias);
void linear_backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                     const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                     const Tensor& input, const Tensor& weight);
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& input, const Tensor& weight, const Tensor& bias, float eps);
void layernorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_bias,
                        const Tensor& d_out, const Tensor& input, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd);
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& input,
                     const Tensor& weight, float eps);
void rmsnorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_out,
                      const Tensor& input, const Tensor& weight, const Tensor& rstd);
bool linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& input,
                         const Tensor& weight, const Tensor* bias);
bool linear_backward_through_gelu(const Tensor& d_pre, const Tensor& d_weight, const Tensor& d_bias,
                                  const Tensor& d_out, const Tensor& input, const Tensor& weight,
                                  const Tensor& pre);
void gelu_forward(const Tensor& out, const Tensor& input);
void gelu_backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input);
void swiglu_forward(const Tensor& out, const Tensor& fused);
void swiglu_backward(const Tensor& d_fused, const Tensor& d_out, const Tensor& fused);
// ops_cuda_attention.cu. Key ranges and position ids are the host arrays ops.cpp has checked
// (empty / null: causal, each row's own index); the CUDA side uploads them for its kernels.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& shape, std::span<const int32_t> key_ranges);
void attention_backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, const AttentionShape& shape,
                        std::span<const int32_t> key_ranges);
void cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& kv, const CrossAttentionShape& shape,
                             std::span<const int32_t> key_ranges);
void cross_attention_backward(const Tensor& d_q, const Tensor& d_kv, const Tensor& d_out,
                              const Tensor& q, const Tensor& kv, const Tensor& out,
                              const Tensor& lse, const CrossAttentionShape& shape,
                              std::span<const int32_t> key_ranges);
void merge_attention_partials(const Tensor& out, const Tensor& lse, const Tensor& part,
                              const Tensor& part_lse, int64_t batch, int64_t heads);
void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                  int64_t cols);
// A device copy of the table (owned by the returned pointer) and the rotation that reads it.
std::shared_ptr<void> upload_rope_table(const cpu::RopeTable& table);
void rope_apply(const Tensor& x, int64_t batch, int64_t seq_len, int64_t heads,
                const void* device_table, bool inverse, const int32_t* positions);
void embedding_forward(const Tensor& out, const int32_t* tokens, const Tensor& token_table,
                       const Tensor* position_table, int64_t batch, int64_t seq_len,
                       const int32_t* positions);
void embedding_backward(const Tensor& d_token_table, const Tensor* d_position_table,
                        const Tensor& d_out, const int32_t* tokens, int64_t batch, int64_t seq_len,
                        const int32_t* positions);
double lm_head_cross_entropy(const CrossEntropyArgs& args);
void add_into(const Tensor& dst, const Tensor& src);
// ops::add_norm_forward's fused kernel for bf16 storage; false (nothing done) otherwise.
bool add_norm_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                      const Tensor& residual, const Tensor& delta, const Tensor& weight,
                      const Tensor& bias, float eps);
void scale_(const Tensor& x, float factor);
double sum_of_squares(const Tensor& x);
std::vector<double> sums_of_squares(const std::vector<const Tensor*>& xs);
void round_to_bf16_(const Tensor& x);
int64_t max_attention_head_dim();
std::string kernel_summary(int64_t head_dim, bool bf16);
void adamw_update(const Tensor& param, const Tensor& working, const Tensor& grad,
                  const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWStep& step);
void adamw_update_many(std::span<const AdamWTensors> tensors);

void linear_input_grad(const Tensor& d_input, bool accumulate, const Tensor& d_out,
                       int64_t d_out_col, const Tensor& weight);
void bias_grad(const Tensor& d_bias, const Tensor& d_out);
void add_row_vector(const Tensor& out, const Tensor& v);
void embedding_shard_forward(const Tensor& out, const int32_t* tokens, const Tensor& table,
                             int64_t vocab_begin);
void embedding_shard_backward(const Tensor& d_table, const Tensor& d_out, const int32_t* tokens,
                              int64_t vocab_begin);
// positions: this block's rows' ids (host), or null.
void add_position_rows(const Tensor& out, const Tensor& table, int64_t first_row, int64_t seq_len,
                       const int32_t* positions);
void position_rows_backward(const Tensor& d_table, const Tensor& d_out, int64_t first_row,
                            int64_t seq_len, const int32_t* positions);
void shard_logit_stats(const ShardLogitsArgs& args, const Tensor& stats);
void shard_rescale_sums(const Tensor& stats, const Tensor& global_max);
double shard_loss(const Tensor& lse, const Tensor& stats, const Tensor& global_max,
                  const int32_t* targets, float* row_losses, double* loss_sum);
void shard_logit_grad(const ShardLogitsArgs& args, const Tensor& lse, float grad_scale,
                      const Tensor& d_hidden, const Tensor& d_weight);

// ops_cuda_moe.cu; positions are the host array ops_moe.cpp has checked.
void moe_gather(const Tensor& routed, const Tensor& x, std::span<const int32_t> position,
                int64_t k);
void moe_gather_backward(const Tensor& d_x, const Tensor& d_routed,
                         std::span<const int32_t> position, int64_t k);
void moe_combine(const Tensor& out, const Tensor& expert_out, const Tensor& weights,
                 std::span<const int32_t> position, int64_t k);
void moe_combine_backward(const Tensor& d_expert_out, const Tensor& d_weights, const Tensor& d_out,
                          const Tensor& expert_out, const Tensor& weights,
                          std::span<const int32_t> position, int64_t k);

Tensor fp8_amax(const Tensor& x, int64_t col, int64_t cols);
void fp8_max_into(const Tensor& slots, int64_t index, const Tensor& amax);
Tensor fp8_scale_pair(float scale);
Tensor fp8_scale_pairs(const std::vector<float>& scales);
Tensor fp8_scale_pair(const Tensor& amax, cpu::Fp8Format format, int margin);
Fp8Codes fp8_quantize(const Tensor& x, int64_t col, int64_t cols, const Tensor& scale_pair,
                      cpu::Fp8Format format, bool transposed, const Tensor* amax_slots,
                      int64_t amax_index);
Fp8Codes fp8_quantize_tiles(const Tensor& x, int64_t col, int64_t cols, cpu::Fp8Format format,
                            int margin, bool along_rows, bool down_columns,
                            const Tensor* amax_slots, int64_t amax_index);
Fp8Codes fp8_quantize_blocks(const Tensor& x, cpu::Fp8Format format, int margin, bool transposed,
                             const Tensor* amax_slots, int64_t amax_index);
void fp8_gemm(const Tensor& c, int64_t c_col, float beta, const Fp8Codes& a, bool a_transposed,
              const Fp8Codes& b, bool b_transposed);
void bias_grad_columns(const Tensor& d_bias, const Tensor& d_out, int64_t col);
void add_bias_columns(const Tensor& out, int64_t col, const Tensor& bias);

}  // namespace loom::ops::cuda_impl
