#pragma once
// Memory per rank, by the allocator's categories, predicted from the model description and a
// layout. Two uses: GPU jobs (bf16 mixed precision, what `loom plan` searches over) and the
// CPU engine as built (f32 storage), where the prediction must equal the allocator's figures.
#include <cstdint>
#include <vector>

#include "loom/model/config.hpp"
#include "loom/plan/layout.hpp"

namespace loom::plan {

struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, comm_buffers = 0, workspace = 0;
  double total() const { return parameters + gradients + optimizer_state + activations + comm_buffers + workspace; }
};

// Bytes per parameter of each piece of model state.
struct StateBytes {
  double parameter, gradient, master, moments;
};
// Mixed precision with Adam as the ZeRO paper counts it (Rajbhandari et al., SC'20, sec. 3.1):
// bf16 parameters and gradients (2 + 2), fp32 master, momentum and variance (K = 12).
constexpr StateBytes kMixedPrecisionAdam{2, 2, 4, 8};
// Everything f32 (the CPU engine in f32 mode): no separate master.
constexpr StateBytes kF32Adam{4, 4, 0, 8};
// A frozen base (LoRA's, TrainingJob::frozen_base) keeps its weights only: no gradient, copy or
// moments.
constexpr StateBytes frozen_base_state(const StateBytes& trained) {
  return {trained.parameter, 0, 0, 0};
}

// Model states of one rank holding `params` parameters, sharded over `dp` by ZeRO `stage`
// (ZeRO paper, Fig. 1): stage 1 shards master + moments, 2 also gradients, 3 also parameters.
MemoryBreakdown zero_model_states(double params, const StateBytes& bytes, int64_t dp, int stage);

// Activation bytes one micro-batch leaves for backward in one transformer layer, for the
// engine's design (flash attention: the log-sum-exp, never the s x s scores; no dropout).
// Structure after Korthikanti et al. 2022 (sec. 4.1, Table 2): with tensor parallelism the
// attention and MLP interiors divide by t; with sequence parallelism the layer-norm and
// residual parts divide by t too; selective recomputation drops the attention core and the
// MLP activation; full recomputation keeps only the layer input. Context parallelism divides
// the sequence by cp.
// `flash_attention` false models attention that materialises the scores (Megatron-LM before
// FlashAttention): softmax output, dropout mask and dropout output, 5 a s bytes per token
// (Korthikanti et al. Table 2's 5as/h term), dropped by selective recomputation.
// `fp8_linear_inputs`: Transformer Engine's FP8 recipe, where each Linear saves the FP8 cast of
// its input for the weight gradient (1 byte, not 2: Micikevicius et al. 2022, "FP8 Formats for
// Deep Learning", sec. 3; Transformer Engine's Linear/LayerNormLinear save the quantised input):
// the two norm outputs (q|k|v and MLP inputs), the attention output (projection input) and the
// MLP activation (down-projection input) take one byte each.
double layer_activation_bytes(const ModelConfig& model, int64_t micro_batch, int64_t seq_len,
                              const PlanLayout& layout, double bytes_per_element,
                              bool flash_attention = true, bool fp8_linear_inputs = false);

// What `Recompute::Selective` keeps, by the stack that runs it.
//   AttentionCore: Megatron-LM's (Korthikanti et al. 2022 sec. 5), as layer_activation_bytes
//     counts it: the attention core and the MLP activation are recomputed, the rest is kept.
//   TorchtitanOps: torchtitan's per-op selective activation checkpointing
//     (selective_ac_option = "op", its train_configs' default; torchtitan 9dec370,
//     torchtitan/parallelisms/parallelize_llama.py, _save_list and _apply_ac_to_transformer_block):
//     the outputs of aten.mm, flash/efficient SDPA, reduce_scatter and max are saved "except every
//     second mm" and every other op is recomputed. A Llama block runs its 7 matmuls in the order
//     wq, wk, wv, wo, w1, w3, w2, so the 1st, 3rd, 5th and 7th are saved (wq, wv, w1, w2) and wk,
//     wo, w3, the norms, RoPE, repeat_kv and SwiGLU are recomputed. Under torch.compile (the runs
//     measured with it) the partitioner keeps only what backward reads (torch._functorch.
//     partitioners treats PREFER_RECOMPUTE as must-recompute), which drops w2's output (it only
//     feeds the residual add); eager (torch.utils.checkpoint's selective contexts) caches every
//     MUST_SAVE output from the forward to the recomputation, w2's too.
//     torchtitan_op_sac_layer_bytes counts either.
enum class SelectivePolicy { AttentionCore, TorchtitanOps };

