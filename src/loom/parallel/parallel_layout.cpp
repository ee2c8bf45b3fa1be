#include "loom/parallel/parallel_layout.hpp"

#include <algorithm>
#include <functional>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/core/key_values.hpp"

namespace loom {

const char* cp_comm_name(CpComm comm) {
  switch (comm) {
    case CpComm::P2P: return "p2p";
    case CpComm::AllGather: return "allgather";
    case CpComm::AllToAll: return "a2a";
  }
  return "unknown";
}

CpComm parse_cp_comm(const std::string& name, const std::string& config_key) {
  for (CpComm c : {CpComm::P2P, CpComm::AllGather, CpComm::AllToAll})
    if (name == cp_comm_name(c)) return c;
  throw_error("config key '", config_key, "' has value '", name,
              "', expected p2p (ring attention), allgather or a2a (Ulysses)");
}

std::string ParallelLayout::describe() const {
  std::ostringstream out;
  out << "tp=" << tp << " pp=" << pp;
  if (vp > 1) out << " v=" << vp;
  out << " dp=" << dp;
  if (cp > 1) out << " cp=" << cp;
  if (cp > 1 && cp_comm != CpComm::P2P) out << " cp_comm=" << cp_comm_name(cp_comm);
  if (ep > 1) out << " ep=" << ep;
  out << " zero=" << zero_stage << " mbs=" << micro_batch
      << " recompute=" << recompute_name(recompute);
  if (sequence_parallel) out << " sp";
  if (pp > 1) out << " " << schedule_name(schedule);
  return out.str();
}

MeshShape ParallelLayout::mesh_shape() const {
  if (ep < 1 || (dp * cp) % ep != 0)
    throw_error("layout ", describe(), ": ep=", ep, " divides neither dp=", dp,
                " nor dp x cp=", dp * cp, ", so it has no device mesh");
  const bool own_axis = dp % ep == 0;
  return MeshShape{.pp = static_cast<int>(pp),
                   .dp = static_cast<int>(own_axis ? dp / ep : dp),
                   .cp = static_cast<int>(cp),
                   .ep = static_cast<int>(own_axis ? ep : 1),
                   .tp = static_cast<int>(tp)};
}

namespace {

constexpr const char* kKnownKeys = "tp, pp, v, dp, cp, cp_comm, ep, zero, mbs, recompute, sp, schedule";

int64_t integer_at_least(const std::string& key, const std::string& value, int64_t minimum) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || n < minimum)
    throw_error("layout: ", key, "=", value, " is not an integer >= ", minimum);
  return n;
}

bool parse_schedule(const std::string& name, PipelineSchedule& out) {
  for (PipelineSchedule s : all_pipeline_schedules())
    if (name == schedule_name(s)) {
      out = s;
      return true;
    }
  return false;
}

}  // namespace

