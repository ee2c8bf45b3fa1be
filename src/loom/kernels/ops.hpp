#pragma once
// The one op interface the model computes through: every op takes Tensors (shape, dtype,
// device) and runs on the device they live on. The CPU implementation calls loom::cpu's
// kernels (the reference; f32 storage, bf16 emulated by rounding); the CUDA one, built when
// loom is, calls loom::cuda's kernels in f32 or real bf16 storage. All tensors of one call
// must share a device; the checks here name the op, the argument and what was expected.
//
// Dtypes: activations and working weights are F32, or BF16 on CUDA; parameter gradients, norm
// statistics and attention log-sum-exps are always F32.
//
// Row-major matrices: a 2-D tensor [rows, ld]. Where an op reads or writes a block of
// columns (the q|k|v or gate|up projections writing side by side into one fused activation),
// it takes the tensor and the block's first column.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cpu/adamw.hpp"
#include "loom/kernels/cpu/attention.hpp"
#include "loom/kernels/cpu/fp8.hpp"
#include "loom/kernels/cpu/rope.hpp"

namespace loom::ops {

using AttentionShape = cpu::AttentionShape;
using CrossAttentionShape = cpu::CrossAttentionShape;

// ---- linear layers: y = x W^T (+ b), W stored [out, in] ---------------------------------
// out[:, out_col : out_col + W.rows] = input @ W^T (+ bias). input [rows, in], out [rows, *].
void linear_forward(const Tensor& out, int64_t out_col, const Tensor& input, const Tensor& weight,
                    const Tensor* bias);
// From d_out[:, d_out_col : d_out_col + W.rows]: d_input (undefined to skip) written or, with
// accumulate_input, added; d_weight += d_out^T input; d_bias (undefined to skip) += column sums.
void linear_backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                     const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                     const Tensor& input, const Tensor& weight);

// The MLP's GELU in its products' epilogues (CUDA, bf16; nowhere else yet). pre = input W^T + b
// and act = gelu(pre), both [rows, W.rows], from one product. Returns false, having written
// nothing, where the fusion does not exist (the CPU, f32 tensors, no such cuBLASLt kernel): the
// caller then runs linear_forward and gelu_forward.
bool linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& input,
                         const Tensor& weight, const Tensor* bias);
// The product after that GELU, backward and carried through it: d_pre = gelu'(pre) * (d_out W)
// written, and d_weight / d_bias accumulated from d_out and `input` (the GELU's output) as
// linear_backward does. Returns false, having written nothing, as above.
bool linear_backward_through_gelu(const Tensor& d_pre, const Tensor& d_weight, const Tensor& d_bias,
                                  const Tensor& d_out, const Tensor& input, const Tensor& weight,
                                  const Tensor& pre);

// ---- norms over the last dimension ------------------------------------------------------
// mean / rstd: [rows] F32. bias undefined for RMSNorm.
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& input, const Tensor& weight, const Tensor& bias, float eps);
// d_input accumulated; d_weight, d_bias accumulated (F32).
void layernorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_bias,
                        const Tensor& d_out, const Tensor& input, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd);
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& input,
                     const Tensor& weight, float eps);
void rmsnorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_out,
                      const Tensor& input, const Tensor& weight, const Tensor& rstd);
// The residual add before a norm, then the norm: sum = residual + delta (stored: the next
// layer's input and this norm's backward input; may be residual or delta itself), rounded to
// bf16 values when round_sum_to_bf16 (the CPU's bf16 mode, f32 storage), then out =
// norm(sum). Exactly ops::add_into, round_to_bf16_ and the norm's forward in turn; on CUDA with
// bf16 storage one fused kernel (kernels/cuda/norms: the sum is rounded where it is stored and
// normalised as stored, so the same bits), saving a launch and a pass over the rows. bias
// undefined for RMSNorm (mean then unused).
void add_norm_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                      const Tensor& residual, const Tensor& delta, const Tensor& weight,
                      const Tensor& bias, float eps, bool round_sum_to_bf16);

// ---- activations ----------------------------------------------------------------------
void gelu_forward(const Tensor& out, const Tensor& input);
void gelu_backward(const Tensor& d_input, const Tensor& d_out,
                   const Tensor& input);  // d_input written
// fused: [rows, 2 dim] = gate | up; out [rows, dim].
void swiglu_forward(const Tensor& out, const Tensor& fused);
void swiglu_backward(const Tensor& d_fused, const Tensor& d_out,
                     const Tensor& fused);  // d_fused written

