#include "loom/plan/rank_parameters.hpp"

#include <map>
#include <string>
#include <vector>

#include "loom/model/parameter_specs.hpp"
#include "loom/model/pipeline_layout.hpp"

namespace loom::plan {

namespace {

// The parameter list on one tp (and ep) rank, summed by where it sits.
struct Tally {
  std::vector<double> block, experts;  // per layer
  double token_table = 0, position_table = 0, final_norm = 0, head = 0;
};

Tally count_tally(const ModelConfig& m, const PlanLayout& l, bool moe_whole_on_tp);

// The tally depends on the model's shapes and the layout's tp and ep only; a search evaluates
// thousands of layouts of one model, and a model of 512 experts on 40 layers lists 120,000
// parameters, so the last few tallies are kept (per thread).
Tally tally(const ModelConfig& m, const PlanLayout& l, bool moe_whole_on_tp) {
  std::string key = std::to_string(static_cast<int>(m.arch));
  for (const int64_t v : {m.vocab_size,
                          m.max_seq_len,
                          m.n_layer,
                          m.n_embd,
                          m.n_head,
                          m.n_kv_head,
                          m.attention_head_dim,
                          m.ffn_hidden,
                          static_cast<int64_t>(m.tied_embeddings),
                          m.n_experts,
                          m.n_shared_experts,
                          m.moe_ffn_hidden,
                          m.moe_first_dense,
                          m.moe_every,
                          m.mamba_heads,
                          m.mamba_head_dim,
                          m.mamba_state,
                          m.mamba_groups,
                          m.mamba_conv,
                          static_cast<int64_t>(m.squared_relu_mlp),
                          m.moe_latent,
                          l.tp,
                          l.ep,
                          static_cast<int64_t>(moe_whole_on_tp)})
    key += "," + std::to_string(v);
  key += "," + m.hybrid_pattern;
  thread_local std::map<std::string, Tally> cache;
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  if (cache.size() >= 16) cache.clear();
  return cache.emplace(key, count_tally(m, l, moe_whole_on_tp)).first->second;
}

Tally count_tally(const ModelConfig& m, const PlanLayout& l, bool moe_whole_on_tp) {
  Tally t;
  t.block.assign(static_cast<size_t>(m.n_layer), 0);
  t.experts.assign(static_cast<size_t>(m.n_layer), 0);
  for (const ParameterSpec& s : parameter_specs(m)) {
    const bool whole = moe_whole_on_tp && s.in_moe_block();
    const double n = static_cast<double>(s.numel_on_tp_rank(whole ? 1 : l.tp, 0));
    switch (s.part) {
      case ModelPart::Block: {
        const auto layer = static_cast<size_t>(s.unit - 1);
        if (s.expert)
          t.experts[layer] += n / static_cast<double>(l.ep);
        else
          t.block[layer] += n;
        break;
      }
      case ModelPart::TokenTable: t.token_table += n; break;
      case ModelPart::PositionTable: t.position_table += n; break;
      case ModelPart::FinalNorm: t.final_norm += n; break;
      case ModelPart::OutputHead: t.head += n; break;
    }
  }
  return t;
}

// Pipeline rank r holds its chunks' blocks; the first stage the tables, the last the final
// norm and the head, and with tied embeddings its own copy of the token table.
RankParameters on_rank(const ModelConfig& m, const PlanLayout& l, const Tally& t,
                       const std::vector<int64_t>& stage_layers, int64_t pp_rank) {
  RankParameters r;
  bool first = false, last = false;
  for (const ModelChunk& chunk : pipeline_chunks(stage_layers, l.pp, pp_rank, stage_placement(l.schedule))) {
    first = first || chunk.first_stage();
    last = last || chunk.last_stage();
    r.layers += chunk.layers();
    for (int64_t layer = chunk.first_layer; layer < chunk.end_layer; ++layer) {
      r.block += t.block[static_cast<size_t>(layer)];
      r.experts += t.experts[static_cast<size_t>(layer)];
    }
  }
  if (first || (last && m.tied_embeddings)) r.outer += t.token_table;
  if (first) r.outer += t.position_table;
  if (last) r.outer += t.final_norm + t.head;
  if (last && m.mtp_layers > 0) {
    // Multi-token prediction (ModelConfig::mtp_layers) sits on the last stage with the loss
    // (Megatron-Core's layout puts "mtp" before "loss"): each depth an attention block and an
    // MLP or expert block shaped as the stack's last ones, the projection of [hidden; next
    // token's embedding] back to the hidden width (2h x h, column-parallel over tp) and its three
    // norms (the hidden's, the embedding's and the final one before the shared head; DeepSeek-V3's
    // hnorm, enorm and shared_head.norm); the embedding and the head are the stack's own. Its
    // activations follow from `layers`: one mean layer a depth (a hybrid's two blocks).
    const auto last_of = [&](const std::string& kinds) {
      for (int64_t layer = m.n_layer - 1; layer >= 0; --layer)
        if (kinds.find(m.layer_kind(layer)) != std::string::npos) return static_cast<size_t>(layer);
      return static_cast<size_t>(m.n_layer - 1);
    };
    const double h = static_cast<double>(m.n_embd), depths = static_cast<double>(m.mtp_layers);
    const double projection = 2 * h * h / static_cast<double>(l.tp) + 3 * h;
    if (m.is_hybrid()) {
      const size_t attention = last_of("*"), mlp = last_of("E-");
      r.block += depths * (t.block[attention] + t.block[mlp] + projection);
      r.experts += depths * t.experts[mlp];
      r.layers += 2 * m.mtp_layers;
    } else {
      const size_t layer = static_cast<size_t>(m.n_layer - 1);
      r.block += depths * (t.block[layer] + projection);
      r.experts += depths * t.experts[layer];
      r.layers += m.mtp_layers;
    }
  }
  return r;
}

}  // namespace

RankParameters rank_parameters(const ModelConfig& m, const PlanLayout& l, int64_t pp_rank,
                               const std::vector<int64_t>& given, bool moe_whole_on_tp) {
  return on_rank(m, l, tally(m, l, moe_whole_on_tp),
                 given.empty() ? stage_layer_counts(m.n_layer, l.pp * l.vp) : given, pp_rank);
}

RankParameters heaviest_rank_parameters(const ModelConfig& m, const PlanLayout& l,
                                        const std::vector<int64_t>& given, bool moe_whole_on_tp) {
  const Tally t = tally(m, l, moe_whole_on_tp);
  const std::vector<int64_t> stage_layers = given.empty() ? stage_layer_counts(m.n_layer, l.pp * l.vp) : given;
  RankParameters heaviest;
  for (int64_t rank = 0; rank < l.pp; ++rank) {
    const RankParameters r = on_rank(m, l, t, stage_layers, rank);
    if (rank == 0 || r.total() > heaviest.total()) heaviest = r;
  }
  return heaviest;
}

}  // namespace loom::plan
