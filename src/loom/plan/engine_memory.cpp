// The CPU engine's own memory, as its allocator counts it: model states through ZeroOptimizer's
// flats (with ZeRO-2/3's in-step peak replayed) and activation sets per schedule.
#include <algorithm>
#include <cmath>
#include <map>

#include "loom/core/error.hpp"
#include "loom/model/parameter_specs.hpp"
#include "loom/model/pipeline_layout.hpp"
#include "loom/model/stage_placement.hpp"
#include "loom/parallel/gradient_buckets.hpp"
#include "loom/plan/layer_elements.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/plan/rank_parameters.hpp"

namespace loom::plan {

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
    // Within an event the flats issue as their last gradients arrive, in the order the block
    // reports them (the parameter list's: a MoE block's shared experts after its experts, so
    // its dense flat after its experts' flat).
    std::map<std::string, size_t> position;
    for (size_t i = 0; i < specs.size(); ++i) position[specs[i].name] = i;
    auto last_reported = [&](const Flat& flat) {
      size_t last = 0;
      for (const ParameterSpec* s : flat.members) last = std::max(last, position.at(s->name));
      return last;
    };
    auto ready_until = [&](int64_t event) {  // issue every flat whose gradients are all ready
      std::vector<size_t> ready;
      for (size_t f = 0; f < flats.size(); ++f)
        if (!issued[f] &&
            std::all_of(flats[f].members.begin(), flats[f].members.end(),
                        [&](const ParameterSpec* s) { return ready_event(*s) <= event; }))
          ready.push_back(f);
      std::stable_sort(ready.begin(), ready.end(), [&](size_t a, size_t b) {
        return last_reported(flats[a]) < last_reported(flats[b]);
      });
      for (size_t f : ready) {
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
// The model's parameters as loom's engine places them: its tensor-parallel plan leaves a
// mixture-of-experts block (router, experts, shared experts) whole on every tp rank, where
// parameter_specs splits the experts as Megatron-Core's expert tensor parallelism does.
std::vector<ParameterSpec> engine_parameter_specs(const ModelConfig& m) {
  std::vector<ParameterSpec> specs = parameter_specs(m);
  for (ParameterSpec& s : specs)
    if (s.in_moe_block()) s.tp_dim = -1;
  return specs;
}

struct EngineActivationShape {
  double tokens = 0, h = 0, row_split = 1, norm_stats = 0;
  double stash_rowwise = 0;  // a block stash's rows outside the residual stream
  double dense_split = 0, dense_recomputable = 0;  // a dense block's, in the tp region
  double moe_split = 0, moe_recomputable = 0;      // a mixture-of-experts block's
  double moe_rowwise = 0;  // its experts' part: on the rank's own rows under sequence parallelism
  double attention_split = 0;

  EngineActivationShape(const ModelConfig& m, int64_t batch, int64_t seq_len, int64_t tp,
                        bool sequence_parallel, int64_t cp, double moe_received = 1.0) {
    tokens = static_cast<double>(batch * seq_len / cp);
    h = static_cast<double>(m.n_embd);
    const double t = static_cast<double>(tp);
    row_split = sequence_parallel ? t : 1.0;
    norm_stats = m.arch == Architecture::GPT2 ? 2 : 1;
    const LayerElements e = layer_elements_of(m, false);
    stash_rowwise = e.replicated_by_tp - h;  // the input lives in the residual stream
    dense_split = e.split_by_tp / t;
    dense_recomputable = e.recomputable / t;
    attention_split = (static_cast<double>(m.q_dim()) + 2 * static_cast<double>(m.kv_dim())) / t;
    // A MoE block keeps its experts' activations with the rest of its stash (MoeStash, f32),
    // none in the recomputable set, which holds the attention output and log-sum-exps only:
    // per token the router's logits and probabilities (2E), its k weights, the k outputs
    // brought home (k h), and the rows this rank's experts ran, their inputs, gate | up and
    // SwiGLU outputs (h + 3 fe each): k per token without expert parallelism; under it the rows
    // received, k per token on average, `moe_received` times that on a busier rank. The experts
    // run whole on every tp rank, on the rank's own rows under sequence parallelism: this part
    // is split like the residual stream, not like the attention.
    const double k = static_cast<double>(m.experts_per_token),
                 fe = static_cast<double>(m.expert_ffn());
    moe_split = attention_split;
    moe_rowwise = 2 * static_cast<double>(m.n_experts) + k + k * h +
                  moe_received * k * (h + 3 * fe) +
                  static_cast<double>(m.n_shared_experts) * 3 * fe;
    moe_recomputable = (static_cast<double>(m.q_dim()) + static_cast<double>(m.n_head)) / t;
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
      rowwise += (dense + moe) * stash_rowwise + moe * moe_rowwise;
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
        return bytes(
            stash_rowwise + (model_has_moe ? moe_rowwise : 0),
            model_has_dense ? dense_split + dense_recomputable : moe_split + moe_recomputable);
    }
    return 0;
  }
};

// The busiest ep rank's received rows over the mean: at least 1, and finite.
void require_moe_imbalance(const char* caller, double moe_imbalance) {
  if (!(moe_imbalance >= 1 && std::isfinite(moe_imbalance)))
    throw_error(caller, ": moe_imbalance = ", moe_imbalance,
                ", expected >= 1 (the busiest ep rank's received rows over the mean)");
}

// The model chunks each pipeline rank holds: interleaved's vp, the V placements' two, else one.
int64_t chunks_per_rank(const PlanLayout& l) {
  if (l.schedule == PipelineSchedule::Interleaved) return l.vp;
  return stage_placement(l.schedule) == StagePlacement::V ? 2 : 1;
}

// What one chunk's activation set costs: its base, the last stage's extras (added once to a set
// the first time it serves the last stage, kept after), and under a split backward the copies a
// B holds until its W.
struct ChunkBytes {
  double base = 0, last_extras = 0, deferred = 0;
};

struct PoolReplay {
  double peak = 0;              // bytes of sets made plus W copies held, at the worst moment
  int64_t last_stage_sets = 0;  // sets that gained the last stage's extras
};

// One rank's action list replayed through the engine's pool (parallel/pipeline_activations): a
// forward takes the most recently idled set of as many layers, or a new one; a set that serves
// the last stage gains its extras and keeps them; a backward idles its set; a B holds copies
// for its W until the W runs. Sets are never freed, and the pool outlives the step: the next
// step starts with every set idle, in the order the last one left them, so a later step can
// give the extras to sets the first did not (DualPipeV's pairs). Steps are replayed until one
// makes nothing new; the peak is that steady step's.
PoolReplay replay_activation_pool(const std::vector<PipeAction>& actions,
                                  const std::vector<ModelChunk>& chunks,
                                  const std::vector<ChunkBytes>& per_chunk) {
  struct Set {
    int64_t layers = 0;
    bool last_extras = false;
  };
  std::vector<Set> idle;
  double sets_bytes = 0;
  int64_t sets_made = 0;
  PoolReplay replay;
  for (int step = 0; step < 64; ++step) {  // a pool of n sets settles within n steps
    const int64_t made_before = sets_made, extras_before = replay.last_stage_sets;
    std::map<std::pair<int64_t, int64_t>, Set> in_flight;
    double deferred = 0, peak = 0;
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
            ++sets_made;
          }
          if (chunks[chunk].last_stage() && !set.last_extras) {
            sets_bytes += bytes.last_extras;
            set.last_extras = true;
            ++replay.last_stage_sets;
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
    replay.peak = peak;
    if (step > 0 && sets_made == made_before && replay.last_stage_sets == extras_before) break;
  }
  return replay;
}

}  // namespace

MemoryBreakdown predict_engine_memory(const ModelConfig& m, int64_t dp, int stage,
                                      int64_t bucket_bytes, bool bf16, int64_t batch,
                                      int64_t seq_len, Recompute recompute, int64_t tp,
                                      bool sequence_parallel, int64_t cp, int64_t ep,
                                      double moe_imbalance) {
  if (ep < 1 || dp % ep != 0 || (m.is_moe() ? m.n_experts % ep != 0 : ep != 1))
    throw_error("predict_engine_memory: ep = ", ep, " with dp = ", dp, " and ", m.n_experts,
                " experts");
  require_moe_imbalance("predict_engine_memory", moe_imbalance);
  // This rank's parameters: every dense one, and the experts of ep rank 0 (all ranks hold as
  // many), in gradient-ready order; the engine buckets (or, under ZeRO, flattens) the two apart.
  std::vector<ParameterSpec> mine;
  for (ParameterSpec& s : engine_parameter_specs(m))
    if (!s.expert || s.expert_index < m.n_experts / ep) mine.push_back(std::move(s));
  MemoryBreakdown mem = engine_model_states(m, mine, dp, stage, bucket_bytes, bf16, tp, ep);
  // Transformer::ensure_activations: the whole model as one set, which holds the final norm.
  const EngineActivationShape shape(m, batch, seq_len, tp, sequence_parallel, cp,
                                    ep > 1 ? moe_imbalance : 1.0);
  const double moe_layers = static_cast<double>(m.moe_layer_count());
  const double dense_layers = static_cast<double>(m.n_layer) - moe_layers;
  mem.activations =
      shape.set_bytes(dense_layers, moe_layers, true, recompute) +
      shape.shared_bytes(recompute, dense_layers > 0, dense_layers > 0, moe_layers > 0);
  return mem;
}

MemoryBreakdown predict_engine_pipeline_memory(const ModelConfig& m, const PlanLayout& l,
                                               int64_t seq_len, int64_t micro_batches,
                                               int64_t bucket_bytes, double moe_imbalance) {
  require_moe_imbalance("predict_engine_pipeline_memory", moe_imbalance);
  if (l.pp < 2)
    throw_error("predict_engine_pipeline_memory: pp = ", l.pp,
                "; use predict_engine_memory without a pipeline");
  if (m.is_moe() && splits_backward(l.schedule))
    throw_error("predict_engine_pipeline_memory: a mixture-of-experts model under ",
                schedule_name(l.schedule), " (its W keeps what routing sends each expert)");
  const StagePlacement placement = stage_placement(l.schedule);
  const int64_t v = chunks_per_rank(l);
  const std::vector<ModelChunk> chunks =
      pipeline_chunks(stage_layer_counts(m.n_layer, l.pp * v), l.pp, 0, placement);
  // Rank 0's parameters: its chunks' blocks and the embedding tables (the first stage's; under
  // the V placement the last stage's final norm and head too, with the tied table held once).
  std::vector<ParameterSpec> mine;
  for (ParameterSpec& s : engine_parameter_specs(m)) {
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
  // Activations: rank 0's action list replayed through the engine's pool (replay_activation_pool):
  // the sets it makes plus the W copies held at the worst moment.
  const std::vector<PipeAction> actions = pipeline_actions(l.schedule, l.pp, micro_batches, v)[0];
  const EngineActivationShape shape(m, l.micro_batch, seq_len, l.tp, l.sequence_parallel, l.cp,
                                    l.ep > 1 ? moe_imbalance : 1.0);
  const int64_t rows = l.micro_batch * seq_len / l.cp;
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
  const double peak = replay_activation_pool(actions, chunks, per_chunk).peak;
  const bool model_dense = m.moe_layer_count()<m.n_layer, model_moe = m.moe_layer_count()> 0;
  mem.activations = peak + shape.shared_bytes(l.recompute, rank_dense > 0, model_dense, model_moe);
  return mem;
}

}  // namespace loom::plan

namespace loom::plan {

int64_t last_stage_activation_sets(const ModelConfig& m, const PlanLayout& l,
                                   int64_t micro_batches) {
  if (l.pp < 2) return 1;  // Transformer::ensure_activations' one set, reused by every micro-batch
  const StagePlacement placement = stage_placement(l.schedule);
  const int64_t v = chunks_per_rank(l);
  const int64_t rank = rank_of_stage(l.pp * v - 1, l.pp, placement);
  const std::vector<ModelChunk> chunks =
      pipeline_chunks(stage_layer_counts(m.n_layer, l.pp * v), l.pp, rank, placement);
  return replay_activation_pool(
             pipeline_actions(l.schedule, l.pp, micro_batches, v)[static_cast<size_t>(rank)],
             chunks, std::vector<ChunkBytes>(chunks.size()))
      .last_stage_sets;
}

}  // namespace loom::plan
