#include "loom/plan/memory_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "loom/core/error.hpp"
#include "loom/model/config.hpp"
#include "loom/model/flops.hpp"
#include "loom/model/parameter_specs.hpp"
#include "loom/model/pipeline_layout.hpp"
#include "loom/model/stage_placement.hpp"
#include "loom/parallel/gradient_buckets.hpp"
#include "loom/plan/layer_elements.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/plan/rank_parameters.hpp"

namespace loom::plan {

MemoryBreakdown zero_model_states(double params, const StateBytes& bytes, int64_t dp, int stage) {
  if (dp < 1 || stage < 0 || stage > 3) throw_error("ZeRO: dp ", dp, " stage ", stage, " is not a valid layout");
  const double n = static_cast<double>(dp);
  MemoryBreakdown m;
  m.parameters = params * bytes.parameter / (stage >= 3 ? n : 1.0);
  m.gradients = params * bytes.gradient / (stage >= 2 ? n : 1.0);
  m.optimizer_state = params * (bytes.master + bytes.moments) / (stage >= 1 ? n : 1.0);
  return m;
}

namespace {

// One block: its input and pre-norm output (and the norm's statistics), and its mixer's stash.
// A transformer layer is two: an attention block ('*') and an MLP or expert block ('-', 'E');
// a hybrid Mamba stack's layers are one each ('M' too).
//   - Attention keeps q|k|v, and its output and log-sum-exp (dropped by selective).
//   - An MLP keeps its pre-activation (SwiGLU: gate | up) and its activation (dropped by
//   selective).
//   - A mixture of experts runs each token through k experts: k copies of the MLP interior, the k
//     dispatched copies of its input and the k expert outputs the combine's backward reads, the
//     router's logits and probabilities over the experts, and the k routing weights (model/moe's
//     MoeStash); shared experts add one always-on MLP of n_shared x f. A squared-ReLU expert
//     applies its routing weight inside the activation (Megatron-Core's fused weighted squared
//     ReLU, which Nemotron 3 sets), so its backward reads the saved pre-activation, not the k
//     outputs; a latent MoE dispatches latent-wide copies between its two projections.
//   - A Mamba-2 mixer (Megatron-LM's MambaMixer on mamba_ssm's fused path,
//     mamba_split_conv1d_scan_combined, which saves zxbcdt and out_x and recomputes the
//     convolution and the chunk states in backward) keeps in_proj's output (z|x|B|C|dt), the
//     scan's output and out_proj's input: none of it dropped by selective recomputation.
LayerElements block_elements(const ModelConfig& m, char kind) {
  const double h = static_cast<double>(m.n_embd);
  const double norm_stats = m.arch == Architecture::GPT2 ? 2 : 1;  // LayerNorm: mean and rstd
  LayerElements e{};
  e.replicated_by_tp = h /*input*/ + h + norm_stats /*the norm's output and statistics*/;
  e.linear_replicated = h;
  const double f = static_cast<double>(kind == 'E' ? m.expert_ffn() : m.ffn_hidden);
  const double pre =
      m.arch == Architecture::GPT2 || m.squared_relu_mlp ? f : 2 * f;  // SwiGLU: gate | up
  switch (kind) {
    case 'M': {
      const double inner = static_cast<double>(m.mamba_inner());
      e.split_by_tp = static_cast<double>(m.mamba_in_proj()) + 2 * inner;
      e.linear_split = inner;
      break;
    }
    case '*': {
      const double q = static_cast<double>(m.q_dim());  // q and the attention output
      e.split_by_tp = q + 2.0 * static_cast<double>(m.kv_dim());
      e.recomputable = q + static_cast<double>(m.n_head);
      e.linear_recomputable = q;
      break;
    }
    case '-':
      e.split_by_tp = pre;
      e.recomputable = f;
      e.linear_recomputable = f;
      break;
    default: {  // 'E'
      const double k = static_cast<double>(m.experts_per_token);
      const double width = m.moe_latent > 0 ? static_cast<double>(m.moe_latent) : h;
      const double shared = static_cast<double>(m.n_shared_experts);
      const double copies = m.squared_relu_mlp ? 1 : 2;
      e.split_by_tp = k * pre + copies * k * width + 2 * static_cast<double>(m.n_experts) + k +
                      shared * (pre + f) + (m.moe_latent > 0 ? 2 * width : 0);
      e.recomputable = k * f;
      e.linear_recomputable = k * f;
      // The dispatched copies are the experts' first GEMM's input (1 byte under FP8); counted so
      // for hybrids, whose presets came with it, not yet for a transformer's experts.
      if (m.is_hybrid()) e.linear_split = k * width;
      break;
    }
  }
  return e;
}

LayerElements operator+(const LayerElements& a, const LayerElements& b) {
  return {a.replicated_by_tp + b.replicated_by_tp,
          a.split_by_tp + b.split_by_tp,
          a.recomputable + b.recomputable,
          a.linear_replicated + b.linear_replicated,
          a.linear_recomputable + b.linear_recomputable,
          a.linear_split + b.linear_split};
}

}  // namespace

LayerElements layer_elements_of(const ModelConfig& m, bool moe_layer) {
  return block_elements(m, '*') + block_elements(m, moe_layer ? 'E' : '-');
}

// The mean layer: dense and mixture-of-experts layers weighted by their counts, a hybrid's blocks
// by theirs (exact for the whole model; a pipeline stage's mix may differ from the mean).
namespace {

LayerElements layer_elements(const ModelConfig& m) {
  if (m.is_hybrid()) {
    LayerElements mean{};
    const double n = static_cast<double>(m.n_layer);
    for (const char kind : m.hybrid_pattern) {
      const LayerElements e = block_elements(m, kind);
      mean.replicated_by_tp += e.replicated_by_tp / n;
      mean.split_by_tp += e.split_by_tp / n;
      mean.recomputable += e.recomputable / n;
      mean.linear_replicated += e.linear_replicated / n;
      mean.linear_recomputable += e.linear_recomputable / n;
      mean.linear_split += e.linear_split / n;
    }
    return mean;
  }
  const double moe = static_cast<double>(m.moe_layer_count()) / static_cast<double>(m.n_layer);
  if (moe == 0 || moe == 1) return layer_elements_of(m, moe == 1);
  const LayerElements a = layer_elements_of(m, true), b = layer_elements_of(m, false);
  return {moe * a.replicated_by_tp + (1 - moe) * b.replicated_by_tp,
          moe * a.split_by_tp + (1 - moe) * b.split_by_tp,
          moe * a.recomputable + (1 - moe) * b.recomputable,
          moe * a.linear_replicated + (1 - moe) * b.linear_replicated,
          moe * a.linear_recomputable + (1 - moe) * b.linear_recomputable};
}

}  // namespace

// Korthikanti et al. 2022, eqs. 1-6 (16-bit: 2 bytes per element, 1 per dropout mask).
double korthikanti_layer_bytes(const ModelConfig& m, int64_t micro_batch, int64_t seq_len,
                               const PlanLayout& l, bool flash_attention, bool fp8_linear_inputs) {
  const double sbh = static_cast<double>(micro_batch) * static_cast<double>(seq_len) / static_cast<double>(l.cp) *
                     static_cast<double>(m.n_embd);
  const double t = static_cast<double>(l.tp), h = static_cast<double>(m.n_embd);
  if (l.recompute == Recompute::Full) return 2 * sbh / (l.sequence_parallel ? t : 1.0);
  const double split = 8 + 4 * static_cast<double>(m.ffn_hidden) / h;  // 24 for f = 4h
  double per = (l.sequence_parallel ? 10 / t : 10.0) + split / t;
  if (l.recompute == Recompute::None && !flash_attention)
    per += 5 * static_cast<double>(m.n_head) * static_cast<double>(seq_len) / (h * t);
  // FP8: the Linear inputs (q|k|v and MLP inputs, 2 sbh each, replicated without SP; the
  // attention output, 2 sbh, and the MLP activation, 2 sbf, split by t) saved in 1 byte.
  if (fp8_linear_inputs)
    per -= 2 / (l.sequence_parallel ? t : 1.0) + (1 + static_cast<double>(m.ffn_hidden) / h) / t;
  return sbh * per;
}

double layer_activation_bytes(const ModelConfig& m, int64_t micro_batch, int64_t seq_len,
                              const PlanLayout& l, double bytes_per_element, bool flash_attention,
                              bool fp8_linear_inputs) {
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len) / static_cast<double>(l.cp);
  const double t = static_cast<double>(l.tp);
  const LayerElements e = layer_elements(m);
  if (l.recompute == Recompute::Full) return tokens * static_cast<double>(m.n_embd) / (l.sequence_parallel ? t : 1.0) * bytes_per_element;
  double per_token = e.replicated_by_tp / (l.sequence_parallel ? t : 1.0) + e.split_by_tp / t;
  if (l.recompute == Recompute::None) per_token += e.recomputable / t;
  double bytes = tokens * per_token * bytes_per_element;
  if (fp8_linear_inputs) {  // those elements at 1 byte instead of bytes_per_element
    double linear = e.linear_replicated / (l.sequence_parallel ? t : 1.0) + e.linear_split / t;
    if (l.recompute == Recompute::None) linear += e.linear_recomputable / t;
    bytes -= tokens * linear * (bytes_per_element - 1);
  }
  if (!flash_attention && l.recompute == Recompute::None)
    bytes += tokens * 5 * static_cast<double>(m.n_head) / t * static_cast<double>(seq_len) *
             static_cast<double>(m.attention_layer_count()) /
             static_cast<double>(m.n_layer);  // a hybrid's attention blocks
  return bytes;
}