// Bytes one micro-batch leaves for backward in one Llama layer under torchtitan's per-op
// selective checkpointing (SelectivePolicy::TorchtitanOps), per token: the block input (h, the
// checkpoint's input), wq's output (h), wv's output (kv_dim), the SDPA output (h) and its
// log-sum-exp (n_head in fp32), w1's output (f); with tp > 1 (torchtitan pairs it with sequence
// parallelism) the head and MLP interiors divide by t, the block input too, and the output
// projection's reduce_scatter output (h / t, in _save_list) is kept, since backward rebuilds the
// mid residual from it. Llama 3.1 8B in bf16: (3 x 4096 + 1024 + 14336) x 2 + 32 x 4 = 55,424
// bytes per token. `eager` (no torch.compile) adds w2's output, the [tokens, h] partial sum
// before the reduction (h, whatever tp), and under sequence parallelism its reduce_scatter
// output (h / t): 63,616 bytes per token for that layer. Dense Llama blocks only (the policy
// counts a dense block's matmuls).
double torchtitan_op_sac_layer_bytes(const ModelConfig& model, int64_t micro_batch, int64_t seq_len,
                                     const PlanLayout& layout, double bytes_per_element,
                                     bool eager = false);

// Layers' worth of micro-batch activations the most loaded pipeline rank holds at its peak
// (Korthikanti et al. sec. 4.2.3; Narayanan et al. 2021 sec. 2.2): AFAB holds all m
// micro-batches of its L/p layers; 1F1B holds min(m, p) of them, i.e. L layers when m >= p;
// interleaved holds L (1 + (p - 1) / (p v)).
double layers_in_flight(const ModelConfig& model, const PlanLayout& layout, int64_t micro_batches);

// How a layer's stash is counted: as loom's engine keeps it (layer_activation_bytes), or as
// Korthikanti et al. 2022 count Megatron-LM's GPT layers with dropout (sec. 4.1, eqs. 1-6:
// sbh (10 + 24/t + 5as/(ht)) bytes without sequence parallelism, sbh (34/t + 5as/(ht)) with
// it, the 5as/h scores term dropped by selective recomputation or by flash attention, 2sbh with
// full recomputation; the 24 generalised to 8 + 4f/h for an MLP of width f).
enum class ActivationAccounting { Engine, Korthikanti };

inline constexpr double kUnfusedRmsNormSavedBytes = 4;
// The rows each of a layer's norms normalises on one rank (micro-batch x seq / cp, over tp
// under sequence parallelism), or 0 where the model's norm is not an RMSNorm (GPT-2's
// LayerNorm is one PyTorch op: GpuJob::unfused_rmsnorm does not apply).
double unfused_rmsnorm_rows(const ModelConfig& model, const PlanLayout& layout, int64_t seq_len);

