#pragma once
// Checking the planner against training runs others have measured and published
// (published/public_runs.json, the schema of published/README.md). Each run is rebuilt as a
// model, a cluster and a layout; the planner predicts every figure the run measured in the
// source's own convention (sources count FLOPs and memory differently; see
// published_conventions.hpp), and compares. What a run leaves out is picked by a documented
// rule and named next to the prediction; a run that cannot be predicted is refused with the
// reason, and the others go on.
#include <optional>
#include <string>
#include <vector>

#include "loom/model/config.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/layout.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/published_conventions.hpp"

namespace loom::plan {

// What a run measured, one entry per figure.
enum class Figure {
  Mfu,                // model FLOPs utilisation (a fraction), in the source's FLOP count
  Hfu,                // hardware FLOPs utilisation, counting recomputation
  TflopsPerGpu,       // achieved TFLOP/s per GPU, in the source's FLOP count
  TokensPerSecond,    // tokens/s per GPU
  StepTime,           // seconds per optimizer step
  MemoryPerGpu,       // GB or GiB per GPU, as the source counts it (MemoryCount)
  ModelStates,        // the ZeRO paper's analytic model-state GB per GPU
  Fits,               // the out-of-memory verdict: 1 = ran, 0 = out of memory
  LayerForwardMs,     // one transformer layer's forward, ms
  LayerBackwardMs,    // one transformer layer's backward (with its recomputation), ms
  LargestModel,       // the largest model that fits, billions of parameters (a GPT of any size)
  StatesPerGpu,       // parameters + gradients + optimizer state on the most loaded GPU, GiB
  ActivationsPerGpu,  // the activations it holds at its peak, GiB
  AggregatePflops,    // every GPU's TFLOP/s together, PFLOP/s, in the source's FLOP count
  LayerFwdBwdMs,      // one transformer layer's forward and backward, ms
};
const char* figure_name(Figure figure);
enum class FigureClass { Rate, Memory, Verdict };  // how the summary groups errors
FigureClass figure_class(Figure figure);

struct Measured {
  Figure figure = Figure::Mfu;
  double value = 0;
  std::string convention;  // how the source counts it, printed next to the prediction
  int zero_stage = -1;     // LargestModel: the ZeRO stage it was measured at (-1: the layout's)
};

// What a run does not state, the planner enumerates (fastest layout that fits) or picks by a
// rule; these say which.
struct Unstated {
  bool micro_batch = false, vp = false, recompute = false;
  // No ZeRO stage stated or implied (fsdp text, a Megatron stack's distributed optimizer), with
  // data parallelism: 0 or 1, the faster that fits (ZeRO-1 moves plain dp's bytes, Rajbhandari
  // et al. 2020 sec. 7).
  bool zero = false;
  // Neither tp nor dp stated, only total_gpus: tp the faster of 1, 2, 4, 8 (within a node) that
  // fits, dp the rest; sequence parallelism follows tp where the record leaves it to the rule.
  bool tp = false;
  bool sp_follows_tp = false;
  // parallelism.ep null on a mixture of experts: the ep (dividing the experts and dp x cp) that
  // runs fastest and fits, as for the other unstated fields.
  bool ep = false;
  // parallelism.pp_schedule names an interleaved schedule but not V: V >= 2 (the fastest that
  // fits, else 2, the smallest interleaving).
  bool interleaved = false;
};

struct PublishedRun {
  std::string id, source, source_label;  // source_label: the short name the summary groups by
  std::string kind;
  bool uncertain = false;
  SourceConventions conventions;
  std::vector<Measured> measured;
  std::vector<std::string> assumptions;  // rules applied to fill what the source leaves out
  // Non-empty: the run cannot be predicted, and why. `malformed` says the file is at fault (a
  // field of the wrong type) rather than the source (a TPU, no model size).
  std::string refused;
  bool malformed = false;

