#include "loom/plan/host_issue.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <regex>

#include "loom/plan/published_runs.hpp"

namespace loom::plan {

double moe_host_forward_ops(const ModelConfig& m, const PlanLayout& l) {
  const int64_t moe_layers = m.moe_layer_count();
  if (moe_layers == 0 || m.n_layer <= 0) return 0;
  const double moe_share = static_cast<double>(moe_layers) / static_cast<double>(m.n_layer);
  const double local_experts =
      static_cast<double>(m.n_experts) / static_cast<double>(std::max<int64_t>(l.ep, 1));
  return 40 + moe_share * (45 + 4 * local_experts) + (1 - moe_share) * 10;
}

double moe_host_backward_over_forward(const PlanLayout& l, const TrainingJob& job) {
  return 2 + (l.recompute == Recompute::Full ? job.memory.full_recompute_share : 0.0);
}

namespace {

// The NeMo container a Megatron-Bridge table row names ('26.06 NeMo Container', '26.06.01'):
// year, month, patch; {0, 0, 0} when none.
struct Container {
  int year = 0, month = 0, patch = 0;
  bool at_least(int y, int m, int p) const {
    return year != y ? year > y : month != m ? month > m : patch >= p;
  }
};

Container container_of(const std::string& source) {
  static const std::regex pattern(R"((\d\d)\.(\d\d)(?:\.(\d\d))? nemo container)",
                                  std::regex::icase);
  std::smatch match;
  if (!std::regex_search(source, match, pattern)) return {};
  return {std::stoi(match[1]), std::stoi(match[2]), match[3].matched ? std::stoi(match[3]) : 0};
}

}  // namespace

HostIssue published_moe_host_issue(bool megatron_stack, const ModelConfig& m,
                                   const std::string& text, const std::string& source,
                                   const std::string& gpu) {
  if (!megatron_stack || m.moe_layer_count() == 0) return {};
  // One spelling: lowercase, spaces and dashes as underscores ("Qwen3 30B-A3B", "Qwen3_30B_a3B").
  std::string named = text;
  for (char& ch : named)
    ch = ch == ' ' || ch == '-' ? '_'
                                : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (m.moe_capacity_factor > 0 || named.find("tokendrop") != std::string::npos ||
      named.find("token_drop") != std::string::npos)
    return {};  // drop-and-pad: static shapes, no wait
  const Container c = container_of(source);
  // Megatron-Bridge 25.09 (v0.1.0rc3, bf71eba07b: scripts/performance/run_script.py) ran its
  // MoE benchmarks with apply_moe_token_drop (capacity factor 1.0, padded), but DeepSeek-V3 on
  // H100, which took DeepEP's dropless dispatch.
  if (c.year == 25 && c.month == 9 &&
      !(named.find("deepseek") != std::string::npos && gpu.rfind("h100", 0) == 0))
    return {};
  // Its full-iteration CUDA graphs (cuda_graph_impl "full_iteration" with a bounded expert
  // capacity, no wait), per model and GPU from the container that first ran them: commit
  // 55443cbfb (#4211, 26.06) and e80116b22 (#4606, 26.06.01), scripts/performance/configs.
  // GPT-OSS and Kimi K2 never ran them; H100 never did.
  struct Graphs {
    const char* model;
    const char* gpu;
    Container from;
  };
  static const Graphs kFullIteration[] = {
      {"qwen3_30b_a3b", "gb", {26, 6, 0}},     {"qwen3_30b_a3b", "b300", {26, 6, 0}},
      {"qwen3_30b_a3b", "b200", {26, 6, 1}},   {"qwen3_235b_a22b", "gb", {26, 6, 0}},
      {"qwen3_235b_a22b", "b300", {26, 6, 1}}, {"qwen3_235b_a22b", "b200", {26, 6, 1}},
      {"deepseek", "gb", {26, 6, 0}},          {"deepseek", "b300", {26, 6, 1}}};
  for (const Graphs& g : kFullIteration)
    if (named.find(g.model) != std::string::npos && gpu.rfind(g.gpu, 0) == 0 &&
        c.at_least(g.from.year, g.from.month, g.from.patch))
      return {};
  // A Grace-Blackwell system's host is an Arm Grace CPU, slower per PyTorch operation than the
  // DGX parts' Xeons (Transformer Engine issue #2053).
  const bool grace = gpu.rfind("gb", 0) == 0 || gpu.rfind("gh", 0) == 0;
  const double seconds = kMoeHostSecondsPerOp * (grace ? kGraceHostFactor : 1.0);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f us", seconds * 1e6);
  return {seconds,
          std::string(
              "dropless MoE on Megatron-Core: the host waits for each MoE layer's token counts, "
              "then issues its operations one by one; a layer pass takes at least its operations "
              "x ") +
              buf + (grace ? " (a Grace CPU's host: 1.3 x a Xeon's 20 us)" : "") +
              " (docs/PLANNER.md, host-issued MoE layers)"};
}

void apply_moe_host_issue(PublishedRun& run, const std::string& text) {
  const HostIssue host = published_moe_host_issue(run.conventions.megatron, run.model, text,
                                                  run.source, run.cluster.gpu.name);
  if (host.seconds_per_op <= 0) return;
  run.moe_host_s_per_op = host.seconds_per_op;
  run.assumptions.push_back(host.assumption);
}

}  // namespace loom::plan