double torchtitan_op_sac_layer_bytes(const ModelConfig& m, int64_t micro_batch, int64_t seq_len,
                                     const PlanLayout& l, double bytes_per_element, bool eager) {
  if (m.arch != Architecture::Llama || m.moe_layer_count() > 0 || m.is_hybrid() ||
      m.squared_relu_mlp)
    throw_error("torchtitan's per-op selective recomputation counts a dense Llama block's 7 matmuls; ",
                architecture_name(m.arch), m.moe_layer_count() > 0 ? " with experts" : "", " is not one");
  const double tokens =
      static_cast<double>(micro_batch) * static_cast<double>(seq_len) / static_cast<double>(l.cp);
  const double t = static_cast<double>(l.tp), h = static_cast<double>(m.n_embd);
  const double q = static_cast<double>(m.n_head * m.head_dim()),
               kv = static_cast<double>(m.kv_dim());
  const double f = static_cast<double>(m.ffn_hidden);
  const double block_input = h / (l.sequence_parallel ? t : 1.0);
  double interior = q /*wq*/ + kv /*wv*/ + q /*SDPA output*/ + f /*w1*/;
  if (l.tp > 1 && l.sequence_parallel)
    interior += h;                       // wo's reduce_scatter output: the mid residual's input
  constexpr double kLogSumExpBytes = 4;  // fp32, one per head and token
  // Eager: w2's mm output (the whole h, a partial sum under tp) and its reduce_scatter's.
  const double w2 = eager ? h + (l.tp > 1 && l.sequence_parallel ? h / t : 0.0) : 0.0;
  return tokens * ((block_input + interior / t + w2) * bytes_per_element +
                   static_cast<double>(m.n_head) / t * kLogSumExpBytes);
}