  double params = 0;  // the parameter count the source states (its N), 0 when not stated
  ModelConfig model;
  ClusterSpec cluster;
  PlanLayout layout;
  Unstated unstated;
  // parallelism.pp_schedule naming a schedule other than (interleaved) 1F1B: DualPipe(V), ZB-H1,
  // ZB-V, GPipe / AFAB (run with the V that schedule takes); else 1F1B or interleaved by V.
  std::optional<PipelineSchedule> named_schedule;
  int64_t seq_len = 0, global_batch = 0;
  bool flash_attention = true;
  bool unfused_rmsnorm =
      false;  // GpuJob::unfused_rmsnorm: the record's kernel label names no norm kernel
  bool unfused_softmax = false;  // GpuJob::unfused_softmax: the label names PyTorch's attention
  // The fused attention kernel's rate over the 2023-24 one (TrainingJob::attention_kernel_speedup):
  // the source's convention, or what the record's notes name (FlashAttention v1: 0.5).
  double attention_kernel_speedup = 1.0;
  bool fp8 = false;
  bool fp4 = false;  // NVFP4 / MXFP4 linear layers (TrainingJob::fp4_gemms); fp8 is set too
  bool mx = false;   // MXFP8 linear layers (TrainingJob::mx_gemms); fp8 is set too
  // An FP8 run whose stated peak is the part's dense FP8 rate: its MFU is over that peak.
  bool stated_fp8_peak = false;
  // Under full recomputation, the share of layers checkpointed (GpuJob::full_recompute_share).
  double full_recompute_share = 1.0;
  // tp's collectives overlapped with the GEMMs (TrainingJob::tp_comm_overlap): the source's
  // convention, or the record's text naming Megatron's --tp-comm-overlap.
  bool tp_comm_overlap = false;
  // ZeRO-3 run by DeepSpeed (the record's parallelism text says so): its collectives are
  // modelled as the ZeRO++ paper describes them (TrainingJob::zero3_traffic).
  bool deepspeed_zero3 = false;
  // What "selective" recomputation keeps: torchtitan's per-op policy for its Llama runs.
  SelectivePolicy selective = SelectivePolicy::AttentionCore;
  bool op_sac_eager = false;  // GpuJob::op_sac_eager: no torch.compile named with the per-op policy
  double gradient_bytes = 2;  // per parameter: 4 where the stack accumulates gradients in fp32
  // Adam's master copy and moments per parameter before ZeRO's sharding (kMixedPrecisionAdam's
  // 4 + 8), or what the record's `optimizer.state_dtype` states: "bf16" keeps a bf16 copy and
  // bf16 moments (2 + 4), as apex's distributed_fused_adam does with dtype bf16.
  double master_bytes = 4, moment_bytes = 8;
  std::vector<int64_t> stage_layers;  // empty: even split (or the engine's)
  double moe_host_s_per_op = 0;       // TrainingJob::moe_host_s_per_op (host_issue.hpp)
  // TrainingJob::moe_dispatch_per_rank: DeepEP or HybridEP named.
  bool moe_dispatch_per_rank = false;
  bool frozen_base = false;  // TrainingJob::frozen_base: a LoRA (PEFT) fine-tuning run
};

// Reads a JSON array of runs. Throws loom::Error only for the file itself (unreadable, not
// JSON, not an array); a run with a missing or malformed field comes back refused, with a
// message naming its id and the field.
std::vector<PublishedRun> read_published_runs(const std::string& path);
// The same from the file's text; `name` is what error messages call it.
std::vector<PublishedRun> parse_published_runs(const std::string& text, const std::string& name);

struct FigureCheck {
  Measured measured;
  double predicted = 0;
  double relative_error = 0;  // predicted / published - 1 (verdicts: 0 right, 1 wrong)
};

struct RunCheck {
  const PublishedRun* run = nullptr;
  bool answered = false;
  PlanLayout layout;  // with the planner's picks for the unstated fields
  std::vector<FigureCheck> figures;
  std::vector<std::string> picks;  // what the planner chose for the unstated fields
  std::vector<std::string>
      notes;  // how a figure was converted, where the run's own numbers decided it
  double step_s = 0, tokens_per_s_per_gpu = 0;
  double allocated_gib = 0, reserved_gib = 0;  // predicted peak per GPU
  bool fits = true;
};

RunCheck check_published_run(const PublishedRun& run);

struct ErrorStats {
  int64_t count = 0;
  double median = 0, p90 = 0, worst = 0;  // of |relative error|
};
ErrorStats error_stats(std::vector<double> abs_errors);

struct SourceCoverage {
  std::string label;
  int64_t runs = 0, answered = 0;
  ErrorStats rates;  // the headline rate figure of each answered run
};

struct ValidationSummary {
  int64_t runs = 0, answered = 0, malformed = 0;
  // One headline rate figure per answered run (the first of MFU, HFU, TFLOP/s, tokens/s, step
  // time, layer times the run measured), so a run that states MFU, HFU and tokens/s, which
  // differ only by constants, counts once.
  ErrorStats rates;
  ErrorStats memory;
  int64_t verdicts = 0, verdicts_right = 0;
  std::vector<std::pair<std::string, ErrorStats>> by_figure;  // every figure of each kind
  std::vector<SourceCoverage> by_source;
};
ValidationSummary summarize(const std::vector<RunCheck>& checks);

}  // namespace loom::plan
