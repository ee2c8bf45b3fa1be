#include "loom/plan/memory_model.hpp"

#include <algorithm>
#include <map>

#include "loom/core/error.hpp"
#include "loom/model/parameter_specs.hpp"
#include "loom/model/pipeline_layout.hpp"
#include "loom/model/stage_placement.hpp"
#include "loom/parallel/gradient_buckets.hpp"
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

// Elements per token of one layer's stash, split by how each part shards.
struct LayerElements {
  double replicated_by_tp;  // layer input, norm outputs and statistics, mid residual (divide by t under SP)
  double split_by_tp;       // q|k|v, MLP pre-activation: always divided by t
  double recomputable;      // attention output, log-sum-exp, MLP activation (dropped by selective)
  // Of those, the inputs of Linear layers (saved in 1 byte under FP8): the two norm outputs
  // (in replicated_by_tp) and the attention output and MLP activation (in recomputable).
  double linear_replicated, linear_recomputable;
};

LayerElements layer_elements_of(const ModelConfig& m, bool moe_layer) {
  const double h = static_cast<double>(m.n_embd);
  const double f = static_cast<double>(moe_layer ? m.expert_ffn() : m.ffn_hidden);
  const double norm_stats = m.arch == Architecture::GPT2 ? 2 : 1;  // LayerNorm: mean and rstd
  const double mlp_pre = m.arch == Architecture::GPT2 ? f : 2 * f;  // SwiGLU keeps gate | up
  // A mixture of experts runs each token through k experts: k copies of the MLP interior, the
  // k dispatched copies of its input and the k expert outputs the combine's backward reads,
  // the router's logits and probabilities over the experts, and the k routing weights
  // (model/moe's MoeStash).
  const double k = moe_layer ? static_cast<double>(m.experts_per_token) : 1;
  // Shared experts add one always-on MLP of n_shared x f: its pre-activation and activation.
  const double shared = moe_layer ? static_cast<double>(m.n_shared_experts) : 0;
  const double moe_extra = moe_layer ? 2 * k * h + 2 * static_cast<double>(m.n_experts) + k + shared * (mlp_pre + f) : 0;
  LayerElements e;
  e.replicated_by_tp = h /*input*/ + 2 * (h + norm_stats) /*two norms*/ + h /*mid residual*/;
  e.split_by_tp = (h + 2.0 * static_cast<double>(m.kv_dim())) + k * mlp_pre + moe_extra;
  e.recomputable = h + static_cast<double>(m.n_head) + k * f;
  e.linear_replicated = 2 * h;
  e.linear_recomputable = h + k * f;
  return e;
}

// The mean layer: dense and mixture-of-experts layers weighted by their counts (exact for the
// whole model; a pipeline stage's mix may differ from the mean).
LayerElements layer_elements(const ModelConfig& m) {
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
    double linear = e.linear_replicated / (l.sequence_parallel ? t : 1.0);
    if (l.recompute == Recompute::None) linear += e.linear_recomputable / t;
    bytes -= tokens * linear * (bytes_per_element - 1);
  }
  if (!flash_attention && l.recompute == Recompute::None)
    bytes += tokens * 5 * static_cast<double>(m.n_head) / t * static_cast<double>(seq_len);
  return bytes;
}