double layers_in_flight(const ModelConfig& m, const PlanLayout& l, int64_t micro_batches) {
  // Uneven stages: the first stages take the extra layers (stage_layer_counts), so the first
  // rank stashes as if every stage had as many.
  const int64_t stages = l.pp * l.vp, stage_layers = (m.n_layer + stages - 1) / stages;
  const double layers = static_cast<double>(stage_layers * stages), p = static_cast<double>(l.pp);
  const double mb = static_cast<double>(micro_batches), v = static_cast<double>(l.vp);
  switch (l.schedule) {
    case PipelineSchedule::AllForwardAllBackward: return layers / p * mb;
    case PipelineSchedule::OneFOneB: return layers / p * std::min(mb, p);
    // Every rank keeps up to p micro-batches between F and W: the first rank's 1F1B peak (the
    // held-back W's keep copies of what they read rather than the whole stash, counted as the
    // stash here: an upper bound).
    case PipelineSchedule::ZeroBubbleH1: return layers / p * std::min(mb, p);
    // ZB-V keeps 2p chunk passes (half a rank's layers each) between F and W on every rank:
    // p micro-batches of its layers, 1F1B's first-rank peak (Qi et al. 2024 sec 3).
    case PipelineSchedule::ZeroBubbleV: return layers / p * std::min(mb, p);
    // DualPipeV's steady state forwards one more chunk before each whole backward: 2p + 1.
    case PipelineSchedule::DualPipeV: return layers / p * std::min(mb, p + 0.5);
    case PipelineSchedule::Interleaved:
      return mb >= p ? layers * (1.0 + (p - 1.0) / (p * v)) : layers / p * mb;
  }
  return layers;
}