// ---- attention --------------------------------------------------------------------------
// Causal GQA flash attention over the fused qkv [B*T, (H + 2 KV) D]; out [B*T, H D]; lse
// [B, H, T] F32. `key_ranges` (host, 2 per query row of the B*T, empty for causal) narrows
// what each query row i sees to the keys [begin, end), 0 <= begin < end <= i + 1: packed
// documents (begin = the document's first token) or a sliding window. On CUDA, ranges take the
// ranged kernels (cuda/attention.hpp); the causal call keeps the causal (or tensor-core) ones.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& shape, std::span<const int32_t> key_ranges = {});
void attention_backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, const AttentionShape& shape,
                        std::span<const int32_t> key_ranges = {});  // d_qkv written

// Queries over keys and values held elsewhere (context parallelism: this rank's queries over
// the keys and values gathered from the whole sequence). q [B*q_len, >= H D] (heads in its
// first H D columns, as in a fused qkv row), kv [B*kv_len, 2 KV D] (k | v), key_ranges (host, 2
// per query row, required) in kv rows: 0 <= begin < end <= kv_len. out [B*q_len, H D], lse
// [B, H, q_len] F32. The backward writes d_q's first H D columns and all of d_kv. The CPU takes
// f32; CUDA also bf16 q (d_out, out) over f32 kv with f32 or bf16 results, the ring's layout.
void cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                             const CrossAttentionShape& shape, std::span<const int32_t> key_ranges);
void cross_attention_backward(const Tensor& d_q, const Tensor& d_kv, const Tensor& d_out,
                              const Tensor& q, const Tensor& kv, const Tensor& out, const Tensor& lse,
                              const CrossAttentionShape& shape, std::span<const int32_t> key_ranges);

// Ring attention's merge of two partial results over disjoint sets of keys, exact in f32
// through their log-sum-exps: lse' = log(e^lse + e^part_lse), out' = out e^(lse - lse') +
// part e^(part_lse - lse'). out, part [batch * T, heads * D]; lse, part_lse [batch, heads, T]
// F32. A -inf log-sum-exp (no key seen) weighs 0; two of them leave out and lse as they are.
// F32 tensors, on either device.
void merge_attention_partials(const Tensor& out, const Tensor& lse, const Tensor& part,
                              const Tensor& part_lse, int64_t batch, int64_t heads);

// dst[:, dst_col : dst_col + cols] = src[:, src_col : src_col + cols], both 2-D with as many
// rows (the k|v columns of a fused qkv and a k|v block). F32 on the CPU; on CUDA f32 or bf16,
// converting (round to nearest even) where the two differ.
void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols);

// The largest head_dim the attention ops take on `device` (the CPU has no limit; 0 for a
// device this loom was built without).
int64_t max_attention_head_dim(Device device);
// What the CUDA engine runs for a model of this head width (bf16 or f32 activations): the
// attention kernels LOOM_CUDA_ATTENTION picks (auto: cuDNN's where it loads, else why not and
// loom's) and the lm-head's logit precision, as one phrase for the run's first line; empty on
// the CPU or without CUDA.
std::string cuda_kernel_summary(Device device, int64_t head_dim, bool bf16);

// Rotary embedding ("rotate half", Hugging Face's table rounding): the table on the host,
// and a device copy made on the first CUDA use.
class Rope {
 public:
  Rope(int64_t head_dim, int64_t max_positions, double theta, const cpu::RopeScaling& scaling = {});
  ~Rope();
  Rope(const Rope&) = delete;
  Rope& operator=(const Rope&) = delete;
  // In place on the first `heads` heads of each row of x [B*T, *] (q and k side by side);
  // inverse rotates back (the backward). `positions` (host, one per row) replace each row's
  // index in its sequence.
  void apply(const Tensor& x, int64_t batch, int64_t seq_len, int64_t heads, bool inverse,
             std::span<const int32_t> positions = {}) const;
  const cpu::RopeTable& table() const { return table_; }

 private:
  cpu::RopeTable table_;
  struct DeviceTable;
  mutable std::unique_ptr<DeviceTable> device_;
};

// ---- embeddings -------------------------------------------------------------------------
// out[b*t] = token_table[tokens[b*t]] (+ position_table[t]). Token ids are the data loader's,
// on the host, and are checked there; the op uploads them when the tables are on a device.
// Table gradients are F32 and accumulated.
// `positions` (host, one per token) replace each token's index t in its sequence as the
// position-table row.
void embedding_forward(const Tensor& out, const int32_t* tokens, const Tensor& token_table,
                       const Tensor* position_table, int64_t batch, int64_t seq_len,
                       std::span<const int32_t> positions = {});
