#include "loom/plan/published_runs.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/core/error.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/search.hpp"
#include "loom/plan/time_model.hpp"

namespace loom::plan {

const char* published_metric_name(PublishedMetric metric) {
  switch (metric) {
    case PublishedMetric::HfuNarayananEq3: return "HFU (Narayanan eq. 3)";
    case PublishedMetric::MfuSixN: return "MFU (6N + 12Lds)";
    case PublishedMetric::ModelStateGigabytes: return "model states GB";
  }
  return "unknown";
}

namespace {

using nlohmann::json;

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Reads fields of one run, naming the run and the field in every error.
class RunFields {
 public:
  RunFields(const json& run, std::string id) : run_(run), id_(std::move(id)) {}

  const json* find(const std::string& section, const std::string& key) const {
    const json* parent = section.empty() ? &run_ : nullptr;
    if (!section.empty()) {
      auto it = run_.find(section);
      if (it == run_.end() || !it->is_object()) return nullptr;
      parent = &*it;
    }
    auto it = parent->find(key);
    if (it == parent->end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::optional<double> number(const std::string& section, const std::string& key) const {
    const json* v = find(section, key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) throw_error("published run '", id_, "': ", path(section, key), " is not a number");
    return v->get<double>();
  }
  double required(const std::string& section, const std::string& key) const {
    const std::optional<double> v = number(section, key);
    if (!v) throw_error("published run '", id_, "': ", path(section, key), " is missing");
    return *v;
  }
  int64_t integer(const std::string& section, const std::string& key, int64_t fallback) const {
    const std::optional<double> v = number(section, key);
    if (!v) return fallback;
    if (*v < 0 || *v != std::floor(*v))
      throw_error("published run '", id_, "': ", path(section, key), " = ", *v, " is not a non-negative integer");
    return static_cast<int64_t>(*v);
  }
  std::string text(const std::string& section, const std::string& key) const {
    const json* v = find(section, key);
    if (v == nullptr) return "";
    if (!v->is_string()) throw_error("published run '", id_, "': ", path(section, key), " is not a string");
    return v->get<std::string>();
  }
  bool flag(const std::string& section, const std::string& key) const {
    const json* v = find(section, key);
    return v != nullptr && v->is_boolean() && v->get<bool>();
  }
  const std::string& id() const { return id_; }

 private:
  static std::string path(const std::string& section, const std::string& key) {
    return section.empty() ? key : section + "." + key;
  }
  const json& run_;
  std::string id_;
};

// The file names GPUs as their sources print them ("A100-SXM4-80GB", "H100 80GB").
std::string preset_of_gpu(const std::string& printed, const std::string& id) {
  const std::string g = lowercase(printed);
  if (g.find("a100") != std::string::npos) return g.find("40") != std::string::npos ? "a100-40gb" : "a100-80gb";
  for (const char* name : {"h100", "h200", "b200"})
    if (g.find(name) != std::string::npos) return name == std::string("h100") ? "h100-sxm" : name;
  throw_error("published run '", id, "': no GPU preset matches hardware.gpu '", printed, "'; known: ",
              "A100 40/80GB, H100, H200, B200");
}

Recompute recompute_of(const std::string& printed) {
  const std::string r = lowercase(printed);
  if (r.rfind("full", 0) == 0) return Recompute::Full;
  if (r.find("selective") != std::string::npos) return Recompute::Selective;
  return Recompute::None;
}

ModelConfig model_of(const RunFields& f) {
  ModelConfig m;
  m.n_layer = f.integer("model", "layers", 0);
  m.n_embd = f.integer("model", "hidden", 0);
  m.n_head = f.integer("model", "heads", 0);
  m.n_kv_head = f.integer("model", "kv_heads", m.n_head);
  m.ffn_hidden = f.integer("model", "ffn", 4 * m.n_embd);
  m.vocab_size = f.integer("model", "vocab", 0);
  m.max_seq_len = f.integer("model", "seq_len", 0);
  // Grouped-query attention or a Llama name means SwiGLU + RMSNorm + RoPE; otherwise the
  // GPT layout (Megatron GPT, MPT).
  const bool llama = m.n_kv_head < m.n_head || lowercase(f.text("model", "name")).find("llama") != std::string::npos;
  m.arch = llama ? Architecture::Llama : Architecture::GPT2;
  m.tied_embeddings = !llama;
  try {
    m.validate();
  } catch (const Error& e) {
    throw_error("published run '", f.id(), "': model: ", e.what());
  }
  return m;
}

PublishedRun parse_run(const json& entry, size_t index) {
  if (!entry.is_object()) throw_error("published runs: entry ", index, " is not an object");
  const std::string id = entry.contains("id") && entry["id"].is_string() ? entry["id"].get<std::string>()
                                                                          : "#" + std::to_string(index);
  const RunFields f(entry, id);
  PublishedRun run;
  run.id = id;
  run.source = f.text("", "source");
  run.uncertain = f.flag("", "uncertain");
  run.params = f.number("model", "params_b").value_or(0) * 1e9;
  run.layout.tp = std::max<int64_t>(1, f.integer("parallelism", "tp", 1));
  run.layout.pp = std::max<int64_t>(1, f.integer("parallelism", "pp", 1));
  run.layout.dp = std::max<int64_t>(1, f.integer("parallelism", "dp", 1));
  run.layout.cp = std::max<int64_t>(1, f.integer("parallelism", "cp", 1));
  run.layout.ep = std::max<int64_t>(1, f.integer("parallelism", "ep", 1));
  run.layout.zero_stage = static_cast<int>(f.integer("parallelism", "zero_stage", 0));
  run.layout.sequence_parallel = f.flag("parallelism", "sequence_parallel");
  const int64_t gpus = f.integer("parallelism", "total_gpus", run.layout.gpus());
  if (gpus != run.layout.gpus())
    throw_error("published run '", id, "': parallelism.total_gpus = ", gpus, " but tp x pp x dp x cp = ", run.layout.gpus());

  if (f.text("", "kind") == "analytic_memory_reference") {
    run.metric = PublishedMetric::ModelStateGigabytes;
    run.published = f.required("measured", "memory_per_gpu_gb");
    if (run.params <= 0) throw_error("published run '", id, "': model.params_b is needed for a memory reference");
    return run;
  }

  run.model = model_of(f);
  run.seq_len = f.integer("model", "seq_len", 0);
  run.global_batch = f.integer("", "global_batch", 0);
  if (run.seq_len <= 0 || run.global_batch <= 0)
    throw_error("published run '", id, "': model.seq_len and global_batch are needed for a throughput run");
  run.cluster.gpu = gpu_preset(preset_of_gpu(f.text("hardware", "gpu"), id));
  if (const std::optional<double> peak = f.number("hardware", "peak_dense_tflops_assumed")) run.cluster.gpu.bf16_tflops = *peak;
  run.cluster.inter_node_bytes_per_s_per_gpu = default_inter_node_bytes_per_s(run.cluster.gpu);
  run.cluster.gpus_per_node = std::min(gpus, f.integer("hardware", "gpus_per_node", 8));
  run.cluster.nodes = gpus / run.cluster.gpus_per_node;
  run.layout.recompute = recompute_of(f.text("", "recompute"));
  const std::string attention = f.text("", "attention");
  if (!attention.empty() && attention != "flash" && attention != "materialized")
    throw_error("published run '", id, "': attention = '", attention, "'; expected flash or materialized");
  run.flash_attention = attention != "materialized";
  run.layout.micro_batch = f.integer("", "micro_batch", 0);
  run.micro_batch_stated = run.layout.micro_batch > 0;
  run.layout.vp = f.integer("parallelism", "vp", 0);
  run.vp_stated = run.layout.vp > 0 || run.layout.pp == 1;
  if (run.layout.pp == 1) run.layout.vp = 1;
  run.published_tokens_per_s_per_gpu = f.number("measured", "tokens_per_s_per_gpu").value_or(0);
  if (const std::optional<double> mfu = f.number("measured", "mfu")) {
    run.metric = PublishedMetric::MfuSixN;
    run.published = *mfu;
  } else if (const std::optional<double> hfu = f.number("measured", "hfu")) {
    run.metric = PublishedMetric::HfuNarayananEq3;
    run.published = *hfu;
  } else {
    throw_error("published run '", id, "': measured.mfu or measured.hfu is needed for a throughput run");
  }
  return run;
}

double metric_of(const PublishedRun& run, double step_s) {
  const ModelConfig& m = run.model;
  const double gpus = static_cast<double>(run.layout.gpus()), peak = run.cluster.gpu.bf16_tflops * 1e12;
  const double s = static_cast<double>(run.seq_len), h = static_cast<double>(m.n_embd);
  const double l = static_cast<double>(m.n_layer), v = static_cast<double>(m.vocab_size);
  if (run.metric == PublishedMetric::HfuNarayananEq3) {
    const double b = static_cast<double>(run.global_batch);
    const double flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
    return flops / (step_s * gpus * peak);
  }
  const double n = run.params > 0 ? run.params : static_cast<double>(m.parameter_count());
  const double tokens_per_s_per_gpu = static_cast<double>(run.global_batch) * s / step_s / gpus;
  return tokens_per_s_per_gpu * (6 * n + 12 * l * h * s) / peak;
}

std::vector<int64_t> choices(int64_t stated, const std::vector<int64_t>& otherwise) {
  return stated > 0 ? std::vector<int64_t>{stated} : otherwise;
}

}  // namespace

std::vector<PublishedRun> read_published_runs(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error("published runs: cannot open '", path, "'");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    throw_error("published runs: '", path, "' is not valid JSON: ", e.what());
  }
  if (!doc.is_array()) throw_error("published runs: '", path, "' must hold a JSON array of runs");
  std::vector<PublishedRun> runs;
  for (size_t i = 0; i < doc.size(); ++i) runs.push_back(parse_run(doc[i], i));
  return runs;
}

RunCheck check_published_run(const PublishedRun& run) {
  RunCheck check;
  check.run = &run;
  check.layout = run.layout;
  if (run.metric == PublishedMetric::ModelStateGigabytes) {
    check.predicted = zero_model_states(run.params, kMixedPrecisionAdam, run.layout.dp, run.layout.zero_stage).total() / 1e9;
    check.relative_error = check.predicted / run.published - 1;
    return check;
  }
  TrainingJob job;
  job.seq_len = run.seq_len;
  job.global_batch = run.global_batch;
  job.memory.seq_len = run.seq_len;
  job.memory.flash_attention = run.flash_attention;
  const double usable = run.cluster.gpu.hbm_bytes * kUsableMemoryFraction;
  bool have = false;
  for (int64_t mbs : choices(run.micro_batch_stated ? run.layout.micro_batch : 0, {1, 2, 4, 8, 16})) {
    for (int64_t vp : choices(run.vp_stated ? run.layout.vp : 0, {1, 2, 3, 4, 5, 6, 8})) {
      PlanLayout l = run.layout;
      l.micro_batch = mbs;
      l.vp = vp;
      l.schedule = vp > 1 ? PipelineSchedule::Interleaved : PipelineSchedule::OneFOneB;
      if (run.global_batch % (l.dp * mbs) != 0 || run.model.n_layer % (l.pp * vp) != 0) continue;
      job.memory.micro_batches = run.global_batch / (l.dp * mbs);
      if (vp > 1 && job.memory.micro_batches % l.pp != 0) continue;
      const double memory = predict_gpu_memory(run.model, l, job.memory).total();
      const StepTime t = predict_step_time(run.model, l, run.cluster, job);
      const bool fits = memory <= usable;
      // Prefer layouts that fit; among equals, the faster one (what the source would have run).
      const bool better = !have || (fits && !check.fits) ||
                          (fits == check.fits && t.tokens_per_s / static_cast<double>(l.gpus()) > check.tokens_per_s_per_gpu);
      if (!better) continue;
      have = true;
      check.layout = l;
      check.fits = fits;
      check.memory_gib = memory / (1024.0 * 1024.0 * 1024.0);
      check.tokens_per_s_per_gpu = t.tokens_per_s / static_cast<double>(l.gpus());
      check.predicted = metric_of(run, t.total_s);
    }
  }
  if (!have) throw_error("published run '", run.id, "': no micro-batch size splits global batch ", run.global_batch, " over dp = ", run.layout.dp);
  check.relative_error = check.predicted / run.published - 1;
  return check;
}

ValidationSummary summarize(const std::vector<RunCheck>& checks) {
  ValidationSummary s;
  std::vector<double> errors;
  for (const RunCheck& c : checks) {
    const double e = std::fabs(c.relative_error);
    if (c.run->metric == PublishedMetric::ModelStateGigabytes) {
      ++s.memory_runs;
      s.worst_memory_abs_error = std::max(s.worst_memory_abs_error, e);
      continue;
    }
    ++s.throughput_runs;
    if (e <= 0.15) ++s.within_15_percent;
    errors.push_back(e);
  }
  if (!errors.empty()) {
    std::sort(errors.begin(), errors.end());
    const size_t n = errors.size();
    s.median_abs_error = n % 2 == 1 ? errors[n / 2] : (errors[n / 2 - 1] + errors[n / 2]) / 2;
  }
  return s;
}

}  // namespace loom::plan
