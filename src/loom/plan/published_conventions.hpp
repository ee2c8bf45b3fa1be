#pragma once
// How each source of published runs counts what it reports: FLOPs per token behind its MFU,
// HFU and TFLOP/s, what its memory figure holds, and what its training stack keeps per
// parameter. Matched from the run's `source` text, one table with a citation per row, so a
// prediction is made in the run's own convention (a 6N + 12Lhs MFU and a causal-halved
// TFLOP/s of the same step differ by 10%).
#include <string>

#include "loom/model/config.hpp"

namespace loom::plan {

enum class FlopCount {
  PaLM,                // 6N + 12 L h s per token (PaLM, Chowdhery et al. 2022, App. B)
  RecomputeHardware,   // PaLM plus the recomputed forward: full 8N + 16 L h s, selective 6N + 16 L h s
  NarayananEq3,        // 96 l h^2 (1 + s/6h + V/16lh) per token (Narayanan et al. 2021, eq. 3)
  KorthikantiModel,    // 72 L h^2 (1 + s/6h + V/12hL) (Korthikanti et al. 2022, sec. 6.3)
  KorthikantiHardware, // selective: 72 L h^2 (1 + s/3h + V/12hL); full adds a forward
  NonEmbeddingFull,    // 6 (blocks + head) + 12 L h s: the input embedding not counted
  NonEmbeddingCausal,  // 6 (blocks + head) + 6 L h s: causal attention counted once
};
const char* flop_count_name(FlopCount count);

// What a source's memory_per_gpu_gb holds.
enum class MemoryCount {
  Reserved,              // torch.cuda.max_memory_reserved: the caching allocator's peak, GiB
  StatesAndActivations,  // the transformer layers' model states plus activations by formula, GiB
};

struct SourceConventions {
  std::string label = "other";  // the short name the summary groups by
  FlopCount mfu = FlopCount::PaLM, hfu = FlopCount::RecomputeHardware, tflops = FlopCount::PaLM;
  MemoryCount memory = MemoryCount::Reserved;
  // Megatron-LM and the stacks built on it (NeMo, Megatron-Bridge): bf16 parameters with fp32
  // gradient buffers (18 bytes per parameter, 6 + 12/d with the distributed optimizer:
  // Megatron-LM docs/source/api-guide/dist_optimizer.md), the distributed optimizer (ZeRO-1
  // over dp) when a run does not say, and the vocab-parallel cross-entropy's 6 bytes per logit.
  bool megatron = false;
  // The stack trains a model's multi-token-prediction depths (ModelConfig::mtp_layers) where its
  // recipe has them: Megatron-Core (mtp_num_layers) and DeepSeek's own; not the Hugging Face-based
  // stacks (NeMo Automodel, torchtitan), whose DeepSeek-V3 rows count 249.7 GFLOP a token against
  // Megatron-Bridge's 260.
  bool trains_mtp = true;
  double logits_bytes_per_element = 10;  // PyTorch's cross_entropy(logits.float()), see GpuJob
  bool logits_gathered_over_tp = false;  // GpuJob::logits_gathered_over_tp
  double logits_bytes_under_tp = 0;      // GpuJob::logits_bytes_per_element_under_tp
  // "Selective" recomputation means torchtitan's per-op policy (SelectivePolicy::TorchtitanOps),
  // not Megatron's attention-core recomputation.
  bool per_op_selective = false;
  // The source's stack computed attention by materialising the s x s scores in HBM: its runs
  // predate FlashAttention (Dao et al., arXiv 2205.14135, May 2022) or ran on GPUs it does not
  // support. Used where a run does not state its attention.
  bool materialized_attention = false;
  // An FP8 run's MFU and HFU are over the FP8 tensor-core peak, not the BF16 one.
  bool fp8_mfu_over_fp8_peak = false;
  // torchtitan's pipeline defaults (9dec370, parallelisms/pipeline_llama.py and
  // pipelining_utils.py): a data-parallel rank's local batch is split into pp micro-batches
  // (pipeline_parallel_microbatches defaults to pipeline_parallel_degree), and a looped
  // (interleaved) schedule puts 2 stages on each rank when no split points are given.
  bool torchtitan_pipeline = false;
  // FSDP2 under torch.distributed.pipelining keeps a stage's parameters gathered and its
  // gradients unsharded across the micro-batches (GpuJob::fsdp_gathered_under_pp).
  bool fsdp_gathered_under_pp = false;
  // An unstated context-parallel exchange is torchtitan's default, an all-gather
  // (experimental.context_parallel_rotate_method = "allgather" in config_manager.py at 9dec370),
  // of k|v repeated to the query heads (GpuJob::cp_gathers_repeated_kv).
  bool cp_allgather_repeated_kv = false;
  // Why a run of it without a stated attention computed the scores in HBM.
  std::string materialized_why = "the source predates FlashAttention, May 2022";
  // Its stack's fused attention over the 2023-24 rate (TrainingJob::attention_kernel_speedup).
  double attention_kernel_speedup = 1.0;
  // Its recipes overlap tensor-parallel communication with the GEMMs (TrainingJob::
  // tp_comm_overlap): NeMo's (nemo/collections/llm/recipes/llama3_70b.py, gpt3_175b.py:
  // tp_comm_overlap=True with userbuffers configs for H100) and Megatron-Bridge's performance
  // recipes (perf_recipes/llama/h100/llama3.py: tp_comm_overlap_cfg userbuffers_*_h100_*_tp4).
  bool tp_comm_overlap = false;
  // Its framework synchronises data parallelism after the backward (TrainingJob::
  // dp_sync_after_backward).
  bool dp_sync_after_backward = false;
  // And reduces each column-parallel linear's input gradient apart (TrainingJob::
  // tp_reduce_per_column_linear).
  bool tp_reduce_per_column_linear = false;
  // What its sweeps ran where a record leaves it out: sequence parallelism off and one pipeline
  // chunk per rank (1F1B), not the planner's general guesses (on; the fastest interleaving).
  bool unstated_sp_off = false, unstated_pp_one_chunk = false;
  // Its runs predate selective recomputation (Korthikanti et al., May 2022): an unstated
  // recomputation is none or full.
  bool before_selective_recompute = false;
  std::string unstated_off_why = "the source's sweeps ran it as a separate ablation";
  std::string unstated_one_chunk_why = "the source's sweeps vary no interleaving";
  // A record's kernel label ("kernel: <label>" in its notes) names the fused RMSNorm kernel
  // where one ran ("flash_attention2 + RMS kernel"); under any other label the norms ran as
  // PyTorch ops (GpuJob::unfused_rmsnorm).
  bool kernel_label_names_norm = false;
  // The vocabulary its models ran with where a record states none (0: the preset's, or the
  // general guess), and why; and whether its MFU counts that model's own N rather than the
  // nominal size its records give as params_b ("13B" for a 14.0B model).
  int64_t unstated_vocab = 0;
  std::string unstated_vocab_why;
  bool mfu_counts_model_params = false;
  // Data parallelism without ZeRO fuses every gradient into one flattened fp32 buffer for its
  // all-reduce, 4 bytes a parameter beside the 16-bit gradients (the ZeRO paper, sec. 3.2, of
  // its Megatron-LM baseline: "a flattened fp32 buffer would require 6 GB" for 1.5B).
  bool fused_fp32_allreduce_buffer = false;
  // Its recipes train bf16 parameters with no fp32 copy, and a mixture of experts with
  // torch.optim.Adam, whose moments take the parameters' dtype (PublishedRun::master_bytes).
  bool bf16_parameters_no_master = false;
  // Its benchmark recipes checkpoint every block where a record leaves recomputation out.
  bool unstated_recompute_full = false;
  // Its recipes on Grace-Blackwell systems (GB200, GB300) under Megatron FSDP at pp 1 keep whole
  // layers' activations in the Grace CPU's memory instead of recomputing them (GpuJob::
  // offloaded_layers): Megatron-Bridge's scripts/performance/configs/llama3 and llama31
  // workload_base_configs.py at 25.11 (cpu_offloading_num_layers 20-40 of Llama 3 70B's 80
  // layers, 95 of Llama 3.1 405B's 126); an unstated recomputation may be this instead.
  bool grace_activation_offload = false;
  std::string where;                     // where the conventions were read
};
SourceConventions conventions_of_source(const std::string& source);

// The latest year from 2010 to 2039 that the text names as a word of its own ("Smith et al.
// 2021", "(SC '21)" is not read), or 0. arXiv numbers like 2104.04473 are not years.
int latest_year_named(const std::string& text);

// FLOPs per token of `count` for a model of `params` parameters (the source's N) at `seq`.
// Megatron-Bridge's FLOPs per token of a hybrid Mamba stack (training/utils/flop_utils.py,
// hybrid_flops at 067f987): 3x the forward of its attention (causal), Mamba-2 (in_proj, scan
// and out_proj, with d_inner taken as 2h), MLP and expert blocks, the MTP pattern's copies and
// the head once per depth.
double megatron_hybrid_flops_per_token(const ModelConfig& m, double seq);
double flops_per_token(FlopCount count, const ModelConfig& model, double params, double seq, Recompute recompute);

}  // namespace loom::plan