std::vector<int64_t> planner_stage_layers(const ModelConfig& m, const PlanLayout& l,
                                          const GpuJob& job, std::string* note) {
  if (!job.stage_layers.empty()) {
    if (static_cast<int64_t>(job.stage_layers.size()) != l.pp * l.vp)
      throw_error("planner: ", job.stage_layers.size(), " stage layer counts for pp x vp = ", l.pp * l.vp, " stages");
    return job.stage_layers;
  }
  if (job.balanced_stages && m.n_layer >= l.pp * l.vp) {
    std::vector<int64_t> split = balanced_stage_layers(m, l.pp * l.vp, job.seq_len, note);
    if (!split.empty()) return split;
  }
  return stage_layer_counts(m.n_layer, l.pp * l.vp);
}

double last_stage_extra_layers(const ModelConfig& m, int64_t seq_len) {
  const double head = 2 * static_cast<double>(m.n_embd) * static_cast<double>(m.vocab_size);
  const double layer = (flops_per_token(m, seq_len) / 3 - head) / static_cast<double>(m.n_layer);
  const double depths = static_cast<double>(m.mtp_layers);
  return depths * (m.is_hybrid() ? 2 : 1) + (1 + depths) * head / layer;
}

std::vector<int64_t> balanced_stage_layers(const ModelConfig& m, int64_t stages, int64_t seq_len,
                                           std::string* note) {
  const int64_t layers = m.n_layer;
  if (layers % stages == 0 || stages <= 1 || stages > layers + 2) return {};
  const double extra = last_stage_extra_layers(m, seq_len);
  // The last stage's load against the fullest other stage's.
  auto slowest = [&](const std::vector<int64_t>& split) {
    const int64_t others = *std::max_element(split.begin(), split.end() - 1);
    return std::max(static_cast<double>(others), static_cast<double>(split.back()) + extra);
  };
  std::vector<int64_t> llama;
  if ((layers + 2) % stages == 0) {
    llama.assign(static_cast<size_t>(stages), (layers + 2) / stages);
    --llama.front();
    --llama.back();
  }
  int64_t best_last = -1;
  double best_load = 0;
  for (int64_t last = m.mtp_layers > 0 ? 0 : 1;
       last <= (layers + stages - 1) / stages && layers - last >= stages - 1; ++last) {
    const int64_t others = (layers - last + stages - 2) / (stages - 1);  // the fullest other stage
    const double load = std::max(static_cast<double>(others), static_cast<double>(last) + extra);
    if (best_last < 0 || load <= best_load) best_last = last, best_load = load;
  }
  // Llama 3's rule where it applies and paces no worse than the balanced split.
  if (!llama.empty() && (best_last < 0 || slowest(llama) <= best_load)) {
    if (note)
      *note = "stages of " + std::to_string(llama[1]) + " layers, first and last " +
              std::to_string(llama.front()) + " (they hold the embedding and the head)";
    return llama;
  }
  if (best_last < 0) return {};
  // The engine's split (the first stages one layer more) where it paces as well.
  const std::vector<int64_t> engine = stage_layer_counts(layers, stages);
  if (slowest(engine) <= best_load) {
    if (note)
      *note =
          "uneven stages: the first " + std::to_string(layers % stages) + " take one layer more";
    return engine;
  }
  // Else the others share the rest, the short ones first (the first stage holds the embedding
  // and, under 1F1B, the most micro-batches' activations).
  std::vector<int64_t> split = stage_layer_counts(layers - best_last, stages - 1);
  std::reverse(split.begin(), split.end());
  split.push_back(best_last);
  if (!note) return split;
  char work[32];
  std::snprintf(work, sizeof work, "%.1f", extra);
  const int64_t more = (layers - best_last) % (stages - 1),
                base = (layers - best_last) / (stages - 1);
  *note =
      "uneven stages balanced against the last one's head" +
      std::string(m.mtp_layers > 0 ? " and MTP" : "") + " (" + work + " layers' work): " +
      (more > 0 ? "the first " + std::to_string(stages - 1 - more) + " of " + std::to_string(base) +
                      ", " + std::to_string(more) + " of " + std::to_string(base + 1)
                : std::to_string(stages - 1) + " of " + std::to_string(base)) +
      ", the last " + std::to_string(best_last);
  return split;
}