struct GpuJob {
  int64_t seq_len = 2048;
  int64_t micro_batches = 1;        // per step per pipeline (gradient accumulation steps)
  // Under full recomputation, the share of layers checkpointed; the rest keep every activation
  // (torchtitan's "selective layer" checkpointing, every n-th layer: 1 / n). 1: every layer.
  double full_recompute_share = 1.0;
  StateBytes state = kMixedPrecisionAdam;
  double activation_bytes = 2;      // bf16
  double bucket_bytes = 25e6;       // data-parallel gradient buckets, two in flight
  double workspace_bytes = 2.0 * (1 << 30);  // CUDA context, cuBLAS/NCCL workspaces (Playbook: 1-2 GB)
  // > 0: loom's own CUDA engine on a GPU of this many bytes (a `loom calibrate --device cuda`
  // profile): each rank's workspace is what that engine allocates (loom_cuda_workspace_bytes),
  // not workspace_bytes.
  double loom_cuda_device_memory = 0;
  bool flash_attention = true;      // false: the s x s scores are materialised (pre-2022 stacks)
  // A mixture-of-experts block's weights whole on every tp rank (loom's engine, as
  // TrainingJob::experts_whole_on_tp), not split over tp.
  bool experts_whole_on_tp = false;
  bool fp8_linear_inputs =
      false;  // FP8 recipe: Linear inputs saved in 1 byte (layer_activation_bytes)
  // The model's RMSNorms run as PyTorch ops rather than one fused kernel: LLaMA's reference
  // `self._norm(x.float()).type_as(x) * self.weight`, with `_norm(x) = x * torch.rsqrt(
  // x.pow(2).mean(-1, keepdim=True) + eps)` (facebookresearch/llama model.py). Autograd saves
  // the fp32 copy of the input (pow's and the multiply's operand, 4 bytes an element) and the
  // bf16 normalised rows before the weight (2), but not the bf16 input a fused kernel keeps
  // (2, counted in the stash: float()'s backward saves nothing): kUnfusedRmsNormSavedBytes = 4
  // an element of each of a layer's two norms more, wherever the layer keeps its activations.
  // Its HBM traffic is in time_model (kUnfusedRmsNormForwardBytes, ...BackwardBytes).
  bool unfused_rmsnorm = false;
  // Materialised attention as PyTorch ops (no fused scale-mask-softmax kernel), as LLaMA's
  // reference writes it: `scores = matmul(xq, keys^T) / sqrt(d); scores = scores + mask;
  // scores = softmax(scores.float(), dim=-1).type_as(xq); out = matmul(scores, values)`
  // (facebookresearch/llama model.py). Autograd saves the fp32 probabilities (softmax's output,
  // 4 bytes a score) and their bf16 copy (the second matmul's operand, 2): 6 bytes a score where
  // a fused kernel keeps 5 (Korthikanti et al.'s 5as/h: softmax output and dropout's mask and
  // output). Its HBM traffic, op by op, is in time_model.cpp (32 bytes a score forward, 36 back).
  // Only with flash_attention false.
  bool unfused_softmax = false;
  ActivationAccounting accounting = ActivationAccounting::Engine;
  SelectivePolicy selective = SelectivePolicy::AttentionCore;  // what Recompute::Selective keeps
  // TorchtitanOps without torch.compile: eager selective checkpointing keeps every output the
  // policy marks MUST_SAVE, w2's too (torchtitan_op_sac_layer_bytes).
  bool op_sac_eager = false;
  // Context parallelism's k|v travel as SDPA receives them, already repeated to the query heads
  // (torchtitan's model.py runs repeat_kv before F.scaled_dot_product_attention, and PyTorch's
  // context-parallel SDPA exchanges SDPA's own k|v): q_dim wide, not kv_dim.
  bool cp_gathers_repeated_kv = false;
  // Loss buffers on the last stage, bytes per logit of one micro-batch (tokens x V / tp): 0 for
  // loom's engine (a fused, vocabulary-chunked cross-entropy never holds the whole row).
  // PyTorch's unfused `cross_entropy(logits.float())` holds the bf16 logits (2), their fp32
  // copy (4) and the fp32 log-softmax it saves (4): 10; Megatron-LM's vocab-parallel
  // cross-entropy the bf16 logits (2) and the fp32 softmax it saves for backward (4): 6.
  // torchtitan (train.py at 9dec370) deletes the bf16 logits before backward, whose
  // log_softmax backward holds the saved fp32 log-softmax, its incoming fp32 gradient and the
  // fp32 gradient it writes: 12.
  double logits_bytes_per_element = 0;
  // Where > 0, the bytes per logit instead under tensor parallelism (tp > 1): torchtitan turns
  // on PyTorch's loss_parallel there (parallel_dims.py at 9dec370: loss_parallel_enabled is
  // tp > 1 and not disable_loss_parallel), whose log-softmax (torch/distributed/tensor/parallel/
  // loss.py, _log_softmax) computes on the fp32 copy through `shifted` and exp(shifted) into
  // its fp32 result, and whose backward (_nll_loss_and_log_softmax_backward) forms the gradient
  // as a zeros_like(x) buffer plus exp(x) times the incoming gradient beside the saved fp32
  // log-softmax: 16 bytes a logit at the peak, over the rank's V/tp shard.
  double logits_bytes_per_element_under_tp = 0;
  // The logits gathered over the tensor-parallel ranks before the loss, so each holds the whole
  // vocabulary's (tokens x V, not tokens x V / tp): Aleph-Alpha/scaling's lm_head.py, a
  // ColumnParallelLinear with parallel_output False (all_concat of the shards), then its
  // CrossEntropyLoss (losses/cross_entropy.py) on `output.activations.float()`. Its bytes per
  // logit at the peak, in backward: the gathered bf16 logits, which the pipeline keeps in its
  // PIPELINE_STAGE_OUTPUT buffer (`get`, not `take`, in _execute_loss_fn) until a later
  // micro-batch's forward overwrites it (2), log_softmax's saved fp32 output (4), nll_loss's fp32
  // gradient of it (4) and the fp32 gradient log_softmax's backward writes (4): 14 (forward's peak,
  // the bf16 logits, their fp32 copy and the log-softmax, is 10).
  bool logits_gathered_over_tp = false;
  // ZeRO-3 as FSDP2 runs it under torch.distributed.pipelining (torchtitan): with pp > 1 a
  // stage's parameters stay gathered from its first forward to its last backward
  // (reshard_after_forward = False "to avoid per-microbatch all-gathers", torchtitan
  // parallelize_llama.py apply_fsdp; the pipeline stage's backward_maybe_with_nosync sets
  // reshard_after_backward and requires_gradient_sync False until the last micro-batch), and
  // their gradients accumulate unsharded in the reduce dtype (FSDPParam.to_accumulated_grad_
  // if_needed upcasts to reduce_dtype, fp32 in torchtitan's mixed precision). So each rank also
  // holds its stage's parameters whole at job.state.parameter bytes and their gradients whole
  // at 4 bytes, over the sharded states; and its traffic is one gather and one reduce-scatter
  // per layer a step (time_model), not two gathers and one reduce-scatter per micro-batch.
  bool fsdp_gathered_under_pp = false;
  // Activation offloading (Megatron-Core's cpu_offloading_num_layers through Transformer
  // Engine's get_cpu_offload_context; Megatron-Core allows it at pp 1, without recomputation,
  // for fewer layers than the model has): this many of the layers copy their stash to host
  // memory during the forward, one after another on one stream, each freed by a window spread
  // over the forward's layers (TE's AsyncDoubleBufferGroupOffloadHandler), and reload them
  // during the backward; without double buffering (Megatron-Core's default
  // cpu_offloading_double_buffering = False) the peak holds the other layers' stashes. The
  // copies show in time_model only where all of them outlast the other layers' passes.
  // predict_gpu_memory and predict_step_time refuse it at pp > 1, vp > 1 or with recomputation.
  int64_t offloaded_layers = 0;
  // Layers per pipeline stage (pp x vp entries); empty: the engine's split (stage_layer_counts),
  // or with balanced_stages a tuned run's (balanced_stage_layers).
  std::vector<int64_t> stage_layers;
  // Uneven stages as a tuned run splits them (Megatron-Core's pipeline layouts, balanced against
  // the last stage's head and MTP depths), not as loom's engine does (the first stages one layer
  // more). The GPU presets' plans; a --profile plan of loom's engine keeps the engine's split.
  bool balanced_stages = false;
};