void embedding_backward(const Tensor& d_token_table, const Tensor* d_position_table,
                        const Tensor& d_out, const int32_t* tokens, int64_t batch, int64_t seq_len,
                        std::span<const int32_t> positions = {});

// ---- output head + cross-entropy --------------------------------------------------------
// Fused projection, softmax and cross-entropy, one vocabulary chunk of logits at a time
// (cpu::lm_head_cross_entropy's contract). Targets are host ids; negative ones are ignored.
struct CrossEntropyArgs {
  Tensor hidden;  // [rows, dim]
  Tensor weight;  // [vocab, dim]
  const int32_t* targets = nullptr;
  int64_t vocab_chunk = 0;
  float grad_scale = 1.0f;
  Tensor d_hidden;  // [rows, dim] overwritten; undefined for the loss only
  Tensor d_weight;  // [vocab, dim] F32, accumulated; undefined to skip
  Tensor workspace;  // [rows, vocab_chunk] F32 logits scratch kept between calls; undefined:
                     // the op allocates its own
  // A double on the tensors' device (model/loss_sum's slot), or null. Set: the summed loss is
  // added into it, queued behind the head's kernels, and the op returns 0 without waiting for
  // the device.
  double* loss_sum = nullptr;
};
// The summed loss over rows with a target (double, fixed order); waits for the device, unless
// args.loss_sum takes it.
double lm_head_cross_entropy(const CrossEntropyArgs& args);

// ---- pieces of tensor-parallel layers (ops_shard.cpp) --------------------------------------
// The compute between a tensor-parallel layer's collectives (parallel/): the halves of a
// linear backward, adds after a reduction, and a vocabulary shard's embedding and head.
//
// d_input = d_out[:, d_out_col : d_out_col + W.rows] @ W, written or (accumulate) added.
void linear_input_grad(const Tensor& d_input, bool accumulate, const Tensor& d_out,
                       int64_t d_out_col, const Tensor& weight);
// d_bias (F32) += the column sums of d_out.
void bias_grad(const Tensor& d_bias, const Tensor& d_out);
// out[r, :] += v for every row of the 2-D out.
void add_row_vector(const Tensor& out, const Tensor& v);
// table holds vocabulary ids [vocab_begin, vocab_begin + table rows): out[r] = its row of
// tokens[r], or zeros for an id outside it; the backward adds d_out's rows of owned ids into
// d_table (F32). Tokens are host ids, as for embedding_forward.
void embedding_shard_forward(const Tensor& out, const int32_t* tokens, const Tensor& table,
                             int64_t vocab_begin);
void embedding_shard_backward(const Tensor& d_table, const Tensor& d_out, const int32_t* tokens,
                              int64_t vocab_begin);
// out[r] += table[(first_row + r) % seq_len]: learned positions for a block of rows starting at
// row first_row of the whole batch; the backward adds into d_table (F32).
// `positions` (host, one per row of the whole batch) replace (first_row + r) % seq_len.
void add_position_rows(const Tensor& out, const Tensor& table, int64_t first_row,
                       int64_t seq_len, std::span<const int32_t> positions = {});
void position_rows_backward(const Tensor& d_table, const Tensor& d_out, int64_t first_row,
                            int64_t seq_len, std::span<const int32_t> positions = {});

