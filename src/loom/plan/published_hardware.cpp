// The hardware a published run ran on (hardware.*): the GPU preset its printed name reads as,
// a stated peak, memory or power limit, the NVLink domain and the nodes (published_fields.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <regex>
#include <string>

#include "loom/core/error.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/published_fields.hpp"
#include "loom/plan/published_runs.hpp"

namespace loom::plan::published_detail {

// The file names GPUs as their sources print them ("A100-SXM4-80GB", "H100 80GB", "V100 32GB
// (DGX-2)", "AMD MI250X GCD", "GH200 120GB"). TPUs and unknown GPUs are refused.
std::string preset_of_gpu(const std::string& printed) {
  const std::string g = lowercase(printed);
  if (g.find("tpu") != std::string::npos)
    throw Refusal{"hardware.gpu '" + printed + "' is a TPU: the planner models GPUs only"};
  if (g.find("a100") != std::string::npos)
    return g.find("40") != std::string::npos ? "a100-40gb" : "a100-80gb";
  if (g.find("v100") != std::string::npos)
    return std::regex_search(g, std::regex(R"(16\s*g)")) ? "v100-16gb" : "v100-32gb";
  // Before "h200": a Grace Hopper superchip, 96 GB HBM3 unless it says 144 (HBM3e).
  if (g.find("gh200") != std::string::npos)
    return g.find("144") != std::string::npos ? "gh200-144gb" : "gh200";
  if (std::regex_search(g, std::regex(R"((^|[^a-z0-9])h20($|[^0-9]))"))) return "h20";
  // AMD Instinct: "MI250X", "Instinct MI300X", "MI355X" (the longer names first).
  for (const char* name : {"mi250x", "mi250", "mi300x", "mi325x", "mi350x", "mi355x"})
    if (g.find(name) != std::string::npos) return name;
  if (g.find("h800") != std::string::npos) return "h800-sxm";
  if (g.find("a800") != std::string::npos) return "a800-80gb";
  if (g.find("h100") != std::string::npos) {
    if (g.find("pcie") != std::string::npos) return "h100-pcie";
    if (std::regex_search(g, std::regex(R"(h100[\s_-]*nvl(?!ink))"))) return "h100-nvl";
    return "h100-sxm";
  }
  for (const char* name : {"gb300", "gb200", "h200", "b300", "b200"})
    if (g.find(name) != std::string::npos) return name;
  throw Refusal{"no GPU preset matches hardware.gpu '" + printed +
                "' (known: V100 16/32GB, A100 40/80GB, A800, H100 SXM/PCIe/NVL, H800, H200, GH200, "
                "H20, B200, "
                "B300, GB200, GB300, MI250X, MI250, MI300X, MI325X, MI350X, MI355X)"};
}

// The GPU and the cluster a run ran on (hardware.*): the part's preset, a stated peak, memory or
// power limit, the NVLink domain and the nodes.
namespace {
// 0.514 -> "51.4%".
std::string percent(double fraction) {
  char text[16];
  std::snprintf(text, sizeof text, "%.1f%%", 100 * fraction);
  return text;
}
}  // namespace

void read_hardware(const RunFields& f, PublishedRun& run) {
  run.cluster.gpu = gpu_preset(preset_of_gpu(f.text("hardware.gpu")));
  const GpuSpec preset_gpu = run.cluster.gpu;
  const std::optional<double> stated_peak = f.number("hardware.peak_dense_tflops_assumed");
  // An MI250(X) package holds two GCDs, each its own device to ROCm and to the planner. A record
  // that gives the package's memory (128 GB) or peak (362-383 TF) counts packages as GPUs, and
  // its per-GPU figures are two GCDs' (Databricks' MI250 blog does): not split here.
  if (preset_gpu.name.rfind("mi250", 0) == 0 &&
      (f.number("hardware.gpu_mem_gb").value_or(0) > 100 ||
       stated_peak.value_or(0) > 1.5 * preset_gpu.bf16_tflops))
    throw Refusal{"hardware.gpu '" + f.text("hardware.gpu") +
                  "' is given as a whole package (128 GB or its 362-383 TF peak: two GCDs); the "
                  "planner's GPU is "
                  "one GCD, as ROCm counts them: state the record per GCD (64 GB, half the peak, "
                  "twice the GPUs)"};
  if (stated_peak) run.cluster.gpu.bf16_tflops = *stated_peak;
  if (run.cluster.gpu.name.rfind("mi250", 0) == 0)
    run.assumptions.push_back("an " + run.cluster.gpu.name +
                              " GPU is one GCD (half a package), as ROCm and Frontier count them");
  if (amd_part(run.cluster.gpu)) {
    const double share = run.cluster.gpu.mamf_share;
    run.assumptions.push_back("AMD part: the Hopper family's GEMM and attention efficiencies" +
                              (share > 0 ? " x its measured matmul ceiling over the H100's (" +
                                               percent(share) +
                                               " of its peak against 80.3%, Bekman's MAMF table)"
                                         : std::string(" (no AMD run calibrates them)")));
  }
  if (const std::optional<double> mem = f.number("hardware.gpu_mem_gb");
      mem && std::fabs(*mem * 1024.0 * 1024.0 * 1024.0 - run.cluster.gpu.hbm_bytes) > 1e9) {
    run.cluster.gpu.hbm_bytes = *mem * 1024.0 * 1024.0 * 1024.0;
    run.assumptions.push_back(
        "HBM from hardware.gpu_mem_gb: " + std::to_string(static_cast<int>(*mem)) + " GiB");
  }
  // A power limit below the part's TDP lowers its clocks: dynamic power goes as f V^2 with V
  // roughly proportional to f, so the sustained clock, and the tensor-core peak with it, scales
  // as (limit / TDP)^(1/3). torchtitan's H100s ran at 500 W of 700 (0.89x).
  {
    std::smatch watts;
    const std::string text = lowercase(f.text("hardware.gpu") + " " + f.text("hardware.notes"));
    if (std::regex_search(
            text, watts,
            std::regex(
                R"(([0-9]{3,4})\s*w\s*power\s*limit|power\s*limit\D{0,12}([0-9]{3,4})\s*w)"))) {
      const double limit = std::stod(watts[1].matched ? watts[1].str() : watts[2].str());
      if (limit < run.cluster.gpu.tdp_watts) {
        const double scale = std::cbrt(limit / run.cluster.gpu.tdp_watts);
        if (!f.number("hardware.peak_dense_tflops_assumed")) run.cluster.gpu.bf16_tflops *= scale;
        run.cluster.gpu.fp8_tflops *= scale;
        run.cluster.gpu.fp4_tflops *= scale;
        char text_scale[160];
        std::snprintf(
            text_scale, sizeof text_scale,
            "%.0f W power limit of a %.0f W part: tensor-core peak x %.3f ((limit / TDP)^(1/3))",
            limit, run.cluster.gpu.tdp_watts, scale);
        run.assumptions.push_back(text_scale);
      }
    }
  }
  run.cluster.inter_node_bytes_per_s_per_gpu = default_inter_node_bytes_per_s(run.cluster.gpu);
  const std::optional<int64_t> per_node = f.integer("hardware.gpus_per_node");
  // A Grace-Blackwell NVL72 rack (GB200, GB300) joins its 72 GPUs, 4 to a compute tray, by one
  // NVLink switch fabric: the NVLink domain is the rack, not the tray.
  const std::string system =
      lowercase(f.text("hardware.gpu") + " " + f.text("hardware.intra_node") + " " +
                f.text("hardware.notes"));
  const bool nvl72 = !contains_any(system, {"gb200", "gb300", "nvl72"}).empty();
  // GH200 systems (CSCS Alps, JUPITER, Isambard-AI) put four superchips in a node.
  const bool gh200 = run.cluster.gpu.name.rfind("gh200", 0) == 0;
  int64_t nvlink_domain = per_node.value_or(gh200 ? 4 : 8);
  if (nvl72 && nvlink_domain < 72) {
    nvlink_domain = 72;
    run.assumptions.push_back("NVL72 system: one NVLink domain of 72 GPUs");
  } else if (!per_node) {
    run.assumptions.push_back(gh200
                                  ? "gpus_per_node not stated: 4 (GH200 nodes: CSCS Alps, JUPITER)"
                                  : "gpus_per_node not stated: 8 (HGX/DGX baseboard)");
  }
  const int64_t gpus = run.layout.gpus();
  run.cluster.gpus_per_node = std::max<int64_t>(1, std::min(gpus, nvlink_domain));
  if (nvl72 && gpus > nvlink_domain) {
    // A job larger than one rack takes the fewest racks and as many 4-GPU trays in each (256
    // GPUs: 4 racks of 64, not three full racks and 40 GPUs), so every rack holds the same
    // share of each group.
    const int64_t racks = (gpus + nvlink_domain - 1) / nvlink_domain;
    if (gpus % racks == 0 && (gpus / racks) % 4 == 0) {
      run.cluster.gpus_per_node = gpus / racks;
      char text[128];
      std::snprintf(text, sizeof text, "%lld GPUs on %lld NVL72 racks, %lld in each",
                    static_cast<long long>(gpus), static_cast<long long>(racks),
                    static_cast<long long>(gpus / racks));
      run.assumptions.push_back(text);
    }
  }
  run.cluster.nodes =
      std::max<int64_t>(1, (gpus + run.cluster.gpus_per_node - 1) / run.cluster.gpus_per_node);
}

}  // namespace loom::plan::published_detail
