#include "loom/plan/layout.hpp"

#include <sstream>

#include "loom/core/error.hpp"

namespace loom::plan {

std::string PlanLayout::describe() const {
  std::ostringstream out;
  out << "tp=" << tp << " pp=" << pp;
  if (vp > 1) out << " v=" << vp;
  out << " dp=" << dp;
  if (cp > 1) out << " cp=" << cp;
  if (ep > 1) out << " ep=" << ep;
  out << " zero=" << zero_stage << " mbs=" << micro_batch << " recompute=" << recompute_name(recompute);
  if (sequence_parallel) out << " sp";
  if (pp > 1) out << " " << schedule_name(schedule);
  return out.str();
}

namespace {

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
int64_t positive_int(const std::string& key, const std::string& value) { return integer_at_least(key, value, 1); }

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

PlanLayout parse_layout(const std::string& text) {
  PlanLayout layout;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw_error("layout: '", item, "' is not key=value");
    const std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key == "tp") layout.tp = positive_int(key, value);
    else if (key == "pp") layout.pp = positive_int(key, value);
    else if (key == "v" || key == "vp") layout.vp = positive_int(key, value);
    else if (key == "dp") layout.dp = positive_int(key, value);
    else if (key == "cp") layout.cp = positive_int(key, value);
    else if (key == "ep") layout.ep = positive_int(key, value);
    else if (key == "mbs") layout.micro_batch = positive_int(key, value);
    else if (key == "zero") layout.zero_stage = static_cast<int>(integer_at_least(key, value, 0));
    else if (key == "recompute") layout.recompute = parse_recompute(value);
    else if (key == "sp") layout.sequence_parallel = value == "1" || value == "true";
    else if (key == "schedule") {
      if (value == "afab") layout.schedule = PipelineSchedule::AllForwardAllBackward;
      else if (value == "1f1b") layout.schedule = PipelineSchedule::OneFOneB;
      else if (value == "interleaved") layout.schedule = PipelineSchedule::Interleaved;
      else throw_error("layout: schedule=", value, " is not one of afab, 1f1b, interleaved");
    } else {
      throw_error("layout: unknown key '", key, "' (known: tp, pp, v, dp, cp, ep, zero, mbs, recompute, sp, schedule)");
    }
  }
  if (layout.vp > 1 && layout.schedule == PipelineSchedule::OneFOneB) layout.schedule = PipelineSchedule::Interleaved;
  return layout;
}

void check_layout(const PlanLayout& l, const ModelConfig& m, int64_t seq_len) {
  const std::string where = "layout " + l.describe() + ": ";
  if (l.zero_stage < 0 || l.zero_stage > 3) throw_error(where, "ZeRO stage ", l.zero_stage, " is not 0-3");
  if (m.n_head % l.tp != 0) throw_error(where, m.n_head, " attention heads do not split over tp=", l.tp);
  if (m.n_kv_head % l.tp != 0 && l.tp % m.n_kv_head != 0)
    throw_error(where, m.n_kv_head, " KV heads neither split over nor replicate evenly across tp=", l.tp);
  if (m.ffn_hidden % l.tp != 0) throw_error(where, "FFN width ", m.ffn_hidden, " does not split over tp=", l.tp);
  if (m.n_layer % (l.pp * l.vp) != 0)
    throw_error(where, m.n_layer, " layers do not split into pp x v = ", l.pp * l.vp, " equal stages");
  if (seq_len % (2 * l.cp) != 0 && l.cp > 1)
    throw_error(where, "sequence ", seq_len, " does not split into 2 x cp = ", 2 * l.cp, " chunks (load-balanced ring)");
  if (l.vp > 1 && l.pp == 1) throw_error(where, "interleaving (v=", l.vp, ") needs pipeline parallelism (pp > 1)");
  if (l.sequence_parallel && l.tp == 1) throw_error(where, "sequence parallelism needs tp > 1");
  if (l.ep > 1 && !m.is_moe()) throw_error(where, "expert parallelism needs a mixture-of-experts model; this one is dense");
  if (l.ep > 1 && m.n_experts % l.ep != 0)
    throw_error(where, m.n_experts, " experts do not split over ep=", l.ep);
  // Experts are sharded over ranks that would otherwise be data-parallel replicas (Megatron-LM
  // and DeepSpeed-MoE carve ep out of dp x cp), so ep must divide dp x cp.
  if ((l.dp * l.cp) % l.ep != 0)
    throw_error(where, "ep=", l.ep, " does not divide dp x cp = ", l.dp * l.cp, " (experts shard over data-parallel ranks)");
}

}  // namespace loom::plan