int64_t chunks_in_flight(const PlanLayout& l, int64_t micro_batches, int64_t rank) {
  switch (l.schedule) {
    case PipelineSchedule::AllForwardAllBackward: return micro_batches * l.vp;
    case PipelineSchedule::OneFOneB: return std::min(micro_batches, l.pp - rank);
    case PipelineSchedule::ZeroBubbleH1: return std::min(micro_batches, l.pp);
    case PipelineSchedule::ZeroBubbleV: return std::min(2 * micro_batches, 2 * l.pp);
    case PipelineSchedule::DualPipeV: return std::min(2 * micro_batches, 2 * l.pp + 1);
    case PipelineSchedule::Interleaved:
      return std::min(micro_batches * l.vp, 2 * (l.pp - rank - 1) + (l.vp - 1) * l.pp + 1);
  }
  return micro_batches * l.vp;
}

int64_t deferred_weight_grad_bytes(const ModelConfig& m, int64_t layers, bool first_stage, bool last_stage,
                                   int64_t rows, int64_t bytes_per_element) {
  if (m.is_hybrid() || m.squared_relu_mlp)
    throw_error(
        "deferred_weight_grad_bytes: counts a transformer block's saved tensors; a hybrid Mamba "
        "stack's "
        "are not modelled");
  if (m.n_experts > 0)
    throw_error("deferred_weight_grad_bytes: a mixture-of-experts model's W keeps what routing sends each expert, "
                "which no shape fixes");
  const int64_t c = m.n_embd, attention = m.n_head * m.head_dim(), qkv = (m.n_head + 2 * m.n_kv_head) * m.head_dim();
  const int64_t f = m.ffn_hidden, gated = m.arch == Architecture::Llama ? 2 * f : f;
  const int64_t stats = m.arch == Architecture::Llama ? 1 : 2;  // RMSNorm: rstd; LayerNorm: mean, rstd
  // Per row: a norm keeps its output gradient and input, a linear its output-gradient columns and input.
  const int64_t norm = 2 * c * bytes_per_element + stats * 4;
  const int64_t block = 2 * norm + (qkv + c + c + attention + gated + c + c + f) * bytes_per_element;
  int64_t per_row = layers * block;
  if (first_stage) per_row += c * bytes_per_element;  // the embedding's output gradient
  if (last_stage) per_row += norm;                     // the final norm's
  return rows * per_row;
}

double unfused_rmsnorm_rows(const ModelConfig& m, const PlanLayout& l, int64_t seq_len) {
  if (m.arch != Architecture::Llama) return 0;
  const double rows =
      static_cast<double>(l.micro_batch) * static_cast<double>(seq_len) / static_cast<double>(l.cp);
  return l.sequence_parallel ? rows / static_cast<double>(l.tp) : rows;
}