ParallelLayout parse_layout(const std::string& text, std::vector<std::string>* keys_given) {
  ParallelLayout layout;
  std::vector<std::string> given;
  for (const KeyValueItem& item : split_key_values(text, "layout")) {
    std::string key = item.key == "vp" ? "v" : item.key;
    const std::string& value = item.value;
    if (item.bare) {
      if (key == "sp") {
        layout.sequence_parallel = true;
      } else if (parse_schedule(key, layout.schedule)) {
        key = "schedule";
      } else {
        throw_error("layout: unknown word '", item.key,
                    "' (bare words: sp, afab, 1f1b, interleaved, zbh1, zbv, dualpipev; keys: ", kKnownKeys, ")");
      }
    } else if (key == "tp")
      layout.tp = integer_at_least(key, value, 1);
    else if (key == "pp")
      layout.pp = integer_at_least(key, value, 1);
    else if (key == "v")
      layout.vp = integer_at_least(item.key, value, 1);
    else if (key == "dp")
      layout.dp = integer_at_least(key, value, 1);
    else if (key == "cp")
      layout.cp = integer_at_least(key, value, 1);
    else if (key == "cp_comm")
      layout.cp_comm = parse_cp_comm(value, "cp_comm");
    else if (key == "ep")
      layout.ep = integer_at_least(key, value, 1);
    else if (key == "mbs")
      layout.micro_batch = integer_at_least(key, value, 1);
    else if (key == "zero") {
      layout.zero_stage = static_cast<int>(integer_at_least(key, value, 0));
    } else if (key == "recompute") {
      layout.recompute = parse_recompute(value);
    } else if (key == "sp") {
      if (value == "1" || value == "true" || value == "on")
        layout.sequence_parallel = true;
      else if (value == "0" || value == "false" || value == "off")
        layout.sequence_parallel = false;
      else
        throw_error("layout: sp=", value, " is not one of 1, 0, true, false, on, off");
    } else if (key == "schedule") {
      if (!parse_schedule(value, layout.schedule))
        throw_error("layout: schedule=", value, " is not one of afab, 1f1b, interleaved, zbh1, zbv, dualpipev");
    } else {
      throw_error("layout: unknown key '", item.key, "' (known: ", kKnownKeys, ")");
    }
    if (std::find(given.begin(), given.end(), key) != given.end())
      throw_error("layout '", text, "': ", key, " is given twice");
    given.push_back(key);
  }
  const bool schedule_given = std::find(given.begin(), given.end(), "schedule") != given.end();
  if (layout.vp > 1 && !schedule_given) layout.schedule = PipelineSchedule::Interleaved;
  if (keys_given) *keys_given = std::move(given);
  return layout;
}

namespace {

// The tp degrees up to the head count that pass `fits`, as "1, 2, 4".
std::string tp_values_that(const ModelConfig& m, const std::function<bool(int64_t)>& fits) {
  std::string working;
  for (int64_t tp = 1; tp <= m.n_head; ++tp)
    if (fits(tp)) working += (working.empty() ? "" : ", ") + std::to_string(tp);
  return working;
}

// Heads, MLP columns and vocabulary rows split over tp; KV heads split, or replicate when
// there are fewer of them than ranks (Megatron-LM: each KV head on tp / n_kv_head ranks).
// A hybrid's Mamba-2 mixers split by heads and by B/C groups (Megatron-LM's MambaMixer asserts
// both divide).
bool tp_valid(const ModelConfig& m, int64_t tp) {
  const bool mamba =
      m.hybrid_layer_count('M') == 0 || (m.mamba_heads % tp == 0 && m.mamba_groups % tp == 0);
  return m.n_head % tp == 0 && (m.n_kv_head % tp == 0 || tp % m.n_kv_head == 0) &&
         m.ffn_hidden % tp == 0 && m.vocab_size >= tp && mamba;
}
// The engine's attention splits KV heads only (parallel/tensor_parallel_plan).
bool tp_engine(const ModelConfig& m, int64_t tp) {
  return tp_valid(m, tp) && m.n_kv_head % tp == 0;
}

}  // namespace

