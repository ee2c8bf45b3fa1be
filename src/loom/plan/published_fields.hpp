#pragma once
// What published_runs.cpp and published_model_reader.cpp share: a refusal, text helpers and
// RunFields, which reads one run's fields naming the run and the field in every error.
// Internal to the published-runs reader.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
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

inline std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\n\r");
  if (first == std::string::npos) return "";
  const size_t last = text.find_last_not_of(" \t\n\r");
  return text.substr(first, last - first + 1);
}

// The words a parallel degree's column writes for that parallelism not used, and the rest of
// what tables write in a cell they leave empty.
inline constexpr const char* kNotUsedWords[] = {"n/a", "na", "-", "--", "\u2013", "\u2014"};
inline constexpr const char* kNotStatedWords[] = {
    "", "null", "not stated", "unknown", "unstated", "?", "tbd", "not given", "not reported"};

// An empty cell ("n/a", "-", "N/A", "not stated"): a number or a flag written so is not stated.
// (Text fields keep their words: "none" is a recomputation.)
inline bool says_not_stated(const std::string& text) {
  const std::string t = lowercase(trimmed(text));
  for (const char* w : kNotUsedWords)
    if (t == w) return true;
  for (const char* w : kNotStatedWords)
    if (t == w) return true;
  return false;
}

// "n/a" or a dash in a parallel degree's column is that parallelism not used: 1.
inline bool says_not_used(const std::string& path, const std::string& text) {
  bool degree = false;
  for (const char* d :
       {"parallelism.tp", "parallelism.pp", "parallelism.cp", "parallelism.ep", "parallelism.vp"})
    degree = degree || path == d;
  const std::string t = lowercase(trimmed(text));
  for (const char* w : kNotUsedWords)
    if (degree && t == w) return true;
  return false;
}

// The words a flag or an on/off column takes: 1 on, 0 off, -1 neither.
inline int on_off_word(const std::string& text) {
  const std::string t = lowercase(trimmed(text));
  for (const char* w : {"true", "yes", "y", "on", "enabled", "1"})
    if (t == w) return 1;
  for (const char* w : {"false", "no", "n", "off", "disabled", "0"})
    if (t == w) return 0;
  return -1;
}

// A number as tables print it, or nullopt where the text is something else: "8", "1e9",
// thousands separated ("5,984", "1,280"), approximate ("~380"), with a unit the field has ("80
// GB" or "80 GiB" in a field of GB, read as its bare number would be; "419.7 TFLOP/s", "12 s",
// "42%" for a utilisation, as a fraction) or a note in parentheses ("2 (SP)").
inline std::optional<double> loose_number(const std::string& text, const std::string& path) {
  static const std::regex pattern(
      R"(^(~|about |approx\.? )?\s*([0-9]{1,3}(,[0-9]{3})+(\.[0-9]+)?|[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?)\s*(gib|gb|tflop/s|tflops|tokens/s|s|%)?\s*(\([^()]*\))?$)");
  std::smatch m;
  const std::string t = lowercase(trimmed(text));
  // A cell is short; a long text is not a number (and std::regex recurses per character).
  if (t.size() > 64 || !std::regex_match(t, m, pattern)) return std::nullopt;
  std::string digits = m[2].str();
  digits.erase(std::remove(digits.begin(), digits.end(), ','), digits.end());
  char* end = nullptr;
  double value = std::strtod(digits.c_str(), &end);
  if (end == nullptr || *end != '\0' || !std::isfinite(value)) return std::nullopt;
  const std::string unit = m[6].str();
  const auto ends_with = [&](const char* tail) {
    const std::string x(tail);
    return path.size() >= x.size() && path.compare(path.size() - x.size(), x.size(), x) == 0;
  };
  if (unit == "gib" || unit == "gb") {
    if (!ends_with("_gb")) return std::nullopt;  // read in the field's unit, as its number would be
  } else if (unit == "%") {
    if (!ends_with("mfu") && !ends_with("hfu")) return std::nullopt;
    value /= 100;
  } else if (unit == "tflop/s" || unit == "tflops") {
    if (path.find("tflops") == std::string::npos) return std::nullopt;
  } else if (unit == "tokens/s") {
    if (path.find("tokens_per_s") == std::string::npos) return std::nullopt;
  } else if (unit == "s") {
    if (!ends_with("_s")) return std::nullopt;
  }
  return value;
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
    // A number written as a string ("8", "0.42", "1e9", "5,984", "80 GB") is read as that
    // number, an empty cell ("n/a", "-") as not stated; anything else is not guessed at.
    if (v->is_string()) {
      const std::string t = v->get<std::string>();
      if (says_not_used(path, t)) return 1.0;
      if (says_not_stated(t)) return std::nullopt;
      if (const std::optional<double> parsed = loose_number(t, path)) return parsed;
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
  // A number or true/false where a text is expected (an FSDP column's 0 or 1) is its printed form.
  std::string text(const std::string& path) const {
    const json* v = find(path);
    if (v == nullptr) return "";
    if (v->is_number() || v->is_boolean()) return v->dump();
    if (!v->is_string()) throw_error("published run '", id_, "': ", path, " = ", v->dump(), " is not a string");
    return v->get<std::string>();
  }
  std::optional<bool> flag(const std::string& path) const {
    const json* v = find(path);
    if (v == nullptr) return std::nullopt;
    if (v->is_boolean()) return v->get<bool>();
    if (v->is_number() && (v->get<double>() == 0 || v->get<double>() == 1))
      return v->get<double>() == 1;
    if (v->is_string()) {
      if (const int word = on_off_word(v->get<std::string>()); word >= 0) return word == 1;
      if (says_not_stated(v->get<std::string>())) return std::nullopt;
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

// The GPU preset a printed name reads as ("A100-SXM4-80GB", "GH200", "AMD MI250X"); a TPU or an
// unknown part is a Refusal naming the known ones.
std::string preset_of_gpu(const std::string& printed);

// The GPU and cluster a run ran on (hardware.*) into run.cluster, with what it assumed
// (published_hardware.cpp).
void read_hardware(const RunFields& f, PublishedRun& run);

// The layout a run states (parallelism.*) into run.layout, with the rules for what it leaves
// out (published_layout.cpp).
void read_layout(const RunFields& f, PublishedRun& run);

// The model a run describes: its dimensions (with model.moe and the MLP form a stated
// parameter count settles), or a named preset; refuses what ModelConfig cannot hold.
ModelConfig model_of(const RunFields& f, PublishedRun& run);

// A GPT of `params` parameters in the shape of Megatron-LM's model of the nearest size
// (Narayanan et al. 2021, Table 1), as a record naming only a size gets; the shape is said in
// run.assumptions.
ModelConfig gpt_in_megatron_shape(double params, const std::string& name, PublishedRun& run);

// The attention a run ran (run.flash_attention, run.attention_kernel_speedup) from its
// `attention` field (flash | materialized, checked by the caller) or the kernel its lower-case
// `notes` name, else its source's date; and where the source's labels name the norm kernel,
// run.unfused_rmsnorm. Each rule applied is added to run.assumptions (published_kernels.cpp).
void read_kernels(const RunFields& f, const std::string& notes, const std::string& attention,
                  PublishedRun& run);

}  // namespace loom::plan::published_detail