double stashed_layer_bytes(const ModelConfig& m, const PlanLayout& layout, const GpuJob& job) {
  const double bytes = job.activation_bytes;
  if (layout.recompute == Recompute::Selective && job.selective == SelectivePolicy::TorchtitanOps)
    return torchtitan_op_sac_layer_bytes(m, layout.micro_batch, job.seq_len, layout, bytes,
                                         job.op_sac_eager);
  double stash = job.accounting == ActivationAccounting::Korthikanti
                     ? korthikanti_layer_bytes(m, layout.micro_batch, job.seq_len, layout,
                                               job.flash_attention, job.fp8_linear_inputs)
                     : layer_activation_bytes(m, layout.micro_batch, job.seq_len, layout, bytes,
                                              job.flash_attention, job.fp8_linear_inputs);
  if (job.unfused_rmsnorm && layout.recompute != Recompute::Full)  // two norms a layer
    stash += 2 * kUnfusedRmsNormSavedBytes * unfused_rmsnorm_rows(m, layout, job.seq_len) *
             static_cast<double>(m.n_embd);
  if (job.unfused_softmax && !job.flash_attention && layout.recompute == Recompute::None)
    stash += 1.0 * static_cast<double>(layout.micro_batch * job.seq_len / layout.cp) *
             static_cast<double>(m.n_head) / static_cast<double>(layout.tp) *
             static_cast<double>(m.attention_layer_count()) / static_cast<double>(m.n_layer) *
             static_cast<double>(job.seq_len);  // 6 bytes a score, not 5
  return stash;
}

void check_offloaded_layers(const ModelConfig& m, const PlanLayout& l, const GpuJob& job) {
  if (job.offloaded_layers == 0) return;
  if (l.pp != 1 || l.vp != 1 || l.recompute != Recompute::None)
    throw_error(
        "activation offloading needs pp 1, one chunk and no recomputation (Megatron-Core's "
        "rule for cpu_offloading_num_layers), not ",
        l.describe());
  if (job.offloaded_layers < 0 || job.offloaded_layers >= m.n_layer)
    throw_error("activation offloading of ", job.offloaded_layers, " layers: expected 0 to ",
                m.n_layer - 1, ", fewer than the model's ", m.n_layer);
}

double offloaded_host_bytes(const ModelConfig& m, const PlanLayout& l, const GpuJob& job) {
  check_offloaded_layers(m, l, job);
  return static_cast<double>(job.offloaded_layers) * stashed_layer_bytes(m, l, job);
}