// The split the planner uses: job.stage_layers when given, else balanced_stage_layers with
// job.balanced_stages (`note`, where given, says which split it took; empty if even), else the
// engine's.
std::vector<int64_t> planner_stage_layers(const ModelConfig& model, const PlanLayout& layout,
                                          const GpuJob& job, std::string* note = nullptr);

// The last stage's work beyond its layers, in layers: the head's forward GEMM (2 h V FLOPs a
// token) once and again for each multi-token-prediction depth, and the depths themselves (a
// transformer layer each; a hybrid's attention and MLP blocks, two of its layers).
double last_stage_extra_layers(const ModelConfig& model, int64_t seq_len);

// Layers per stage for `stages` stages as a tuned run splits them; empty where they divide
// evenly. The slowest stage's work decides, the last stage's extra work
// (last_stage_extra_layers) counted: Llama 3's rule (sec. 3.3.2: "we reduce one Transformer
// layer each from the first and the last stages", which hold the embedding and the head;
// Megatron-Core's account_for_embedding/loss_in_pipeline_split) where n_layer + 2 divides and it
// paces as well as any; else the engine's (the first stages one layer more) where it does; else
// balanced: the last stage takes the layer count that makes the slowest stage fastest (the most
// such; none with MTP depths, which a stage can hold alone), the others share the rest, the
// short ones first (Megatron-Bridge's DeepSeek-V3 layouts, recipes/deepseek/deepseek_v3.py: 61
// layers and one MTP depth on 16 stages are "Et*4|(t*4|)*14tmL", 15 stages of 4 and a last of
// one layer, the depth and the loss; on 32, "Et|(tt|)*30mL": 1, 30 of 2, and a last stage of the
// depth and the loss alone). `note`, where given, says which split was taken.
std::vector<int64_t> balanced_stage_layers(const ModelConfig& model, int64_t stages,
                                           int64_t seq_len, std::string* note = nullptr);