std::vector<LayoutProblem> layout_problems(const ParallelLayout& l, const ModelConfig& m,
                                           int64_t seq_len) {
  std::vector<LayoutProblem> out;
  auto invalid = [&](const std::string& key, auto&&... parts) {
    std::ostringstream text;
    (text << ... << parts);
    out.push_back({key, text.str(), LayoutRules::Valid, ""});
  };
  auto unsupported = [&](const std::string& key, const std::string& feature, auto&&... parts) {
    std::ostringstream text;
    (text << ... << parts);
    out.push_back({key, text.str(), LayoutRules::Engine, feature});
  };
  // Ranges first: the rules below divide by these.
  for (auto [key, value] : {std::pair<const char*, int64_t>{"tp", l.tp},
                            {"pp", l.pp},
                            {"v", l.vp},
                            {"dp", l.dp},
                            {"cp", l.cp},
                            {"ep", l.ep},
                            {"mbs", l.micro_batch}})
    if (value < 1) invalid(key, key, "=", value, ", expected >= 1");
  if (l.zero_stage < 0 || l.zero_stage > 3)
    invalid("zero", "ZeRO stage zero=", l.zero_stage, " is not 0, 1, 2 or 3");
  if (!out.empty()) return out;

  // Can the layout run the model at all.
  auto tp_valid_list = [&] {
    return tp_values_that(m, [&](int64_t tp) { return tp_valid(m, tp); });
  };
  if (m.n_head % l.tp != 0)
    invalid("tp", "model.n_head = ", m.n_head, " attention heads do not split over tp=", l.tp,
            "; tp values that work: ", tp_valid_list());
  else if (m.n_kv_head % l.tp != 0 && l.tp % m.n_kv_head != 0)
    invalid("tp", "model.n_kv_head = ", m.n_kv_head,
            " KV heads neither split over nor replicate evenly across tp=", l.tp,
            "; tp values that work: ", tp_valid_list());
  else if (m.ffn_hidden % l.tp != 0)
    invalid("tp", "FFN width model.ffn_hidden = ", m.ffn_hidden, " does not split over tp=", l.tp,
            "; tp values that work: ", tp_valid_list());
  else if (m.vocab_size < l.tp)
    invalid("tp", "model.vocab_size = ", m.vocab_size, " leaves a rank of tp=", l.tp,
            " without a vocabulary row");
  else if (!tp_valid(m, l.tp))
    invalid("tp", "the Mamba-2 mixers' ", m.mamba_heads, " heads in ", m.mamba_groups,
            " groups do not split over tp=", l.tp, "; tp values that work: ", tp_valid_list());
  const bool zbv = stage_placement(l.schedule) == StagePlacement::V;  // zbv, dualpipev
  if (l.vp > 1 && l.pp == 1)
    invalid("v", "interleaving (v=", l.vp, ") needs pipeline parallelism (pp > 1)");
  else if (zbv && l.pp > 1 && l.vp != 2)
    invalid("v", "schedule ", schedule_name(l.schedule), " with v=", l.vp,
            ": the V places exactly 2 model chunks on every rank; set v=2");
  else if (l.vp > 1 && l.schedule != PipelineSchedule::Interleaved && !zbv)
    invalid("v", "v=", l.vp, " model chunks per rank with schedule ", schedule_name(l.schedule),
            ": only interleaved, zbv and dualpipev split a rank's layers into chunks; use schedule interleaved or v=1");
  if (l.vp == 1 && l.schedule == PipelineSchedule::Interleaved && l.pp > 1)
    invalid("schedule",
            "schedule interleaved with v=1: interleaving needs at least 2 model chunks per rank; "
            "set v >= 2 or use 1f1b");
  const int64_t stages = l.pp * l.vp;
  if (stages > m.n_layer)
    invalid("pp", "pp x v = ", stages, " stages for model.n_layer = ", m.n_layer,
            " layers leaves a stage without a layer; use pp x v <= ", m.n_layer);
  if (l.cp > 1 && seq_len % (2 * l.cp) != 0) {
    const int64_t chunks = 2 * l.cp, below = seq_len / chunks * chunks;
    invalid("cp", "sequence ", seq_len, " does not split into 2 x cp = ", chunks,
            " equal chunks (each cp rank holds two, for equal causal work); use a sequence length that is a "
            "multiple of ", chunks, below > 0 ? " (" + std::to_string(below) + " or " + std::to_string(below + chunks) + ")"
                                              : " (" + std::to_string(chunks) + ")",
            " or a cp whose 2 x cp divides ", seq_len);
  }
  if (l.cp > 1 && l.cp_comm == CpComm::AllToAll && m.n_head % l.tp == 0 && m.n_kv_head % l.tp == 0) {
    const int64_t heads = m.n_head / l.tp, kv_heads = m.n_kv_head / l.tp;
    if (heads % l.cp != 0 || kv_heads % l.cp != 0) {
      std::string works;
      for (int64_t c = 2; c <= kv_heads; ++c)
        if (heads % c == 0 && kv_heads % c == 0) works += (works.empty() ? "" : ", ") + std::to_string(c);
      invalid("cp_comm", "cp_comm=a2a (Ulysses) gives each cp rank whole heads, but each tp rank's ", heads,
              " attention heads and ", kv_heads, " kv heads (model.n_head = ", m.n_head, ", model.n_kv_head = ",
              m.n_kv_head, " over tp=", l.tp, ") do not split over cp=", l.cp, "; use cp_comm=p2p or allgather",
              works.empty() ? std::string(", which take any cp") : ", or a cp in " + works);
    }
  }
  if (l.sequence_parallel && l.tp == 1)
    invalid("sp", "sequence parallelism needs tp > 1 (it splits the tensor-parallel ranks' rows); ",
            "set tp > 1 or turn it off");
  if (l.ep > 1 && !m.is_moe())
    invalid("ep", "expert parallelism needs a mixture-of-experts model; this one is dense");
  else if (l.ep > 1 && m.n_experts % l.ep != 0)
    invalid("ep", "model.n_experts = ", m.n_experts, " experts do not split over ep=", l.ep);
  // Experts are sharded over ranks that would otherwise be data-parallel replicas (Megatron-LM
  // and DeepSpeed-MoE carve ep out of dp x cp), so ep must divide dp x cp.
  if ((l.dp * l.cp) % l.ep != 0)
    invalid("ep", "ep=", l.ep, " does not divide dp x cp = ", l.dp * l.cp,
            " (experts shard over data-parallel ranks)");

  // Valid, but not in this engine yet.
  if (m.n_head % l.tp == 0 && m.n_kv_head % l.tp != 0 && l.tp % m.n_kv_head == 0)
    unsupported("tp", "KV-head replication", "tp=", l.tp,
                " replicates model.n_kv_head = ", m.n_kv_head, " KV heads over ",
                l.tp / m.n_kv_head,
                " ranks each, which the engine does not do yet; tp values that work: ",
                tp_values_that(m, [&](int64_t tp) { return tp_engine(m, tp); }));
  if (l.zero_stage >= 2 && l.pp > 1)
    unsupported(
        "zero", "ZeRO-" + std::to_string(l.zero_stage) + " with pp", "zero=", l.zero_stage,
        " with pp=", l.pp,
        ": ZeRO-2/3 reduce-scatter (and ZeRO-3 re-gathers) per micro-batch and per whole-model "
        "unit, "
        "which a pipeline stage running m micro-batches does not have; use zero_stage 0 or 1 with "
        "pipeline parallelism (as DeepSpeed and Megatron-LM do)");
  if (m.is_moe() && m.arch != Architecture::Llama)
    unsupported("model", "GPT-2-style experts", "model.n_experts = ", m.n_experts,
                " with model.arch = gpt2: the engine's mixture-of-experts layers are Llama-style (SwiGLU "
                "experts, Mixtral's layout) so far; use arch = \"llama\"");
  if (m.mtp_layers > 0 && !m.is_hybrid())
    unsupported(
        "model", "multi-token prediction", "model.mtp_layers = ", m.mtp_layers,
        ": the engine trains next-token prediction only; MTP depths are planned, not trained");
  if (m.is_hybrid())  // ModelConfig::validate allows squared-ReLU MLPs and latent experts on
                      // hybrids only
    unsupported("model", "hybrid Mamba stacks",
                "the engine builds transformers of SwiGLU or GELU MLPs; a hybrid Mamba stack, a "
                "squared-ReLU MLP, "
                "latent experts and multi-token prediction are planned, not trained");
  return out;
}

void check_layout(const ParallelLayout& l, const ModelConfig& m, int64_t seq_len,
                  LayoutRules rules) {
  for (const LayoutProblem& p : layout_problems(l, m, seq_len))
    if (p.level == LayoutRules::Valid || rules == LayoutRules::Engine)
      throw_error("layout ", l.describe(), ": ", p.message);
}

std::string engine_support_note(const ParallelLayout& l, const ModelConfig& m, int64_t seq_len) {
  std::string note;
  for (const LayoutProblem& p : layout_problems(l, m, seq_len))
    if (p.level == LayoutRules::Engine)
      note += (note.empty() ? "engine: not yet supported: " : ", ") + p.feature;
  return note;
}

}  // namespace loom
