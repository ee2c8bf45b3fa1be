#pragma once
// Step time of one layout on a cluster: compute from FLOPs at a GEMM-shape-dependent
// efficiency, plus memory-bound work at HBM bandwidth; communication from the alpha-beta
// model of each collective on the links its group spans; what overlaps what; and the pipeline
// bubble from simulating the schedule's own action lists.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/model/config.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/layout.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/wire_bytes.hpp"

namespace loom::plan {

struct GemmGrid;

// How close a GPU gets to its datasheet peak on large bf16 GEMMs, and how fast that falls for
// small dimensions: efficiency(m, n, k) = peak_fraction x prod_d d / (d + half_dim). Defaults
// per GPU family; `calibrate` replaces them from measured kernel timings. A machine profile also
// carries its timings' grid (`measured`): then a shape inside it takes the measured efficiency,
// interpolated, and one outside it the nearest grid point's times the curve's ratio between the
// two. The curve alone missed single shapes by 5-18% on a CPU, whose rate dips where a
// weight outgrows a cache level (4096-wide outputs) and at narrow inner dimensions.
struct GemmEfficiency {
  double peak_fraction = 0.75;
  double half_dim = 128;
  std::shared_ptr<const GemmGrid> measured = nullptr;
  double efficiency(double m, double n, double k) const;
  double curve(double m, double n, double k) const;  // the two-number curve alone
};
GemmEfficiency default_gemm_efficiency(const GpuSpec& gpu);
// A part's sustained share of its peak against the H100's (GpuSpec::mamf_share).
double sustained_share(const GpuSpec& gpu);

// One timed product C[m, n] = A[m, k] B[k, n]: 2 m n k FLOPs in `seconds`.
struct GemmTiming {
  double m = 0, n = 0, k = 0, seconds = 0;
};

// Timings that cover every (m, n, k) of their sizes (`loom calibrate`'s are such a grid): the
// log of the efficiency at each point, the point's timings averaged in time (calibrate keeps a
// forward and a backward per shape). `at` interpolates it linearly in log m, log n, log k,
// each coordinate clamped to its axis.
struct GemmGrid {
  std::vector<double> m, n, k;         // each axis's sizes, ascending
  std::vector<double> log_efficiency;  // [m][n][k]
  double at(double m, double n, double k) const;
};

// How ZeRO-3's per-layer parameter gathers and gradient reduce-scatters travel.
// Hierarchical: NCCL's collectives as the topology allows (NVLink inside a node, then each
// GPU's NIC carrying 1/gpus_per_node of the cross-node bytes: FSDP, Megatron FSDP).
// DeepSpeed: ZeRO-3 as the ZeRO++ paper (Wang et al. 2023, arXiv 2306.10209, sec. 3) and MiCS
// (Zhang et al. 2022, arXiv 2205.00119, sec. 2) describe it: each collective spans every data-
// parallel rank and each GPU's full share of it crosses the network over its own link (no
// node-level aggregation), and with activation checkpointing the recomputed forward gathers
// the parameters again (they are released after each forward), so a step moves 3M per micro-
// batch (forward, recompute and backward all-gathers) plus M for the reduce-scatter, M the
// model's 16-bit bytes; the gradients are reduced in 16 bits (ZeRO paper sec. 7.2.2's M).
enum class Zero3Traffic { Hierarchical, DeepSpeed };

// loom's CPU engine training FP8 (train.precision = "fp8": model/fp8_linear.hpp): its GEMMs stay
// f32 and run on operands quantised to FP8 and back, so FP8 costs that engine its quantisations,
// each at a rate `loom calibrate` measured (seconds per element, Fp8Linear::quantize's work: a
// workspace tensor, the amax or amaxes, the rounding): one scale per tensor (the delayed and
// current recipes), 1 x 128 tiles along a row, 128 x 1 tiles down a column, 128 x 128 blocks
// (the blockwise recipe's activations and output gradients, their transposed copies for the
// weight gradient, and weights). Zero: not measured.
struct Fp8QuantizeRates {
  double tensor_s = 0, row_tiles_s = 0, column_tiles_s = 0, blocks_s = 0;
  bool measured() const {
    return tensor_s > 0 && row_tiles_s > 0 && column_tiles_s > 0 && blocks_s > 0;
  }
};
enum class EngineFp8Recipe { Off, Delayed, Current, Blockwise };
struct EngineFp8 {
  EngineFp8Recipe recipe = EngineFp8Recipe::Off;
  Fp8QuantizeRates rates;
};

struct TrainingJob {
  int64_t seq_len = 4096;
  int64_t global_batch = 512;  // sequences per optimizer step
  GpuJob memory;               // precision sizes, workspace allowance, stage split (seq_len is copied in)
  std::optional<GemmEfficiency> gemm;  // replaces default_gemm_efficiency (calibration)
  // Measured attention (a machine profile): the core's two matmuls as GEMMs of (tokens, mean
  // keys, head_dim) per head at these efficiencies of the peak, backward in the forward's FLOPs.
  // Unset: forward at the GEMM efficiency, backward twice the forward.
  std::optional<GemmEfficiency> attention_forward, attention_backward;
  // loom's CUDA engine: the attention timings the profile measured (GemmTiming per head and per
  // matmul: tokens, mean keys, head_dim). Where one was measured at the layer's head_dim the
  // efficiency is read from them (log-linear in the keys between two, the nearest beyond them;
  // the fit above scales it to other token counts), else the fit alone.
  std::vector<GemmTiming> attention_forward_timings, attention_backward_timings;
  // loom's CUDA engine (memory.loom_cuda_device_memory > 0, a `loom calibrate --device cuda`
  // profile): the rate of its plain streaming kernels (ProfileEntry::stream_bytes_per_s), at
  // which its residual-gradient adds, attention's row dots, RoPE, SwiGLU, the loss's passes over
  // the logits and AdamW are charged; its norms at the GPU's hbm_bandwidth_bytes_per_s (the
  // profile's memory_bytes_per_s). 0: the GPU's bandwidth for all.
  double stream_bytes_per_s = 0;
  // Fused attention kernels this much faster than fused_attention_efficiency's rate, which
  // 2023-24 PyTorch stacks set (FlashAttention-2, Triton): FlashAttention-3 and cuDNN 9's fused
  // attention run 1.5-2.0x FlashAttention-2 on an H100 (Shah et al. 2024, "FlashAttention-3",
  // Fig. 5-7); FlashAttention v1 half of v2 (Dao 2023). 1 unless a source's stack says otherwise.
  double attention_kernel_speedup = 1.0;
  // Tensor-parallel communication overlapped with the GEMMs it feeds and follows (Megatron-LM /
  // Transformer Engine's userbuffers, `tp_comm_overlap`; Wang et al. 2022, "Overlap communication
  // with dependent computation via decomposition"): each all-gather and reduce-scatter is cut into
  // chunks pipelined against its GEMM. Only under sequence parallelism (Megatron-LM asserts it).
  // Off: exposed in full, as Megatron-LM's default.
  bool tp_comm_overlap = false;
  // Megatron-LM's asynchronous tensor-parallel backward (megatron/core/tensor_parallel/layers.py,
  // LinearWithGradAccumulationAndAsyncCommunication; on by default since 2022): a column-parallel
  // linear's input-gradient all-reduce (under sequence parallelism its reduce-scatter, and the
  // all-gather of its input that the weight gradient needs) runs while that linear's own
  // weight- and input-gradient GEMMs do, so only what outlasts them is exposed. tp_comm_overlap,
  // where set, supersedes it.
  bool tp_async_backward = false;
  // FP8 GEMMs (Transformer Engine's recipe: the linear layers in FP8 at the GPU's FP8 peak,
  // attention and everything memory-bound in BF16, each GEMM input and output gradient cast to
  // FP8 once: a 2-byte read and a 1-byte write per element). Needs gpu.fp8_tflops > 0.
  bool fp8_gemms = false;
  // FP4 GEMMs (Transformer Engine's NVFP4 recipe, Blackwell: E2M1 with an E4M3 scale per 16
  // elements): the linear layers' forward, input-gradient and weight-gradient GEMMs at a fitted
  // share of the GPU's FP4 peak (kNvfp4GemmRateShare, layer_cost.cpp), everything else as under
  // fp8_gemms (set both). Needs gpu.fp4_tflops > 0.
  bool fp4_gemms = false;
  // MXFP8 GEMMs (Transformer Engine's MXFP8 recipe, Blackwell: an E8M0 scale per 32 elements):
  // fp8_gemms at the block-scaled kernels' measured rate, kMxfp8GemmRate of per-tensor FP8's
  // (layer_cost.cpp). Set with fp8_gemms, not with fp4_gemms; needs gpu.fp4_tflops > 0 (the
  // parts with block-scaled tensor cores).
  bool mx_gemms = false;
  Zero3Traffic zero3_traffic = Zero3Traffic::Hierarchical;
  // Data parallelism synchronised in the optimizer step, after the whole backward: under ZeRO
  // stage 0-2 one all-reduce of every gradient in fp32 (16-bit gradients up-cast first), and
  // under stage 1-2 an all-gather of the updated 16-bit parameters after the update, none of it
  // overlapped with compute. Aleph Alpha's framework, which ran Hagemann et al.'s sweeps (its
  // open-source successor Aleph-Alpha/scaling, same config names: optimizer.py step() calls
  // allreduce_gradients, allreduce.py allreduce_tensor_in_float32; parameter_group.py
  // step_sequel all-gathers the owned partitions).
  bool dp_sync_after_backward = false;
  // Each column-parallel linear all-reduces its own input gradient in backward (the same
  // framework: ColumnParallelLinear's copy_to_tensor_model_parallel_region, one per linear), and
  // a SwiGLU MLP's gate and up projections are two linears (scaling's mlp.py: dense_in and
  // siglu_weight): without sequence parallelism a Llama layer's backward makes three
  // all-reduces of [tokens, h], not Megatron-LM's two (its gate and up are one linear).
  bool tp_reduce_per_column_linear = false;
  // Mixture-of-experts load imbalance under expert parallelism: the routed rows the busiest ep
  // rank computes and receives over the mean (1: balanced, as aux-loss or loss-free balancing
  // aims for and force-balanced benchmarks run). The step waits for that rank, so its expert
  // GEMMs and its share of the dispatch and combine all-to-alls scale by it. A capacity factor
  // c drops rows past c x the mean per expert, so the factor is capped at c (Switch
  // Transformer, Fedus et al. 2021, sec. 2.2). `loom train` logs the engine's per-expert
  // figure, moe_load_max_over_mean, which bounds the per-rank one.
  double moe_imbalance = 1.0;
  // Host seconds per operation where the host paces each MoE layer (host_issue.hpp: Megatron-
  // Core's dropless dispatch waits for the token counts, then the host issues the layer's
  // operations one by one): a layer pass takes no less than its operations' issue time. 0: off.
  double moe_host_s_per_op = 0;
  // The dispatcher sends a token once to each rank that holds any of its experts, and that rank
  // combines its experts' outputs before sending one row back (DeepEP, deepseek-ai/DeepEP:
  // get_dispatch_layout's is_token_in_rank; Megatron-Core's flex dispatcher and HybridEP alike),
  // not once per chosen expert as an all-to-all of permuted rows does (Megatron-Core's
  // alltoall dispatcher). Under balanced routing a token meets ep (1 - C(E - E/ep, k) / C(E, k))
  // distinct ranks of its k experts (moe_dispatch_copies).
  bool moe_dispatch_per_rank = false;
  // Fine-tuning with the base model's weights frozen, as LoRA trains (Hu et al. 2021, "LoRA:
  // Low-Rank Adaptation of Large Language Models", sec. 4): backward computes input gradients
  // only (every Linear's and the head's weight-gradient GEMM dropped, the split backward's W
  // empty), no gradient is reduced over data parallelism and no optimizer steps the base; ZeRO-3
  // still gathers it. The adapters (rank r << h) are not counted: their GEMMs, gradients and
  // state are r / h of a Linear's.
  bool frozen_base = false;
  // Under tp a mixture-of-experts layer's experts run whole on every tp rank, as loom's engine
  // runs them (model/moe: without sequence parallelism each tp rank puts the micro-batch's rows
  // through them and dispatches them under ep; with it, its own rows), not split over tp as
  // Megatron-Core's expert tensor parallelism does by default (expert_tensor_parallel_size = tp).
  // Set for loom's own engine (profiled_machine).
  bool experts_whole_on_tp = false;
  // loom's CPU engine in FP8 (`loom plan --precision fp8 --profile`): the quantisations its FP8
  // linear layers make (engine_fp8.hpp); recipe Off otherwise.
  EngineFp8 engine_fp8;
};

// Rows each token sends through the dispatch all-to-all under expert parallelism `ep`: its k
// chosen experts, or with job.moe_dispatch_per_rank the distinct ranks that hold them.
double moe_dispatch_copies(const ModelConfig& model, int64_t ep, const TrainingJob& job);
// Of `groups` equal groups of a model's experts, how many hold at least one of a token's k
// experts under balanced routing: groups (1 - C(E - E/groups, k) / C(E, k)).
double expert_groups_hit(const ModelConfig& model, int64_t groups);

// The load imbalance the time model applies: job.moe_imbalance, capped at the model's capacity
// factor when it has one. Throws loom::Error for a value below 1 or not finite.
double moe_imbalance_of(const ModelConfig& model, const TrainingJob& job);

// One transformer layer, one micro-batch: forward and backward time on a rank, including the
// recomputation the layout asks for and the tensor-parallel collectives it waits for (the
// figure Korthikanti et al. 2022 Table 4 measures).
struct LayerTime {
  double forward_s = 0, backward_s = 0;
};
LayerTime predict_layer_time(const ModelConfig& model, const PlanLayout& layout, const ClusterSpec& cluster,
                             const TrainingJob& job);

// Fused (flash-style) attention's share of the dense peak on `gpu`, for `keys` keys per query on
// average and heads of `head_dim`. FlashAttention's backward recomputes the scores: 5 matmuls
// to the forward's 2, 2.5x its FLOPs (Dao 2023, sec. 3.1.2).
// `kernel_speedup` scales the rate (TrainingJob::attention_kernel_speedup): above 1 for stacks
// with FlashAttention-3-class kernels, 0.5 for FlashAttention v1.
double fused_attention_efficiency(const GpuSpec& gpu, double keys, double head_dim, double kernel_speedup = 1.0);
constexpr double kFusedAttentionBackwardFlops = 2.5;

struct StepTime {
  double compute_s = 0;          // one pipeline rank's forward + backward work of the whole step, no bubble
  double exposed_comm_s = 0;     // communication not hidden behind compute (tp, cp, dp, ZeRO)
  double bubble_s = 0;           // pipeline idle time on the critical rank
  double optimizer_s = 0;        // AdamW over this rank's shard (memory-bound)
  double total_s = 0;
  double tokens_per_s = 0;       // whole job
  double mfu = 0;                // model FLOPs (flops.hpp) over gpus x dense bf16 peak
  double tp_comm_s = 0, dp_comm_s = 0, cp_comm_s = 0, pp_comm_s = 0, ep_comm_s = 0;  // totals before overlap
  double offload_s =
      0;  // activation offloading's host-link copies not hidden by compute (in exposed_comm_s)
  int64_t micro_batches = 0;
  // What the pipeline simulation ran with, so a caller can redraw the timeline: one chunk's
  // forward and backward time per micro-batch, and one activation transfer between stages.
  double chunk_forward_s = 0, chunk_backward_s = 0, p2p_s = 0;
};

// Throws loom::Error when the global batch does not split into dp x micro_batch sequences.
// `simulate` false replaces the pipeline simulation by the closed form (m v + p - 1)(t_f + t_b)
// (Narayanan et al. 2021), which the search uses to rank before simulating its best.
StepTime predict_step_time(const ModelConfig& model, const PlanLayout& layout, const ClusterSpec& cluster,
                           const TrainingJob& job, bool simulate = true);

// loom's CUDA engine's memory-bound kernels of one layer (forward and backward, one micro-batch):
// its norms' bytes at norm_bytes_per_s, its streaming kernels' at job.stream_bytes_per_s
// (kernel_rates.cpp counts what each kernel reads and writes).
double loom_cuda_layer_memory_s(const ModelConfig& m, const PlanLayout& l, const TrainingJob& job,
                                double norm_bytes_per_s);
// job.stream_bytes_per_s, or `otherwise` (the GPU's bandwidth) where no profile measured one.
double streaming_rate(const TrainingJob& job, double otherwise);

}  // namespace loom::plan