MemoryBreakdown predict_gpu_memory(const ModelConfig& m, const PlanLayout& l, const GpuJob& job) {
  check_offloaded_layers(m, l, job);
  // Parameters on each pipeline rank: its blocks on one tp rank, plus the input embedding
  // (vocabulary-parallel over tp) on the first and the head on the last, counted from each
  // parameter's placement. Expert weights are further split over ep and their ZeRO shards span
  // the dp x cp / ep ranks holding the same experts (DeepSpeed-MoE, Rajbhandari et al. 2022,
  // sec. 5).
  const std::vector<int64_t> stage_layers = planner_stage_layers(m, l, job);
  const double bytes = job.activation_bytes;
  const bool op_sac =
      l.recompute == Recompute::Selective && job.selective == SelectivePolicy::TorchtitanOps;
  auto layer_bytes = [&](const PlanLayout& layout) { return stashed_layer_bytes(m, layout, job); };
  MemoryBreakdown mem;
  RankParameters held;
  for (int64_t rank = 0; rank < l.pp; ++rank) {
    const RankParameters r = rank_parameters(m, l, rank, stage_layers, job.experts_whole_on_tp);
    MemoryBreakdown here = zero_model_states(r.dense(), job.state, l.dp * l.cp, l.zero_stage);
    if (r.experts > 0) {
      const MemoryBreakdown experts = zero_model_states(r.experts, job.state, l.dp * l.cp / l.ep, l.zero_stage);
      here.parameters += experts.parameters;
      here.gradients += experts.gradients;
      here.optimizer_state += experts.optimizer_state;
    }
    if (job.fsdp_gathered_under_pp && l.zero_stage == 3 && l.pp > 1 && l.dp * l.cp > 1) {
      const double whole = r.dense() + r.experts;
      here.parameters += whole * job.state.parameter;
      here.gradients += whole * 4;
    }
    // The rank's chunks hold chunks_in_flight micro-batch-chunks at the peak; with uneven
    // stages each counts as the rank's average chunk.
    const double chunk_layers = static_cast<double>(r.layers) / static_cast<double>(l.vp);
    double per_layer = layer_bytes(l);
    PlanLayout none = l;
    none.recompute = Recompute::None;
    if (l.recompute == Recompute::Full &&
        job.full_recompute_share < 1)  // the other layers keep theirs
      per_layer =
          job.full_recompute_share * per_layer + (1 - job.full_recompute_share) * layer_bytes(none);
    // Offloaded layers (GpuJob::offloaded_layers, pp 1) are in host memory at the peak.
    const double offloaded = static_cast<double>(job.offloaded_layers);
    here.activations = per_layer * (chunk_layers - offloaded) *
                       static_cast<double>(chunks_in_flight(l, job.micro_batches, rank));
    if (l.recompute == Recompute::Full)  // one layer's full stash is rebuilt during its backward
      here.activations += layer_bytes(none);
    // The rank holding the last stage: pp - 1, or 0 under the V placements (ZB-V, DualPipeV).
    const bool holds_head =
        rank == rank_of_stage(l.pp * l.vp - 1, l.pp, stage_placement(l.schedule));
    double loss_bytes = 0;
    if (holds_head && job.logits_bytes_per_element > 0)
      loss_bytes = static_cast<double>(l.micro_batch * job.seq_len / l.cp) *
                   static_cast<double>(m.vocab_size) /
                   static_cast<double>(job.logits_gathered_over_tp ? 1 : l.tp) *
                   (l.tp > 1 && job.logits_bytes_per_element_under_tp > 0
                        ? job.logits_bytes_per_element_under_tp
                        : job.logits_bytes_per_element);
    if (op_sac) {
      // A layer's backward first recomputes what the policy did not save (the rest of its
      // stash); the loss buffers are freed by then (the head's backward comes first), so the
      // peak holds the larger of the two.
      PlanLayout none = l;
      none.recompute = Recompute::None;
      loss_bytes = std::max(loss_bytes, layer_bytes(none) - layer_bytes(l));
    }
    here.activations += loss_bytes;
    if (job.loom_cuda_device_memory > 0)
      here.workspace = loom_cuda_workspace_bytes(
          m, l, job.seq_len, job.loom_cuda_device_memory, bytes, holds_head,
          holds_head ? last_stage_activation_sets(m, l, job.micro_batches) : 0);
    if (rank == 0 || here.total() > mem.total()) {
      mem = here;
      held = r;
    }
  }
  // Two buckets in flight for data parallelism; ZeRO-3 also holds a gathered layer and the
  // prefetched next one.
  mem.comm_buffers = l.dp * l.cp > 1 ? 2 * job.bucket_bytes : 0;
  if (l.zero_stage == 3 &&
      !(job.fsdp_gathered_under_pp && l.pp > 1 && l.dp * l.cp > 1))  // else held whole above
    mem.comm_buffers += 2 * (held.block + held.experts) / static_cast<double>(held.layers) * job.state.parameter;
  // Context parallelism's buffers for the one layer attending at a time
  // (parallel/context_parallel): the ring holds up to four k|v blocks in backward (the one in
  // hand, the next, the gradient travelling, the one arriving); all-gather the gathered blocks
  // and the whole sequence's k|v in order (their gradients backward), 2 cp blocks; Ulysses its
  // q|k|v, output and output gradient re-laid by heads and the q|k|v gradient, the size of its
  // own.
  if (l.cp > 1) {
    const double tokens = static_cast<double>(l.micro_batch * job.seq_len / l.cp), t = static_cast<double>(l.tp);
    const double q = static_cast<double>(m.q_dim());
    const double kv = job.cp_gathers_repeated_kv ? q : static_cast<double>(m.kv_dim());
    const double block = tokens * 2 * kv / t * bytes;
    switch (l.cp_comm) {
      case CpComm::P2P: mem.comm_buffers += 4 * block; break;
      case CpComm::AllGather: mem.comm_buffers += 2 * static_cast<double>(l.cp) * block; break;
      case CpComm::AllToAll:
        mem.comm_buffers += tokens * (2 * (q + 2 * kv) + 2 * q) / t * bytes;
        break;
    }
  }
  if (job.loom_cuda_device_memory <= 0) mem.workspace = job.workspace_bytes;
  return mem;
}