// The output head over a vocabulary shard, logits one chunk at a time in `workspace` (F32,
// at least rows x min(vocab_chunk, shard) elements, on the model's device; a single chunk's
// logits stay there from pass 1 to pass 2, so pass the same workspace to both).
struct ShardLogitsArgs {
  Tensor hidden;                     // [rows, dim]
  Tensor weight;                     // [shard, dim]: ids [vocab_begin, vocab_begin + shard)
  const int32_t* targets = nullptr;  // [rows] host, full-vocabulary ids; negative: ignored
  int64_t vocab_begin = 0;
  int64_t vocab_chunk = 0;
  Tensor workspace;
};
// The statistics, log-sum-exps and losses below are F32 tensors on the args' device, and
// nothing but a host result waits for it: between the passes the parallel code reduces them
// over the shards where they are (parallel/vocab_parallel).
//
// Pass 1 into `stats` [3, rows]: each row's max logit over the shard | sum of exp(logit - max) |
// the target's logit where the shard owns the target (0 elsewhere).
void shard_logit_stats(const ShardLogitsArgs& args, const Tensor& stats);
// After the maxima are reduced over the shards into global_max [rows]: stats' sums to the global
// max, sum *= exp(max - global_max), so that adding them over the shards gives each row's sum of
// exp(logit - global_max).
void shard_rescale_sums(const Tensor& stats, const Tensor& global_max);
// After the sums and target logits (stats' rows 1 and 2) are added over the shards:
// lse [rows] = global_max + log(sum), each row's loss lse - target logit (0 for a negative host
// target) into row_losses (a host array [rows], or null; filling it waits), and their sum in
// double in a fixed order: returned, or added into loss_sum (a double on the device, as
// CrossEntropyArgs::loss_sum) with 0 returned and nothing waited for.
double shard_loss(const Tensor& lse, const Tensor& stats, const Tensor& global_max,
                  const int32_t* targets, float* row_losses, double* loss_sum);
// Pass 2 from lse [rows]: grad_scale * (softmax - onehot) over the shard into d_hidden
// (overwritten; undefined to skip) and d_weight (F32, accumulated; undefined to skip).
void shard_logit_grad(const ShardLogitsArgs& args, const Tensor& lse, float grad_scale,
                      const Tensor& d_hidden, const Tensor& d_weight);

// ---- mixture of experts (ops_moe.cpp) ------------------------------------------------------
// The routed copies of a MoE layer's tokens (cpu/moe.hpp's contracts): position (host, [rows k])
// is each slot's row in the routed buffers, -1 for a dropped slot. Rows (x, routed, out,
// expert_out and their gradients) in the activations' dtype; weights and d_weights [rows, k]
// F32 on the same device.
void moe_gather(const Tensor& routed, const Tensor& x, std::span<const int32_t> position,
                int64_t k);
void moe_gather_backward(const Tensor& d_x, const Tensor& d_routed,
                         std::span<const int32_t> position,
                         int64_t k);  // d_x accumulated
void moe_combine(const Tensor& out, const Tensor& expert_out, const Tensor& weights,
                 std::span<const int32_t> position, int64_t k);  // out written
void moe_combine_backward(const Tensor& d_expert_out, const Tensor& d_weights, const Tensor& d_out,
                          const Tensor& expert_out, const Tensor& weights,
                          std::span<const int32_t> position,
                          int64_t k);  // both written

// ---- elementwise ------------------------------------------------------------------------
void add_into(const Tensor& dst, const Tensor& src);  // dst += src
void scale_(const Tensor& x, float factor);
double sum_of_squares(const Tensor& x);  // in double, deterministic; waits for the device
// sum_of_squares of each tensor, each the single call's bits, with one wait for the device
// when they are all on a GPU (a gradient norm reads every parameter's sum in one go).
std::vector<double> sums_of_squares(const std::vector<const Tensor*>& xs);
// ---- optimizer --------------------------------------------------------------------------
using AdamWStep = cpu::AdamWStep;
// One AdamW step (cpu::adamw_update's arithmetic) on `param`, F32: the parameter itself, or its
// fp32 master. grad, exp_avg, exp_avg_sq: F32, shaped like it. `working` (undefined: none) is
// the copy the model computes with, rewritten from the updated values: BF16 (CUDA) in the same
// pass, or F32 holding bf16-rounded values (the CPU's bf16 emulation).
void adamw_update(const Tensor& param, const Tensor& working, const Tensor& grad,
                  const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWStep& step);
// One tensor of adamw_update_many: adamw_update's arguments.
struct AdamWTensors {
  Tensor param, working, grad, exp_avg, exp_avg_sq;
  AdamWStep step;
};
// adamw_update on each entry (the same checks, arithmetic and bits): one kernel launch for all
// of them when they are all on a GPU (an optimizer step's hundreds of small tensors), else one
// call each.
void adamw_update_many(std::span<const AdamWTensors> tensors);

// Rounds an F32 tensor's values to bf16 values in place (the CPU's bf16 emulation); a BF16
// tensor already holds bf16 values and is left alone.
void round_to_bf16_(const Tensor& x);