double torchtitan_op_sac_layer_bytes(const ModelConfig& m, int64_t micro_batch, int64_t seq_len,
                                     const PlanLayout& l, double bytes_per_element) {
  if (m.arch != Architecture::Llama || m.moe_layer_count() > 0)
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
  return tokens * ((block_input + interior / t) * bytes_per_element +
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

std::vector<int64_t> planner_stage_layers(const ModelConfig& m, const PlanLayout& l, const GpuJob& job) {
  if (!job.stage_layers.empty()) {
    if (static_cast<int64_t>(job.stage_layers.size()) != l.pp * l.vp)
      throw_error("planner: ", job.stage_layers.size(), " stage layer counts for pp x vp = ", l.pp * l.vp, " stages");
    return job.stage_layers;
  }
  return stage_layer_counts(m.n_layer, l.pp * l.vp);
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

MemoryBreakdown predict_gpu_memory(const ModelConfig& m, const PlanLayout& l, const GpuJob& job) {
  // Parameters on each pipeline rank: its blocks on one tp rank, plus the input embedding
  // (vocabulary-parallel over tp) on the first and the head on the last, counted from each
  // parameter's placement. Expert weights are further split over ep and their ZeRO shards span
  // the dp x cp / ep ranks holding the same experts (DeepSpeed-MoE, Rajbhandari et al. 2022,
  // sec. 5).
  const std::vector<int64_t> stage_layers = planner_stage_layers(m, l, job);
  const double bytes = job.activation_bytes;
  const bool op_sac =
      l.recompute == Recompute::Selective && job.selective == SelectivePolicy::TorchtitanOps;
  auto layer_bytes = [&](const PlanLayout& layout) {
    if (layout.recompute == Recompute::Selective && job.selective == SelectivePolicy::TorchtitanOps)
      return torchtitan_op_sac_layer_bytes(m, layout.micro_batch, job.seq_len, layout, bytes);
    return job.accounting == ActivationAccounting::Korthikanti
               ? korthikanti_layer_bytes(m, layout.micro_batch, job.seq_len, layout,
                                         job.flash_attention, job.fp8_linear_inputs)
               : layer_activation_bytes(m, layout.micro_batch, job.seq_len, layout, bytes,
                                        job.flash_attention, job.fp8_linear_inputs);
  };
  MemoryBreakdown mem;
  RankParameters held;
  for (int64_t rank = 0; rank < l.pp; ++rank) {
    const RankParameters r = rank_parameters(m, l, rank, stage_layers);
    MemoryBreakdown here = zero_model_states(r.dense(), job.state, l.dp * l.cp, l.zero_stage);
    if (r.experts > 0) {
      const MemoryBreakdown experts = zero_model_states(r.experts, job.state, l.dp * l.cp / l.ep, l.zero_stage);
      here.parameters += experts.parameters;
      here.gradients += experts.gradients;
      here.optimizer_state += experts.optimizer_state;
    }
    // The rank's chunks hold chunks_in_flight micro-batch-chunks at the peak; with uneven
    // stages each counts as the rank's average chunk.
    const double chunk_layers = static_cast<double>(r.layers) / static_cast<double>(l.vp);
    here.activations = layer_bytes(l) * chunk_layers * static_cast<double>(chunks_in_flight(l, job.micro_batches, rank));
    if (l.recompute == Recompute::Full) {  // one layer's full stash is rebuilt during its backward
      PlanLayout none = l;
      none.recompute = Recompute::None;
      here.activations += layer_bytes(none);
    }
    double loss_bytes = 0;
    if (rank == l.pp - 1 && job.logits_bytes_per_element > 0)
      loss_bytes = static_cast<double>(l.micro_batch * job.seq_len / l.cp) *
                   static_cast<double>(m.vocab_size) / static_cast<double>(l.tp) *
                   job.logits_bytes_per_element;
    if (op_sac) {
      // A layer's backward first recomputes what the policy did not save (the rest of its
      // stash); the loss buffers are freed by then (the head's backward comes first), so the
      // peak holds the larger of the two.
      PlanLayout none = l;
      none.recompute = Recompute::None;
      loss_bytes = std::max(loss_bytes, layer_bytes(none) - layer_bytes(l));
    }
    here.activations += loss_bytes;
    if (rank == 0 || here.total() > mem.total()) {
      mem = here;
      held = r;
    }
  }
  // Two buckets in flight for data parallelism; ZeRO-3 also holds a gathered layer and the
  // prefetched next one.
  mem.comm_buffers = l.dp * l.cp > 1 ? 2 * job.bucket_bytes : 0;
  if (l.zero_stage == 3)
    mem.comm_buffers += 2 * (held.block + held.experts) / static_cast<double>(held.layers) * job.state.parameter;
  // Context parallelism's buffers for the one layer attending at a time
  // (parallel/context_parallel): the ring holds up to four k|v blocks in backward (the one in
  // hand, the next, the gradient travelling, the one arriving); all-gather the gathered blocks
  // and the whole sequence's k|v in order (their gradients backward), 2 cp blocks; Ulysses its
  // q|k|v, output and output gradient re-laid by heads and the q|k|v gradient, the size of its
  // own.
  if (l.cp > 1) {
    const double tokens = static_cast<double>(l.micro_batch * job.seq_len / l.cp), t = static_cast<double>(l.tp);
    const double kv = static_cast<double>(m.kv_dim()), h = static_cast<double>(m.n_embd);
    const double block = tokens * 2 * kv / t * bytes;
    switch (l.cp_comm) {
      case CpComm::P2P: mem.comm_buffers += 4 * block; break;
      case CpComm::AllGather: mem.comm_buffers += 2 * static_cast<double>(l.cp) * block; break;
      case CpComm::AllToAll: mem.comm_buffers += tokens * (2 * (h + 2 * kv) + 2 * h) / t * bytes; break;
    }
  }
  mem.workspace = job.workspace_bytes;
  return mem;
}

namespace {

// The engine's model states on one rank holding `specs` (its tp block of each: tp rank 0's, the
// largest), replicated over `dp` ranks (the experts over dp / ep) under ZeRO `stage`.
MemoryBreakdown engine_model_states(const ModelConfig& m, const std::vector<ParameterSpec>& specs,
                                    int64_t dp, int stage, int64_t bucket_bytes, bool bf16,
                                    int64_t tp, int64_t ep) {
  std::vector<ParameterSpec> dense, experts;
  for (const ParameterSpec& s : specs) (s.expert ? experts : dense).push_back(s);
  auto numel_here = [&](const ParameterSpec& s) { return s.numel_on_tp_rank(tp, 0); };
  const StateBytes state{4, 4, bf16 ? 4.0 : 0.0, 8};  // f32 storage even for bf16 values on the CPU
  if (dp == 1 || stage == 0) {
    double params = 0;
    for (const ParameterSpec& s : specs) params += static_cast<double>(numel_here(s));
    return zero_model_states(params, state, 1, 0);
  }
  // ZeroOptimizer's flats: size-capped buckets in gradient-ready order (stages 1-2) or one
  // per unit (stage 3), each padded to a multiple of its group: dp, or dp / ep for experts.
  struct Flat {
    double padded = 0;
    std::vector<const ParameterSpec*> members;
  };
  std::vector<Flat> flats;
  double shard = 0, padded = 0;
  auto add_flats = [&](const std::vector<ParameterSpec>& group_specs, int64_t ranks) {
    std::vector<std::vector<const ParameterSpec*>> groups;
    if (stage == 3) {
      groups.resize(static_cast<size_t>(m.n_layer + 1));
      for (const ParameterSpec& s : group_specs) groups[static_cast<size_t>(s.unit)].push_back(&s);
    } else {
      std::vector<int64_t> numels;
      for (const ParameterSpec& s : group_specs) numels.push_back(numel_here(s));
      for (const std::vector<size_t>& bucket : group_into_buckets(numels, bucket_bytes)) {
        groups.emplace_back();
        for (size_t i : bucket) groups.back().push_back(&group_specs[i]);
      }
    }
    for (std::vector<const ParameterSpec*>& members : groups) {
      int64_t n = 0;
      for (const ParameterSpec* s : members) n += numel_here(*s);
      if (n == 0) continue;  // a unit this rank holds nothing of
      const int64_t piece = (n + ranks - 1) / ranks;
      shard += static_cast<double>(piece);
      padded += static_cast<double>(piece * ranks);
      flats.push_back({static_cast<double>(piece * ranks), std::move(members)});
    }
  };
  if (ep == 1) {
    add_flats(specs, dp);
  } else {
    add_flats(dense, dp);
    add_flats(experts, dp / ep);
  }
  // Stages 2-3 hold full-size gradients within the step: replay one backward as ZeroOptimizer
  // runs it. A unit's backward first finishes every reduce-scatter in flight but the latest
  // and frees its flat, then allocates the unit's flats; a flat's reduce-scatter is issued once
  // all its gradients are ready: the head's and final norm's first, each block's after its
  // backward (last block first), the embedding tables' at the very end. The root's backward
  // begins with the loss.
  double grads_in_step = 0, params_in_step = 0;
  if (stage >= 2) {
    const int64_t blocks = m.n_layer;
    auto ready_event = [&](const ParameterSpec& s) -> int64_t {
      switch (s.part) {
        case ModelPart::FinalNorm:
        case ModelPart::OutputHead: return 0;
        case ModelPart::Block: return blocks - s.unit + 1;
        default: return blocks + 1;  // the token and position tables
      }
    };
    std::vector<bool> live(flats.size(), false), issued(flats.size(), false);
    std::vector<size_t> in_flight;
    double alive = 0;
    auto unit_backward = [&](int64_t unit) {  // before_backward(unit)
      while (in_flight.size() > 1) {
        live[in_flight.front()] = false;
        alive -= flats[in_flight.front()].padded;
        in_flight.erase(in_flight.begin());
      }
      for (size_t f = 0; f < flats.size(); ++f) {
        const bool touches = std::any_of(flats[f].members.begin(), flats[f].members.end(),
                                         [&](const ParameterSpec* s) { return s->unit == unit; });
        if (touches && !live[f] && !issued[f]) {
          live[f] = true;
          alive += flats[f].padded;
        }
      }
      grads_in_step = std::max(grads_in_step, alive);
    };
    auto ready_until = [&](int64_t event) {  // issue every flat whose gradients are all ready
      for (size_t f = 0; f < flats.size(); ++f)
        if (!issued[f] && std::all_of(flats[f].members.begin(), flats[f].members.end(),
                                      [&](const ParameterSpec* s) { return ready_event(*s) <= event; })) {
          issued[f] = true;
          in_flight.push_back(f);
        }
    };
    unit_backward(0);
    ready_until(0);
    for (int64_t unit = blocks; unit >= 1; --unit) {
      unit_backward(unit);
      ready_until(blocks - unit + 1);
    }
    ready_until(blocks + 1);
    // Stage 3 gathers the root for the whole step and each block with its neighbour prefetched:
    // forward block u beside u + 1, backward u beside u - 1.
    if (stage == 3) {
      auto unit_size = [&](int64_t unit) {
        double n = 0;
        for (const Flat& f : flats)
          if (!f.members.empty() && f.members.front()->unit == unit) n += f.padded;
        return n;
      };
      double pair = blocks >= 1 ? unit_size(1) : 0;
      for (int64_t unit = 1; unit < blocks; ++unit) pair = std::max(pair, unit_size(unit) + unit_size(unit + 1));
      params_in_step = unit_size(0) + pair;
    }
  }
  MemoryBreakdown mem;
  mem.parameters = state.parameter * (stage >= 3 ? shard + params_in_step : padded);
  mem.gradients = state.gradient * (stage >= 2 ? shard + grads_in_step : padded);
  mem.optimizer_state = (state.master + state.moments) * shard;
  return mem;
}

// Activation elements per token of the engine's stashes (model/stash.cpp), for one rank of tp
// holding seq_len / cp tokens of each sequence. `rowwise` elements sit in the residual-stream
// region (split by tp only under sequence parallelism), the rest in the tensor-parallel region
// (always split by tp).
struct EngineActivationShape {
  double tokens = 0, h = 0, row_split = 1, norm_stats = 0;
  double stash_rowwise = 0;  // a block stash's rows outside the residual stream
  double dense_split = 0, dense_recomputable = 0;  // a dense block's, in the tp region
  double moe_split = 0, moe_recomputable = 0;      // a mixture-of-experts block's
  double attention_split = 0;

  EngineActivationShape(const ModelConfig& m, int64_t batch, int64_t seq_len, int64_t tp,
                        bool sequence_parallel, int64_t cp) {
    tokens = static_cast<double>(batch * seq_len / cp);
    h = static_cast<double>(m.n_embd);
    const double t = static_cast<double>(tp);
    row_split = sequence_parallel ? t : 1.0;
    norm_stats = m.arch == Architecture::GPT2 ? 2 : 1;
    const LayerElements e = layer_elements_of(m, false);
    stash_rowwise = e.replicated_by_tp - h;  // the input lives in the residual stream
    dense_split = e.split_by_tp / t;
    dense_recomputable = e.recomputable / t;
    attention_split = (h + 2 * static_cast<double>(m.kv_dim())) / t;
    // A MoE block keeps its experts' activations with the rest of its stash (MoeStash, f32),
    // none in the recomputable set, which holds the attention output and log-sum-exps only.
    const double k = static_cast<double>(m.experts_per_token),
                 fe = static_cast<double>(m.expert_ffn());
    moe_split = attention_split + 2 * static_cast<double>(m.n_experts) + k + k * (2 * h + 3 * fe) +
                static_cast<double>(m.n_shared_experts) * 3 * fe;
    moe_recomputable = (h + static_cast<double>(m.n_head)) / t;
  }

  double bytes(double rowwise, double split) const {
    return 4 * tokens * (rowwise / row_split + split);
  }

  // One activation set (ChunkActivations) of `dense` + `moe` blocks: the residual stream (one
  // row per block plus the output), on the last stage the final norm's output and statistics,
  // and each block's stash but what selective recomputation shares (none under full).
  double set_bytes(double dense, double moe, bool last_stage, Recompute recompute) const {
    double rowwise = (dense + moe + 1) * h + (last_stage ? h + norm_stats : 0), split = 0;
    if (recompute != Recompute::Full) {
      rowwise += (dense + moe) * stash_rowwise;
      split += recompute == Recompute::None ? dense * (dense_split + dense_recomputable) +
                                                  moe * (moe_split + moe_recomputable)
                                            : dense * dense_split + moe * moe_split;
    }
    return bytes(rowwise, split);
  }

  // What a rank keeps once, beside its sets: under selective recomputation the shared
  // attention output (and a dense MLP activation where the rank has a dense block); under full,
  // the model's single stash, with a dense MLP if any layer of the model is dense.
  double shared_bytes(Recompute recompute, bool rank_has_dense, bool model_has_dense,
                      bool model_has_moe) const {
    switch (recompute) {
      case Recompute::None: return 0;
      case Recompute::Selective:
        return bytes(0, rank_has_dense ? dense_recomputable : moe_recomputable);
      case Recompute::Full:
        return bytes(stash_rowwise, model_has_dense
                                        ? dense_split + dense_recomputable +
                                              (model_has_moe ? moe_split - attention_split : 0)
                                        : moe_split + moe_recomputable);
    }
    return 0;
  }
};

}  // namespace

MemoryBreakdown predict_engine_memory(const ModelConfig& m, int64_t dp, int stage,
                                      int64_t bucket_bytes, bool bf16, int64_t batch,
                                      int64_t seq_len, Recompute recompute, int64_t tp,
                                      bool sequence_parallel, int64_t cp, int64_t ep) {
  if (ep < 1 || dp % ep != 0 || (m.is_moe() ? m.n_experts % ep != 0 : ep != 1))
    throw_error("predict_engine_memory: ep = ", ep, " with dp = ", dp, " and ", m.n_experts,
                " experts");
  // This rank's parameters: every dense one, and the experts of ep rank 0 (all ranks hold as
  // many), in gradient-ready order; the engine buckets (or, under ZeRO, flattens) the two apart.
  std::vector<ParameterSpec> mine;
  for (ParameterSpec& s : parameter_specs(m))
    if (!s.expert || s.expert_index < m.n_experts / ep) mine.push_back(std::move(s));
  MemoryBreakdown mem = engine_model_states(m, mine, dp, stage, bucket_bytes, bf16, tp, ep);
  // Transformer::ensure_activations: the whole model as one set, which holds the final norm.
  const EngineActivationShape shape(m, batch, seq_len, tp, sequence_parallel, cp);
  const double moe_layers = static_cast<double>(m.moe_layer_count());
  const double dense_layers = static_cast<double>(m.n_layer) - moe_layers;
  mem.activations =
      shape.set_bytes(dense_layers, moe_layers, true, recompute) +
      shape.shared_bytes(recompute, dense_layers > 0, dense_layers > 0, moe_layers > 0);
  return mem;
}

MemoryBreakdown predict_engine_pipeline_memory(const ModelConfig& m, const PlanLayout& l,
                                               int64_t seq_len, int64_t micro_batches,
                                               int64_t bucket_bytes) {
  if (l.pp < 2)
    throw_error("predict_engine_pipeline_memory: pp = ", l.pp,
                "; use predict_engine_memory without a pipeline");
  if (m.is_moe() && splits_backward(l.schedule))
    throw_error("predict_engine_pipeline_memory: a mixture-of-experts model under ",
                schedule_name(l.schedule), " (its W keeps what routing sends each expert)");
  const StagePlacement placement = stage_placement(l.schedule);
  const int64_t v = l.schedule == PipelineSchedule::Interleaved ? l.vp
                    : placement == StagePlacement::V            ? 2
                                                                : 1;
  const std::vector<ModelChunk> chunks =
      pipeline_chunks(stage_layer_counts(m.n_layer, l.pp * v), l.pp, 0, placement);
  // Rank 0's parameters: its chunks' blocks and the embedding tables (the first stage's; under
  // the V placement the last stage's final norm and head too, with the tied table held once).
  std::vector<ParameterSpec> mine;
  for (ParameterSpec& s : parameter_specs(m)) {
    if (s.expert && s.expert_index >= m.n_experts / l.ep) continue;
    bool held = s.part == ModelPart::TokenTable || s.part == ModelPart::PositionTable;
    for (const ModelChunk& c : chunks)
      held =
          held ||
          (s.part == ModelPart::Block && s.unit - 1 >= c.first_layer && s.unit - 1 < c.end_layer) ||
          ((s.part == ModelPart::FinalNorm || s.part == ModelPart::OutputHead) && c.last_stage());
    if (held) mine.push_back(std::move(s));
  }
  MemoryBreakdown mem =
      engine_model_states(m, mine, l.dp * l.cp, l.zero_stage, bucket_bytes, false, l.tp, l.ep);
  // Activations: replay rank 0's action list through the engine's pool
  // (parallel/pipeline_activations): a forward takes the most recently idled set of as many
  // layers, or a new one; a set that serves the last stage gains its extras (final norm output
  // and statistics) and keeps them; a backward idles its set; a B (split backward) holds copies
  // for its W until the W runs. Sets are never freed, so the peak is the sets made plus the W
  // copies held at the worst moment.
  const std::vector<PipeAction> actions = pipeline_actions(l.schedule, l.pp, micro_batches, v)[0];
  const EngineActivationShape shape(m, l.micro_batch, seq_len, l.tp, l.sequence_parallel, l.cp);
  const int64_t rows = l.micro_batch * seq_len / l.cp;
  struct ChunkBytes {
    double base = 0, last_extras = 0, deferred = 0;
  };
  std::vector<ChunkBytes> per_chunk;
  double rank_dense = 0;
  for (const ModelChunk& c : chunks) {
    double moe = 0;
    for (int64_t layer = c.first_layer; layer < c.end_layer; ++layer)
      moe += m.is_moe_layer(layer) ? 1 : 0;
    const double dense = static_cast<double>(c.layers()) - moe;
    rank_dense += dense;
    ChunkBytes bytes;
    bytes.base = shape.set_bytes(dense, moe, false, l.recompute);
    if (c.last_stage())
      bytes.last_extras = shape.set_bytes(dense, moe, true, l.recompute) - bytes.base;
    if (splits_backward(l.schedule))
      bytes.deferred = static_cast<double>(
          deferred_weight_grad_bytes(m, c.layers(), c.first_stage(), c.last_stage(), rows, 4));
    per_chunk.push_back(bytes);
  }
  struct Set {
    int64_t layers = 0;
    bool last_extras = false;
  };
  std::vector<Set> idle;
  std::map<std::pair<int64_t, int64_t>, Set> in_flight;
  double sets_bytes = 0, deferred = 0, peak = 0;
  for (const PipeAction& a : actions) {
    const auto chunk = static_cast<size_t>(a.chunk);
    const ChunkBytes& bytes = per_chunk[chunk];
    const std::pair<int64_t, int64_t> key{a.chunk, a.micro_batch};
    switch (a.op) {
      case PipeOp::Forward: {
        Set set{chunks[chunk].layers(), false};
        auto it = std::find_if(idle.rbegin(), idle.rend(),
                               [&](const Set& s) { return s.layers == set.layers; });
        if (it != idle.rend()) {
          set = *it;
          idle.erase(std::next(it).base());
        } else {
          sets_bytes += bytes.base;
        }
        if (bytes.last_extras > 0 && !set.last_extras) {
          sets_bytes += bytes.last_extras;
          set.last_extras = true;
        }
        in_flight[key] = set;
        break;
      }
      case PipeOp::Backward:
      case PipeOp::BackwardInput:
        idle.push_back(in_flight.at(key));
        in_flight.erase(key);
        if (a.op == PipeOp::BackwardInput) deferred += bytes.deferred;
        break;
      case PipeOp::BackwardWeight: deferred -= bytes.deferred; break;
    }
    peak = std::max(peak, sets_bytes + deferred);
  }
  const bool model_dense = m.moe_layer_count()<m.n_layer, model_moe = m.moe_layer_count()> 0;
  mem.activations = peak + shape.shared_bytes(l.recompute, rank_dense > 0, model_dense, model_moe);
  return mem;
}

}  // namespace loom::plan