// Micro-batch-chunks pipeline rank `rank` holds at its peak (forwarded, not yet backwarded),
// from the schedule's warm-up (Narayanan et al. 2021 sec. 2.2; Megatron-LM's
// forward_backward_pipelining_*): AFAB all m; 1F1B min(m, p - rank); interleaved
// min(m v, 2 (p - rank - 1) + (v - 1) p + 1).
int64_t chunks_in_flight(const PlanLayout& layout, int64_t micro_batches, int64_t rank);

// Bytes a split backward's B keeps for its W (kernels/weight_grads) per micro-batch of `rows`
// rows through a stage of `layers` dense blocks (plus the embedding's on the first stage and
// the final norm's on the last), one tp rank, activations of `bytes_per_element`: each
// weight-gradient op's output-gradient columns and input (an input shared by q|k|v or gate|up
// kept once) and a norm's statistics (f32). Mixture-of-experts layers keep what routing sends
// their experts, which no shape fixes: refused.
int64_t deferred_weight_grad_bytes(const ModelConfig& model, int64_t layers, bool first_stage, bool last_stage,
                                   int64_t rows, int64_t bytes_per_element);
// Memory of the most loaded pipeline rank: each rank's model states (the first also holds the
// embedding, the last the head) plus the activations it holds at its peak (the first stage
// holds the most micro-batches under 1F1B) plus, on the last, the loss buffers.
MemoryBreakdown predict_gpu_memory(const ModelConfig& model, const PlanLayout& layout, const GpuJob& job);
// One layer's stash for one micro-batch as predict_gpu_memory counts it (the source's
// accounting, recomputation and FP8 inputs included): what an offloaded layer moves each way.
double stashed_layer_bytes(const ModelConfig& model, const PlanLayout& layout, const GpuJob& job);
// Throws loom::Error unless job.offloaded_layers is 0, or 1 to n_layer - 1 at pp 1, one chunk and
// no recomputation.
void check_offloaded_layers(const ModelConfig& model, const PlanLayout& layout, const GpuJob& job);
// The host memory the offloaded layers take (one micro-batch's k stashes at pp 1: Megatron-Core
// brings them back during that micro-batch's backward), against host_memory_bytes_per_gpu.
double offloaded_host_bytes(const ModelConfig& model, const PlanLayout& layout, const GpuJob& job);

