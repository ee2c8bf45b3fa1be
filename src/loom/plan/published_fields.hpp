#pragma once
// What published_runs.cpp and published_model_reader.cpp share: a refusal, text helpers and
// RunFields, which reads one run's fields naming the run and the field in every error.
// Internal to the published-runs reader.
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/model/config.hpp"
#include "loom/plan/published_runs.hpp"

namespace loom::plan::published_detail {

using nlohmann::json;

// A run the planner cannot predict, and why (not a fault of the file).
struct Refusal {
  std::string why;
};

inline std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

inline std::string contains_any(const std::string& text, std::initializer_list<const char*> words) {
  for (const char* w : words)
    if (text.find(w) != std::string::npos) return w;
  return "";
}

// Reads fields of one run, naming the run and the field in every error. A path is
// "section.key" or "section.sub.key".
class RunFields {
 public:
  RunFields(const json& run, std::string id) : run_(run), id_(std::move(id)) {}

  const json* find(const std::string& path) const {
    const json* node = &run_;
    std::stringstream parts(path);
    std::string part;
    while (std::getline(parts, part, '.')) {
      if (!node->is_object()) return nullptr;
      auto it = node->find(part);
      if (it == node->end() || it->is_null()) return nullptr;
      node = &*it;
    }
    return node;
  }
  std::optional<double> number(const std::string& path) const {
    const json* v = find(path);
    if (v == nullptr) return std::nullopt;
    if (v->is_number()) return v->get<double>();
    // A number written as a string ("8", "0.42", "1e9") is read as that number; anything else
    // in the string is not guessed at.
    if (v->is_string()) {
      const std::string t = v->get<std::string>();
      char* end = nullptr;
      const double parsed = std::strtod(t.c_str(), &end);
      if (!t.empty() && end != nullptr && *end == '\0' && std::isfinite(parsed)) return parsed;
    }
    throw_error("published run '", id_, "': ", path, " = ", v->dump(), " is not a number");
  }
  std::optional<int64_t> integer(const std::string& path) const {
    const std::optional<double> v = number(path);
    if (!v) return std::nullopt;
    if (*v < 0 || *v != std::floor(*v))
      throw_error("published run '", id_, "': ", path, " = ", *v, " is not a non-negative integer");
    // Far above anything built (10,000 layers, a 10^6-wide residual stream, 10^8-token contexts
    // and vocabularies, 10^7 GPUs), so a typo cannot overflow the models' integer arithmetic.
    const double limit = integer_limit(path);
    if (*v > limit)
      throw_error("published run '", id_, "': ", path, " = ", *v, " is out of range (at most ", limit, ")");
    return static_cast<int64_t>(*v);
  }
  static double integer_limit(const std::string& path) {
    static const std::vector<std::pair<std::string, double>> limits = {
        {"model.layers", 1e4},           {"model.hidden", 1e6},       {"model.heads", 1e5},
        {"model.kv_heads", 1e5},         {"model.ffn", 1e7},          {"model.vocab", 1e8},
        {"model.seq_len", 1e8},          {"model.moe.routed_experts", 1e5}, {"model.moe.top_k", 1e5},
        {"model.moe.shared_experts", 1e3}, {"model.moe.expert_ffn", 1e7}, {"micro_batch", 1e7},
        {"hardware.gpus_per_node", 1e4}};
    for (const auto& [name, limit] : limits)
      if (path == name) return limit;
    return 1e7;  // parallel degrees, GPU counts, dense-layer counts
  }
  std::string text(const std::string& path) const {
    const json* v = find(path);
    if (v == nullptr) return "";
    if (!v->is_string()) throw_error("published run '", id_, "': ", path, " = ", v->dump(), " is not a string");
    return v->get<std::string>();
  }
  std::optional<bool> flag(const std::string& path) const {
    const json* v = find(path);
    if (v == nullptr) return std::nullopt;
    if (v->is_boolean()) return v->get<bool>();
    if (v->is_string()) {
      const std::string t = lowercase(v->get<std::string>());
      if (t == "true" || t == "yes") return true;
      if (t == "false") return false;
    }
    throw_error("published run '", id_, "': ", path, " = ", v->dump(), " is not true or false");
  }
  // Sections must be objects when present.
  void require_object(const std::string& path) const {
    const json* v = find(path);
    if (v != nullptr && !v->is_object()) throw_error("published run '", id_, "': ", path, " is not an object");
  }

 private:
  const json& run_;
  std::string id_;
};

// The layout a run states (parallelism.*) into run.layout, with the rules for what it leaves
// out (published_layout.cpp).
void read_layout(const RunFields& f, PublishedRun& run);

// The model a run describes: its dimensions (with model.moe and the MLP form a stated
// parameter count settles), or a named preset; refuses what ModelConfig cannot hold.
ModelConfig model_of(const RunFields& f, PublishedRun& run);

// The attention a run ran (run.flash_attention, run.attention_kernel_speedup) from its
// `attention` field (flash | materialized, checked by the caller) or the kernel its lower-case
// `notes` name, else its source's date; and where the source's labels name the norm kernel,
// run.unfused_rmsnorm. Each rule applied is added to run.assumptions (published_kernels.cpp).
void read_kernels(const RunFields& f, const std::string& notes, const std::string& attention,
                  PublishedRun& run);

}  // namespace loom::plan::published_detail