int64_t loom_cuda_vocab_chunk(const ModelConfig& m, const PlanLayout& l, int64_t seq_len,
                              double device_memory, double activation_bytes) {
  // train_config.cpp resolved_vocab_chunk, for the micro-batch's rows (its full sequences).
  const int64_t vocab = m.vocab_size;
  const double rule_rows = static_cast<double>(std::max<int64_t>(1, l.micro_batch * seq_len));
  const auto fits = static_cast<int64_t>(
      device_memory / 16 / (rule_rows * (activation_bytes < 4 ? (l.tp > 1 ? 6 : 2) : 4)));
  return fits >= vocab ? vocab : std::min(vocab, std::max(kDefaultVocabChunk, fits / 1024 * 1024));
}

double loom_cuda_workspace_bytes(const ModelConfig& m, const PlanLayout& l, int64_t seq_len,
                                 double device_memory, double activation_bytes, bool last_stage,
                                 int64_t head_sets) {
  const double b = activation_bytes;
  const bool bf16 = activation_bytes < 4;
  const int64_t rows = l.micro_batch * seq_len / l.cp;  // the rank's tokens of a micro-batch
  const int64_t local_rows = l.sequence_parallel ? rows / l.tp : rows;
  const int64_t c = m.n_embd, tp = l.tp, f = m.ffn_hidden / tp;
  const double r = static_cast<double>(rows), lr = static_cast<double>(local_rows);
  // Block scratch: d_norm_out on the rank's rows, d_qkv and d_attn_out on the whole rows, and
  // for a dense MLP its pre-activation and activation gradients.
  double elements =
      lr * c + r * static_cast<double>((m.q_dim() + 2 * m.kv_dim()) / tp + m.q_dim() / tp);
  if (m.moe_layer_count() < m.n_layer)
    elements += r * static_cast<double>((m.arch == Architecture::Llama ? 2 * f : f) + f);
  elements += lr * c;  // the residual stream's gradient, carried through the blocks in place
  double bytes = elements * b;
  if (!last_stage) return bytes;
  bytes += static_cast<double>(head_sets) * lr * c * b;  // the head's d_hidden, one per set
  bytes += r * 4;       // the targets on the device (int32; kernels/cuda/ops_cuda.cu)
  const int64_t vocab = m.vocab_size;
  const int64_t chunk = loom_cuda_vocab_chunk(m, l, seq_len, device_memory, activation_bytes);
  auto aligned = [](double n) { return std::ceil(n / 256) * 256; };  // cross_entropy.cu's regions
  if (tp > 1) {
    // The shard's f32 logit chunk, and with bf16 its bf16 gradient and the f32 d_hidden
    // accumulator (cross_entropy.cu's shard passes); under sp the gathered hidden rows and their
    // gradient. Row statistics (a few floats a row) are left out.
    const double width = static_cast<double>(std::min(chunk, (vocab + tp - 1) / tp));
    bytes += r * width * 4;
    if (bf16) bytes += r * width * 2 + r * c * 4;
    if (l.sequence_parallel) bytes += 2 * r * c * b;
    return bytes;
  }
  const double ld = static_cast<double>((chunk + 15) / 16 * 16);
  // bf16: the logits in bf16, their gradient written over them (cross_entropy.hpp's default).
  double ce = aligned(r * ld * (bf16 ? 2 : 4)) + 4 * aligned(r * 4) + aligned(8);
  if (bf16) ce += aligned(r * c * 4);
  const int64_t chunks = (vocab + chunk - 1) / chunk, last = vocab - (chunks - 1) * chunk;
  if (last % 16 != 0) ce += static_cast<double>((last + 15) / 16 * 16 * c) * b;
  return bytes + ce;
}

}  // namespace loom::plan