// The workspace loom's CUDA engine allocates on one rank of layout l (bytes): the blocks'
// gradient scratch (model/stash.cpp, make_block_grad_scratch) and the residual gradient
// (Transformer::set_batch), and on the last pipeline stage the head's d_hidden and the fused
// cross-entropy's buffers (kernels/cuda/cross_entropy.cu: a [rows, chunk padded to 16] logit
// chunk, f32, or bf16 with bf16 activations, where the logit gradient overwrites it, row
// statistics, and with bf16 activations an f32 d_hidden accumulator, each region aligned to 256
// bytes; the last chunk's weight rows padded
// to 16 when its width is not a multiple of 16; the targets, int32), its chunk as train_config's
// resolved_vocab_chunk picks it for a GPU of device_memory bytes (the whole vocabulary when
// the chunk's buffers fit in 1/16 of it). Under tensor parallelism the vocab-parallel loss
// (parallel/vocab_parallel.cpp): an f32 logit chunk over the rank's vocabulary shard and,
// with sp, the gathered hidden rows and their gradient. activation_bytes: 2 (bf16) or 4. The
// head's d_hidden is computed by the forward's fused loss and kept for the backward, so each of
// the rank's `head_sets` activation sets holds one (last_stage_activation_sets).
double loom_cuda_workspace_bytes(const ModelConfig& m, const PlanLayout& l, int64_t seq_len,
                                 double device_memory, double activation_bytes, bool last_stage,
                                 int64_t head_sets = 1);
// The vocabulary chunk loom's CUDA engine takes (train_config.cpp resolved_vocab_chunk) for a
// micro-batch of l.micro_batch x seq_len rows on a GPU of device_memory bytes.
int64_t loom_cuda_vocab_chunk(const ModelConfig& m, const PlanLayout& l, int64_t seq_len,
                              double device_memory, double activation_bytes);

// The CPU engine as built, exactly: bytes of parameters, gradients and optimizer state on one
// rank at their peak within a step (what the allocator's per-step peaks show), for `dp` ranks
// under ZeRO `stage` (stage ignored with one rank) with the engine's bucket size and flat
// padding; `bf16` adds the fp32 masters. Up to stage 1 that is what stays after the step;
// stages 2-3 add the full-size gradients they hold on the way (ZeroOptimizer's order replayed:
// the root's flats, the unit in hand and the one reduce-scatter left in flight) and stage 3 the
// gathered units (the root and two neighbouring blocks). Activations: what
// Transformer::forward allocates for (batch, seq_len) under `recompute`, on one rank of `tp`
// (heads and MLP columns divide by tp; with `sequence_parallel` the residual stream, norms and
// their outputs divide by tp too), holding seq_len / `cp` tokens of each sequence (context
// parallelism). Model states are tp rank 0's (its block of every split tensor, the largest).
// Under expert parallelism (`ep` dividing `dp`, which counts every replica of the dense
// parameters) a rank holds E / ep experts of each layer, in flats of their own over the
// dp / ep expert-data-parallel ranks. Its experts' activations hold the rows it received, which
// depend on the routing: k per token when the load is balanced, `moe_imbalance` (>= 1, the
// planner's --moe-imbalance: the busiest ep rank's rows over the mean) times that on the busiest.
MemoryBreakdown predict_engine_memory(const ModelConfig& model, int64_t dp, int stage,
                                      int64_t bucket_bytes, bool bf16, int64_t batch,
                                      int64_t seq_len, Recompute recompute, int64_t tp = 1,
                                      bool sequence_parallel = false, int64_t cp = 1,
                                      int64_t ep = 1, double moe_imbalance = 1.0);

// The same for the first pipeline rank of a layout with pp >= 2 (f32), any schedule and
// placement: the model states of its stages (its blocks, the embedding tables, and under the V
// placement the final norm and head) over dp x cp replicas under ZeRO, and its activations:
// rank 0's action list replayed through the engine's pool of activation sets (reused when idle,
// the last stage's extras added once per set), what selective or full recomputation keeps once,
// and under a split backward the copies its B's hold until their W's. `micro_batches` per step.
MemoryBreakdown predict_engine_pipeline_memory(const ModelConfig& model, const PlanLayout& layout,
                                               int64_t seq_len, int64_t micro_batches,
                                               int64_t bucket_bytes, double moe_imbalance = 1.0);

// How many activation sets the rank holding the last stage gives the last stage's extras (its
// final norm output and statistics, and the head's d_hidden) in a step of `micro_batches`: that
// rank's action list replayed through the engine's pool. 1 without a pipeline (one set, reused);
// under AFAB every micro-batch's, under 1F1B one.
int64_t last_stage_activation_sets(const ModelConfig& model, const PlanLayout& layout,
                                   int64_t micro_batches);

}  // namespace loom::plan