// ---- FP8 on CUDA (model/fp8_linear's device path; the CPU emulates FP8 in f32) -------------
// The CPU has no FP8 codes: every function here throws for a CPU tensor.
// One operand of an FP8 GEMM: the codes of a [rows, cols] block (row-major, and when asked the
// transpose [cols, rows]) and its {1 / scale, scale} pair, all in device memory (the inverse
// first: cuBLASLt's scale pointer, at the start of its allocation).
// How an Fp8Codes' scales cover it: one scale pair for the tensor, or blockwise (DeepSeek-V3's
// recipe) a factor per tile in cuBLASLt's block-scaled layouts (kernels/cuda/fp8.hpp): Tiles,
// 128-element runs along each operand's inner dimension (codes: 1 x 128 along the rows; codes_t:
// 128 x 1 down the columns); Blocks, 128 x 128 blocks (a weight, codes_t its transpose).
enum class Fp8Tiling { PerTensor, Tiles, Blocks };
struct Fp8Codes {
  Tensor codes, codes_t, scale_pair;  // codes: bytes in an F32 tensor's storage
  Tensor scales, scales_t;            // blockwise: codes' and codes_t's dequantisation factors
  Fp8Tiling tiling = Fp8Tiling::PerTensor;
  cpu::Fp8Format format = cpu::Fp8Format::E4M3;
  int64_t rows = 0, cols = 0;
};
// max |x| over columns [col, col + cols) of x [rows, ld] (BF16 or F32), as a new device F32 [1].
Tensor fp8_amax(const Tensor& x, int64_t col, int64_t cols);
// slots[index] = max(slots[index], amax[0]) on the device (slots: a device F32 tensor).
void fp8_max_into(const Tensor& slots, int64_t index, const Tensor& amax);
// {1 / scale, scale}: a host scale uploaded without a wait, or cpu::fp8_scale of a device amax
// computed on the device.
Tensor fp8_scale_pair(float scale);
Tensor fp8_scale_pair(const Tensor& amax, cpu::Fp8Format format, int margin);
// Many host scales' pairs in one upload: pair i at elements [2 i, 2 i + 2) (a slice_as of 2 is
// fp8_scale_pair(scales[i])'s tensor, value for value).
Tensor fp8_scale_pairs(const std::vector<float>& scales);
// The codes of columns [col, col + cols) of x at scale_pair's scale (and their transpose when
// asked). With amax_slots (a device F32 tensor), amax_slots[amax_index] = max(itself, max |x|)
// from the same pass over x: fp8_amax and fp8_max_into's result without a second read.
Fp8Codes fp8_quantize(const Tensor& x, int64_t col, int64_t cols, const Tensor& scale_pair,
                      cpu::Fp8Format format, bool transposed, const Tensor* amax_slots = nullptr,
                      int64_t amax_index = 0);
// Blockwise (train.fp8_recipe = "blockwise"): columns [col, col + cols) of x [rows, ld] as
// 1 x 128 tiles along the rows (codes, when `along_rows`) and as 128 x 1 tiles down the columns,
// transposed (codes_t, when `down_columns`: the operand of a product over the rows), each tile
// scaled by cpu::fp8_scale of its own amax; rows and cols multiples of 128. With amax_slots,
// amax_slots[amax_index] = max(itself, the largest tile amax).
Fp8Codes fp8_quantize_tiles(const Tensor& x, int64_t col, int64_t cols, cpu::Fp8Format format,
                            int margin, bool along_rows, bool down_columns,
                            const Tensor* amax_slots = nullptr, int64_t amax_index = 0);
// x [rows, cols] in 128 x 128 blocks, a scale each, with the transpose when asked.
Fp8Codes fp8_quantize_blocks(const Tensor& x, cpu::Fp8Format format, int margin, bool transposed,
                             const Tensor* amax_slots = nullptr, int64_t amax_index = 0);
// Columns [c_col, c_col + N) of c [M, ld] (BF16 or F32) = beta c + op(a) op(b)^T dequantised,
// op = the codes or their transpose: op(a) [M, K], op(b) [N, K]. Blockwise operands pair Tiles
// with Tiles or with Blocks (M, N and K multiples of 128; Hopper's cuBLASLt).
void fp8_gemm(const Tensor& c, int64_t c_col, float beta, const Fp8Codes& a, bool a_transposed,
              const Fp8Codes& b, bool b_transposed);
// d_bias (F32) += column sums of columns [col, col + d_bias.numel()) of d_out.
void bias_grad_columns(const Tensor& d_bias, const Tensor& d_out, int64_t col);
// Columns [col, col + bias.numel()) of out += bias, per row (out and bias of one dtype).
void add_bias_columns(const Tensor& out, int64_t col, const Tensor& bias);

}  // namespace loom::ops
