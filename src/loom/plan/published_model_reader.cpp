// The model of a published run: its stated dimensions (with model.moe, and the MLP form and
// tying that a stated parameter count settles) or the preset its name matches.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include "loom/plan/published_fields.hpp"
#include "loom/plan/published_models.hpp"

namespace loom::plan::published_detail {

namespace {

// model.moe: {"routed_experts", "top_k", "shared_experts", "expert_ffn"}, and where a source
// gives them the dense layers before the first expert layer ("first_dense_layers"), the
// spacing of expert layers ("moe_every") and a capacity factor (null: dropless, as NeMo and
// Megatron-Bridge run their MoE benchmarks). Experts are SwiGLU MLPs (Mixtral, DeepSeekMoE,
// Qwen-MoE), so the layer is Llama's.
void read_moe(const RunFields& f, bool ffn_stated, ModelConfig& m, PublishedRun& run) {
  if (!f.find("model.moe")->is_object())
    throw_error("published run '", f.text("id"), "': model.moe = ", f.find("model.moe")->dump(), " is not an object");
  const std::optional<int64_t> experts = f.integer("model.moe.routed_experts"), top_k = f.integer("model.moe.top_k");
  if (!experts || !top_k) throw Refusal{"model.moe does not state routed_experts and top_k"};
  if (*experts < 2 || *top_k < 1 || *top_k > *experts)
    throw_error("published run '", f.text("id"), "': model.moe has routed_experts = ", *experts, " and top_k = ", *top_k,
                "; expected at least 2 experts and 1 <= top_k <= routed_experts");
  m.n_experts = *experts;
  m.experts_per_token = *top_k;
  m.n_shared_experts = f.integer("model.moe.shared_experts").value_or(0);
  if (const std::optional<int64_t> width = f.integer("model.moe.expert_ffn")) {
    m.moe_ffn_hidden = *width;
    if (!ffn_stated) m.ffn_hidden = *width;
  } else if (!ffn_stated) {
    throw Refusal{"model.moe states no expert_ffn and model.ffn is not stated either"};
  }
  for (const char* key : {"model.moe.first_dense_layers", "model.moe.dense_layers", "model.moe.first_k_dense"})
    if (const std::optional<int64_t> dense = f.integer(key)) m.moe_first_dense = *dense;
  m.moe_every = std::max<int64_t>(1, f.integer("model.moe.moe_every").value_or(1));
  m.moe_capacity_factor = f.number("model.moe.capacity_factor").value_or(0.0);
  if (m.arch != Architecture::Llama) {
    m.arch = Architecture::Llama;
    m.tied_embeddings = false;
    run.assumptions.push_back("mixture of experts: SwiGLU experts, untied embeddings (Llama's layer)");
  }
  run.assumptions.push_back("mixture of experts: " + std::to_string(m.n_experts) + " experts, top " +
                            std::to_string(m.experts_per_token) +
                            (m.n_shared_experts > 0 ? ", " + std::to_string(m.n_shared_experts) + " shared" : std::string()) +
                            ", balanced routing" + (m.moe_capacity_factor > 0 ? "" : ", dropless"));
}

// The layer read from the dimensions alone is a guess (GQA or a Llama name: SwiGLU, untied;
// else GPT's 2-matrix MLP, tied). Where the run states its parameter count and the guess misses
// it by more than 3%, the MLP form and the embedding tying that land nearest are taken instead,
// when they halve the miss. A 2-matrix MLP of width F beside grouped-query attention (Nemotron-4,
// Falcon, StarCoder2) is charged as a SwiGLU of 2F/3: the same parameters and GEMM FLOPs
// (3 h 2F/3 = 2 h F), and the same saved activations (gate, up and product, 3 x 2F/3 = 2F,
// against a pre-activation and an activation of F each).
void match_stated_parameters(ModelConfig& m, PublishedRun& run) {
  auto miss = [&](const ModelConfig& c) { return std::fabs(static_cast<double>(c.parameter_count()) / run.params - 1); };
  const double guessed = miss(m);
  if (guessed <= 0.03) return;
  struct Candidate {
    ModelConfig config;
    std::string why;
  };
  std::vector<Candidate> candidates;
  for (bool tied : {false, true}) {
    ModelConfig gated = m;
    if (m.arch == Architecture::GPT2) {
      // An MHA layer with a gated MLP is Llama's (RMSNorm, RoPE), as long as RoPE fits.
      gated.arch = Architecture::Llama;
      if (gated.head_dim() % 2 != 0) continue;
    }
    gated.tied_embeddings = tied;
    const std::string tying = tied ? "tied embeddings" : "untied embeddings";
    if (m.arch == Architecture::GPT2) {
      candidates.push_back({gated, "a gated (SwiGLU) MLP of " + std::to_string(m.ffn_hidden) + ", " + tying});
      ModelConfig plain = m;
      plain.tied_embeddings = tied;
      candidates.push_back({plain, "GPT's 2-matrix MLP, " + tying});
    } else {
      candidates.push_back({gated, "a gated (SwiGLU) MLP, " + tying});
      ModelConfig plain = gated;
      plain.ffn_hidden = std::max<int64_t>(1, (2 * m.ffn_hidden + 1) / 3);
      candidates.push_back({plain, "a 2-matrix MLP of " + std::to_string(m.ffn_hidden) + " (charged as a SwiGLU of " +
                                       std::to_string(plain.ffn_hidden) + ": the same parameters, FLOPs and saved bytes), " +
                                       tying});
    }
  }
  const Candidate* best = nullptr;
  for (const Candidate& c : candidates)
    if (best == nullptr || miss(c.config) < miss(best->config)) best = &c;
  if (best == nullptr || miss(best->config) > guessed / 2) return;
  char text[160];
  std::snprintf(text, sizeof text, "params_b %.4g: the layer guess gives %.4g B (%+.1f%%); ", run.params / 1e9,
                static_cast<double>(m.parameter_count()) / 1e9, 100 * (static_cast<double>(m.parameter_count()) / run.params - 1));
  m = best->config;
  char after[64];
  std::snprintf(after, sizeof after, " gives %.4g B", static_cast<double>(m.parameter_count()) / 1e9);
  run.assumptions.push_back(text + best->why + after);
}

// A model given only by its size ("GPT-2-like 100B", params_b 100): a GPT in the shape of
// Megatron-LM's model of the nearest size (Narayanan et al. 2021, Table 1: hidden and heads;
// GPT-3's below 1.7B), with as many layers as the stated count needs (12h^2 a layer, the embedding
// V x h). Its FLOPs per token are 6N whatever the shape; the shape sets the GEMMs' widths.
ModelConfig gpt_of_size(double params, const std::string& name, PublishedRun& run) {
  struct Shape {
    double size_b;
    int64_t hidden, heads;
  };
  // Below 1.7B, GPT-3's small models (Brown et al. 2020, Table 2.1).
  static const Shape kTable1[] = {{0.125, 768, 12},    {0.35, 1024, 16},    {0.76, 1536, 16},
                                  {1.3, 2048, 16},     {1.7, 2304, 24},     {3.6, 3072, 32},
                                  {7.5, 4096, 32},     {18.4, 6144, 48},    {39.1, 8192, 64},
                                  {76.1, 10240, 80},   {145.6, 12288, 96},  {310.1, 16384, 128},
                                  {529.6, 20480, 128}, {1008.0, 25600, 160}};
  if (!(params >= 1e7 && params <= 1e15))
    throw Refusal{"model.params_b = " + std::to_string(params / 1e9) +
                  " with no dimensions: outside 0.01B-10^6 B, no GPT shape given to it"};
  const double size_b = params / 1e9;
  const Shape* best = &kTable1[0];
  for (const Shape& shape : kTable1)
    if (std::fabs(std::log(shape.size_b / size_b)) < std::fabs(std::log(best->size_b / size_b)))
      best = &shape;
  ModelConfig m;
  m.arch = Architecture::GPT2;
  m.tied_embeddings = true;
  m.n_embd = best->hidden;
  m.n_head = m.n_kv_head = best->heads;
  m.ffn_hidden = 4 * m.n_embd;
  m.vocab_size = run.conventions.unstated_vocab > 0 ? run.conventions.unstated_vocab : 51200;
  const double h = static_cast<double>(m.n_embd);
  m.n_layer = std::max<int64_t>(
      1, std::llround((params - static_cast<double>(m.vocab_size) * h) / (12 * h * h)));
  char text[256];
  std::snprintf(text, sizeof text,
                "model dimensions not stated, no preset for '%s': a GPT of %.4g B in the shape of "
                "Megatron-LM's %.4g B (Narayanan et al. 2021 Table 1: hidden %lld, %lld heads), "
                "%lld layers",
                name.c_str(), size_b, best->size_b, static_cast<long long>(m.n_embd),
                static_cast<long long>(m.n_head), static_cast<long long>(m.n_layer));
  run.assumptions.push_back(text);
  return m;
}

// The context of a GPT named by its generation where the record leaves it out: GPT-2's 1024,
// GPT-3's 2048 (Radford et al. 2019; Brown et al. 2020).
int64_t gpt_generation_context(const std::string& name) {
  const std::string lower = lowercase(name);
  // Not "GPT 2B" or "GPT 2.7B": a digit followed by a size is the size.
  static const std::regex gpt3(R"(gpt[\s_-]*3(?![0-9.]|\s*b\b))"),
      gpt2(R"(gpt[\s_-]*2(?![0-9.]|\s*b\b))");
  if (std::regex_search(lower, gpt3)) return 2048;
  if (std::regex_search(lower, gpt2)) return 1024;
  return 0;
}

}  // namespace

ModelConfig gpt_in_megatron_shape(double params, const std::string& name, PublishedRun& run) {
  return gpt_of_size(params, name, run);
}

ModelConfig model_of(const RunFields& f, PublishedRun& run) {
  const std::string name = f.text("model.name");
  const std::optional<int64_t> layers = f.integer("model.layers"), hidden = f.integer("model.hidden"),
                               heads = f.integer("model.heads");
  ModelConfig m;
  const std::optional<PublishedModel> named = find_published_model(name);
  if (named && !named->not_representable.empty()) throw Refusal{named->name + ": " + named->not_representable};
  if (named && !named->approximation.empty()) {
    // A model loom holds only approximately is taken whole from its preset, whatever the run
    // states, so the stand-in stays the one its comment describes.
    if ((layers && *layers != named->config.n_layer) || (hidden && *hidden != named->config.n_embd))
      throw Refusal{"model.name '" + name + "' reads as " + named->name + ", but its layers or hidden size differ from it"};
    m = named->config;
    run.assumptions.push_back("model from preset " + named->name + ": " + named->approximation);
    if (!f.integer("model.seq_len"))
      run.assumptions.push_back("seq_len not stated: the preset's " +
                                std::to_string(m.max_seq_len));
  } else if (layers && hidden && heads) {
    m.n_layer = *layers;
    m.n_embd = *hidden;
    m.n_head = *heads;
    m.n_kv_head = f.integer("model.kv_heads").value_or(m.n_head);
    const std::optional<int64_t> ffn = f.integer("model.ffn");
    m.ffn_hidden = ffn.value_or(4 * m.n_embd);
    const std::optional<int64_t> vocab = f.integer("model.vocab");
    m.vocab_size =
        vocab.value_or(run.conventions.unstated_vocab > 0 ? run.conventions.unstated_vocab : 51200);
    // Grouped-query attention or a Llama name means SwiGLU + RMSNorm + RoPE; otherwise the
    // GPT layout (Megatron GPT, MPT) with tied embeddings.
    const bool llama = m.n_kv_head < m.n_head || lowercase(name).find("llama") != std::string::npos;
    m.arch = llama ? Architecture::Llama : Architecture::GPT2;
    m.tied_embeddings = !llama;
    if (!ffn) run.assumptions.push_back(llama ? "ffn not stated: 4h" : "ffn not stated: 4h (GPT)");
    if (!vocab)
      run.assumptions.push_back(
          run.conventions.unstated_vocab > 0
              ? "vocab not stated: " + std::to_string(m.vocab_size) + " (" +
                    run.conventions.unstated_vocab_why + ")"
              : "vocab not stated: 51,200 (GPT-2's BPE padded as Megatron-LM pads it)");
    if (f.find("model.moe") != nullptr) read_moe(f, ffn.has_value(), m, run);
    // What a record's columns cannot say but its named architecture does: heads wider or
    // narrower than hidden / heads (Qwen3, Mistral NeMo), a sliding window (Mistral 7B).
    if (named && named->config.n_layer == m.n_layer && named->config.n_embd == m.n_embd &&
        named->config.n_head == m.n_head) {
      if (named->config.attention_head_dim > 0) {
        m.attention_head_dim = named->config.attention_head_dim;
        run.assumptions.push_back(
            "heads " + std::to_string(m.attention_head_dim) + " wide (not hidden / heads = " +
            std::to_string(m.n_embd / m.n_head) + ") from preset " + named->name);
      }
      if (named->config.sliding_window > 0 && m.arch == Architecture::Llama) {
        m.sliding_window = named->config.sliding_window;
        m.global_attention_every = named->config.global_attention_every;
        run.assumptions.push_back("a " + std::to_string(m.sliding_window) +
                                  "-key sliding window from preset " + named->name);
      }
    }
  } else if (!named) {
    if (run.params <= 0)
      throw Refusal{
          "model dimensions (layers, hidden, heads) are not stated, nor params_b, and no "
          "published architecture matches model.name '" +
          name + "'"};
    // Only a dense GPT of unknown shape: not a named family's size that has no preset, not a
    // mixture of experts, not a record that states some dimensions but not all.
    const std::string family = published_family(name);
    static const std::regex moe_name(R"(moe|mixture|expert|[0-9]x[0-9]|-a[0-9.]+b)");
    if (layers || hidden || heads || f.find("model.moe") != nullptr ||
        std::regex_search(lowercase(name), moe_name) ||
        !(family.empty() || family == "gpt2" || family == "gpt3"))
      throw Refusal{
          "model dimensions (layers, hidden, heads) are not all stated and no published "
          "architecture matches model.name '" +
          name + "'"};
    m = gpt_of_size(run.params, name, run);
    if (const std::optional<int64_t> vocab = f.integer("model.vocab"); vocab && *vocab > 0) {
      m.vocab_size = *vocab;
      run.assumptions.push_back("vocab " + std::to_string(*vocab) + " as stated");
    }
    if (!f.integer("model.seq_len")) {
      const int64_t context = gpt_generation_context(name);
      if (context == 0) throw Refusal{"model.seq_len is not stated"};
      m.max_seq_len = context;
      run.assumptions.push_back("seq_len not stated: " + std::to_string(context) +
                                ", its GPT generation's");
    }
  } else {
    const std::optional<PublishedModel>& preset = named;
    m = preset->config;
    run.assumptions.push_back("model from preset " + preset->name + " (" + preset->source.substr(0, preset->source.find(',')) + ")");
    if (const std::optional<int64_t> vocab = f.integer("model.vocab");
        vocab && *vocab != m.vocab_size) {
      if (*vocab < 1)
        throw Refusal{"model.vocab = " + std::to_string(*vocab) + " is not a vocabulary size"};
      run.assumptions.push_back("vocab " + std::to_string(*vocab) +
                                " as stated, not the preset's " + std::to_string(m.vocab_size));
      m.vocab_size = *vocab;
    } else if (!vocab && run.conventions.unstated_vocab > 0 &&
               run.conventions.unstated_vocab != m.vocab_size) {
      m.vocab_size = run.conventions.unstated_vocab;
      run.assumptions.push_back("vocab not stated: " + std::to_string(m.vocab_size) + " (" +
                                run.conventions.unstated_vocab_why + "), not the preset's");
    }
    if (!f.integer("model.seq_len")) run.assumptions.push_back("seq_len not stated: the preset's " + std::to_string(m.max_seq_len));
    const json* gb = f.find("global_batch");
    const bool batch_stated =
        gb != nullptr && !(gb->is_string() && says_not_stated(gb->get<std::string>()));
    if (!batch_stated && preset->batch_tokens > 0) {
      const int64_t seq = f.integer("model.seq_len").value_or(m.max_seq_len);
      run.global_batch = std::max<int64_t>(1, preset->batch_tokens / seq);
      run.assumptions.push_back("global_batch not stated: the model's published batch, " + std::to_string(preset->batch_tokens) +
                                " tokens = " + std::to_string(run.global_batch) + " sequences");
    }
  }
  // A model past 10^15 parameters is a typo, and its parameter count would overflow.
  {
    const double h = static_cast<double>(m.n_embd), layers_d = static_cast<double>(m.n_layer);
    const double experts = static_cast<double>(std::max<int64_t>(1, m.n_experts + m.n_shared_experts));
    const double size = layers_d * (4 * h * h + 3 * h * static_cast<double>(m.ffn_hidden) +
                                    experts * 3 * h * static_cast<double>(m.expert_ffn())) +
                        2 * static_cast<double>(m.vocab_size) * h;
    if (size > 1e15) throw Refusal{"the model comes to about " + std::to_string(size / 1e12) + "T parameters, past 10^15"};
  }
  const std::optional<int64_t> seq = f.integer("model.seq_len");
  // A preset brings its pre-training context, a GPT generation its own (above); dimensions
  // alone bring none.
  if (!seq && layers && hidden && heads && !(named && !named->approximation.empty()))
    throw Refusal{"model.seq_len is not stated"};
  m.max_seq_len = seq.value_or(m.max_seq_len);
  if (m.max_seq_len <= 0) throw Refusal{"model.seq_len is not stated"};
  if (layers && hidden && heads && !named && run.params > 0 && f.integer("model.ffn") && !m.is_moe())
    match_stated_parameters(m, run);
  try {
    m.validate();
  } catch (const Error& e) {
    throw_error("published run '", f.text("id"), "': model: ", e.what());
  }
  return m;
}

}  // namespace loom::plan::published_detail
