#include "loom/plan/hardware.hpp"

#include <cctype>
#include <cmath>

#include "loom/core/error.hpp"

namespace loom::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Tensor-core peaks are written as the datasheet's "with sparsity" figure halved, so each
// number can be checked against its source as printed.
const std::vector<GpuSpec>& presets() {
  static const std::vector<GpuSpec> table = {
      // NVIDIA Tesla V100 datasheet (SXM2, 32 GB; DGX-2 holds 16 on NVSwitch): 125 TF FP16
      // tensor-core peak (Volta has no BF16; the "bf16" field holds the 16-bit tensor peak),
      // HBM2 900 GB/s, NVLink 300 GB/s, 300 W.
      {"v100-32gb", 125.0, 0, 32 * kGiB, 900e9, 300e9 / 2, 300},
      // The same datasheet's 16 GB SXM2 part (DGX-1, Megatron-LM's 2019 runs on DGX-2H used
      // 32 GB): the same compute, HBM2 and NVLink.
      {"v100-16gb", 125.0, 0, 16 * kGiB, 900e9, 300e9 / 2, 300},
      // NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf),
      // SXM column: BF16 624 TF sparse, HBM2 1,555 GB/s, NVLink 600 GB/s, max TDP 400 W.
      // Ampere has no FP8 tensor cores.
      {"a100-40gb", 624.0 / 2, 0, 40 * kGiB, 1555e9, 600e9 / 2, 400},
      // Same datasheet, A100 80GB SXM: HBM2e 2,039 GB/s; everything else as the 40 GB part.
      {"a100-80gb", 624.0 / 2, 0, 80 * kGiB, 2039e9, 600e9 / 2, 400},
      // NVIDIA H100 Tensor Core GPU datasheet (h100-datasheet), SXM column: BF16 1,979 TF and
      // FP8 3,958 TF sparse, HBM3 3.35 TB/s, NVLink 900 GB/s, max TDP 700 W.
      {"h100-sxm", 1979.0 / 2, 3958.0 / 2, 80 * kGiB, 3.35e12, 900e9 / 2, 700, true, 0, 0.803},
      // NVIDIA H800 SXM5 (the export variant of the H100 SXM, product brief): H100 SXM compute
      // and HBM3 (BF16 1,979 TF, FP8 3,958 TF sparse, 80 GB, 3.35 TB/s, 700 W), NVLink cut to
      // 400 GB/s.
      {"h800-sxm", 1979.0 / 2, 3958.0 / 2, 80 * kGiB, 3.35e12, 400e9 / 2, 700, true},
      // The same H100 datasheet, PCIe column: BF16 1,513 TF and FP8 3,026 TF sparse, 80 GB
      // HBM2e at 2.0 TB/s, NVLink bridge 600 GB/s, 350 W; H100 NVL column: BF16 1,671 TF and
      // FP8 3,341 TF sparse, 94 GB HBM3 at 3.9 TB/s, NVLink bridge 600 GB/s, 400 W.
      {"h100-pcie", 1513.0 / 2, 3026.0 / 2, 80 * kGiB, 2.0e12, 600e9 / 2, 350},
      {"h100-nvl", 1671.0 / 2, 3341.0 / 2, 94 * kGiB, 3.9e12, 600e9 / 2, 400},
      // NVIDIA A800 80GB SXM (the export variant of the A100 80GB SXM): A100 compute and HBM2e,
      // NVLink cut to 400 GB/s.
      {"a800-80gb", 624.0 / 2, 0, 80 * kGiB, 2039e9, 400e9 / 2, 400},
      // NVIDIA H200 Tensor Core GPU datasheet, SXM column: same compute as H100 SXM (BF16
      // 1,979 TF, FP8 3,958 TF sparse), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s, up to 700 W.
      {"h200", 1979.0 / 2, 3958.0 / 2, 141 * kGiB, 4.8e12, 900e9 / 2, 700, true, 0, 0.803},
      // NVIDIA GH200 Grace Hopper Superchip datasheet: the H100's tensor cores (BF16 1,979 TF,
      // FP8 3,958 TF sparse) with 96 GB HBM3 at 4 TB/s, or 144 GB HBM3e at 4.9 TB/s; NVLink-C2C
      // to the Grace CPU and NVLink 900 GB/s to other GPUs (CSCS Alps, JUPITER and Isambard-AI
      // join four superchips a node by NVLink, without NVSwitch); the module up to 1,000 W, CPU
      // and memory included.
      {"gh200", 1979.0 / 2, 3958.0 / 2, 96 * kGiB, 4.0e12, 900e9 / 2, 1000},
      {"gh200-144gb", 1979.0 / 2, 3958.0 / 2, 144 * kGiB, 4.9e12, 900e9 / 2, 1000, false, 0, 0.838},
      // NVIDIA H20 (the 2024 export part, HGX H20 product brief): BF16 148 TF and FP8 296 TF
      // dense, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s on the HGX baseboard's NVSwitch, 400 W.
      {"h20", 148.0, 296.0, 96 * kGiB, 4.0e12, 900e9 / 2, 400, true},
      // NVIDIA DGX B200 datasheet / HGX B200 platform specs, per GPU (8 per system): FP8
      // 72 PF and FP16/BF16 36 PF sparse per system -> 9 and 4.5 PF per GPU sparse; 1,440 GB
      // and 64 TB/s HBM3e per system -> 180 GB and 8 TB/s; NVLink 5 1.8 TB/s; 1,000 W. FP4
      // 144 PF sparse per system -> 9 PF dense per GPU.
      {"b200", 36000.0 / 8 / 2, 72000.0 / 8 / 2, 180 * kGiB, 8e12, 1800e9 / 2, 1000, true,
       144000.0 / 8 / 2, 0.776},
      // NVIDIA DGX B300 datasheet, per GPU (8 per system): FP8 72 PF sparse per system as
      // B200 (BF16 not restated there: B200's), 2.3 TB HBM3e -> 288 GB at 8 TB/s, NVLink 5
      // 1.8 TB/s, about 1,100 W. Blackwell Ultra's FP4 is 1.5x Blackwell's: 14 PF dense per
      // B300 (Verda's per-GPU table, "GB300 NVL72: GPU Architecture & Performance", 2025).
      {"b300", 36000.0 / 8 / 2, 72000.0 / 8 / 2, 288 * kGiB, 8e12, 1800e9 / 2, 1100, true, 14000.0,
       0.786},
      // NVIDIA GB200 NVL72 datasheet, per GPU (72 per rack): FP8 720 PF and FP16/BF16 360 PF
      // sparse per rack -> 5 and 2.5 PF dense; 13.4 TB HBM3e at 576 TB/s -> 186 GB, 8 TB/s;
      // NVLink 5 1.8 TB/s; about 1,200 W. FP4 1,440 PF sparse per rack -> 10 PF dense.
      {"gb200", 360000.0 / 72 / 2, 720000.0 / 72 / 2, 186 * kGiB, 8e12, 1800e9 / 2, 1200, true,
       1440000.0 / 72 / 2, 0.729},
      // GB300 NVL72 datasheet: the same FP8 and BF16 per rack as GB200, 20.7 TB HBM3e -> 288 GB;
      // FP4 1,080 PF dense per rack (1,440 sparse) -> 15 PF per GPU.
      {"gb300", 360000.0 / 72 / 2, 720000.0 / 72 / 2, 288 * kGiB, 8e12, 1800e9 / 2, 1400, true,
       1080000.0 / 72},
      // AMD Instinct MI250X and MI250 datasheets, per package of two GCDs: BF16 383.0 and 362.1
      // TF peak (dense; CDNA 2 has no FP8 and no sparsity), 128 GB HBM2e at 3.2 TB/s, 560 W and
      // 500 W. ROCm, and every paper that trains on them (Frontier, LUMI), counts a GCD as one
      // GPU: half of each. Between GCDs, Infinity Fabric: 200 GB/s within a package, 50-100 GB/s
      // between packages of a Frontier node, so a ring of 8 runs at the 50 GB/s links.
      {"mi250x", 383.0 / 2, 0, 64 * kGiB, 3.2e12 / 2, 50e9, 560.0 / 2},
      {"mi250", 362.1 / 2, 0, 64 * kGiB, 3.2e12 / 2, 50e9, 500.0 / 2},
      // AMD Instinct MI300X datasheet: BF16 1,307.4 TF and FP8 2,614.9 TF dense (twice with
      // sparsity), 192 GB HBM3 at 5.3 TB/s, 750 W; seven Infinity Fabric links to the other seven
      // GPUs of a platform, 896 GB/s both ways together (448 GB/s out). MI325X: the same compute,
      // 256 GB HBM3E at 6 TB/s, 1,000 W. MI350X and MI355X (CDNA 4): BF16 2.3 and 2.5 PF, FP8 4.6
      // and 5.0 PF, MXFP4 9.2 and 10 PF dense, 288 GB HBM3E at 8 TB/s, 1,000 W and 1,400 W, seven
      // links of 153.6 GB/s (both ways) each.
      {"mi300x", 1307.4, 2614.9, 192 * kGiB, 5.3e12, 896e9 / 2, 750, false, 0, 0.514},
      {"mi325x", 1307.4, 2614.9, 256 * kGiB, 6.0e12, 896e9 / 2, 1000, false, 0, 0.604},
      {"mi350x", 2300.0, 4600.0, 288 * kGiB, 8e12, 7 * 153.6e9 / 2, 1000, false, 9200.0},
      {"mi355x", 2500.0, 5000.0, 288 * kGiB, 8e12, 7 * 153.6e9 / 2, 1400, false, 10000.0, 0.680},
  };
  return table;
}

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string joined_names() {
  std::string out;
  for (const std::string& name : gpu_preset_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// `!(value >= low)` rather than `value < low` so NaN is rejected too.
void require_range(const char* field, double value, double low, double high, const char* why) {
  if (!(value >= low && value <= high && std::isfinite(value)))
    throw_error("cluster: ", field, " = ", value, " is out of range; expected ", why);
}

void require_positive(const char* field, double value) {
  if (!(value > 0 && std::isfinite(value)))
    throw_error("cluster: ", field, " = ", value, " must be a positive, finite number");
}

}  // namespace

bool ampere_part(const GpuSpec& gpu) { return gpu.name.rfind("a100", 0) == 0 || gpu.name.rfind("a800", 0) == 0; }

bool amd_part(const GpuSpec& gpu) { return gpu.name.rfind("mi", 0) == 0; }

bool grace_part(const GpuSpec& gpu) {
  return gpu.name.rfind("gh200", 0) == 0 || gpu.name.rfind("gb200", 0) == 0 ||
         gpu.name.rfind("gb300", 0) == 0;
}

double host_link_bytes_per_s(const GpuSpec& gpu) {
  const auto starts = [&](const char* prefix) { return gpu.name.rfind(prefix, 0) == 0; };
  if (starts("gh200")) return 900e9 / 2;
  if (grace_part(gpu)) return 900e9 / 2 / 2;  // GB200, GB300: two GPUs a Grace
  if (starts("v100")) return 32e9 / 2;
  if (ampere_part(gpu) || starts("mi250")) return 64e9 / 2;
  return 128e9 / 2;
}

double host_memory_bytes_per_gpu(const GpuSpec& gpu) {
  const auto starts = [&](const char* prefix) { return gpu.name.rfind(prefix, 0) == 0; };
  if (starts("gh200")) return 480e9;
  if (grace_part(gpu)) return 480e9 / 2;  // GB200, GB300: two GPUs a Grace
  if (starts("v100")) return 1.5e12 / 16;
  if (ampere_part(gpu)) return 1e12 / 8;
  if (starts("mi250")) return 512e9 / 8;
  return 2e12 / 8;
}

const GpuSpec& gpu_preset(const std::string& name) {
  const std::string wanted = lowercase(name);
  for (const GpuSpec& spec : presets())
    if (spec.name == wanted) return spec;
  throw_error("unknown GPU preset '", name, "'; valid presets: ", joined_names());
}

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const GpuSpec& spec : presets()) names.push_back(spec.name);
  return names;
}

double default_inter_node_bytes_per_s(const GpuSpec& gpu) {
  // NVIDIA DGX-2: eight 100 Gb/s EDR InfiniBand ports for 16 V100s (6.25 GB/s per GPU).
  if (gpu.name.rfind("v100", 0) == 0) return 8 * 100e9 / 8 / 16;
  // Frontier and LUMI: four 200 Gb/s Slingshot-11 NICs a node of four MI250X (eight GCDs).
  if (gpu.name.rfind("mi250", 0) == 0) return 4 * 200e9 / 8 / 8;
  // CSCS Alps, JUPITER: four 200 Gb/s NICs a node of four GH200.
  if (gpu.name.rfind("gh200", 0) == 0) return 200e9 / 8;
  return ampere_part(gpu) ? 25e9 : 50e9;
}

// The upper bounds only catch typos (an extra zero, watts given as kW); they sit far above
// anything built: NVL72 racks put 72 GPUs in one NVLink domain, the largest announced
// clusters are a few hundred thousand GPUs, and a PUE of 3 is a very poor facility.
void ClusterSpec::validate() const {
  if (gpu.name.empty()) throw_error("cluster: gpu.name is empty; name the GPU or use a preset");
  require_positive("gpu.bf16_tflops", gpu.bf16_tflops);
  require_range("gpu.fp8_tflops", gpu.fp8_tflops, 0, 1e6, ">= 0 (0 = no FP8)");
  require_range("gpu.fp4_tflops", gpu.fp4_tflops, 0, 1e6, ">= 0 (0 = no FP4)");
  require_positive("gpu.hbm_bytes", gpu.hbm_bytes);
  require_positive("gpu.hbm_bandwidth_bytes_per_s", gpu.hbm_bandwidth_bytes_per_s);
  require_range("gpu.nvlink_bytes_per_s", gpu.nvlink_bytes_per_s, 0, 1e15, ">= 0 (0 = none)");
  require_range("gpu.tdp_watts", gpu.tdp_watts, 1, 1e4, "1 to 10,000 W per GPU");
  if (gpus_per_node < 1 || gpus_per_node > 1024)
    throw_error("cluster: gpus_per_node = ", gpus_per_node, " is out of range; expected 1 to 1024");
  if (nodes < 1 || nodes > 10'000'000)
    throw_error("cluster: nodes = ", nodes, " is out of range; expected 1 to 10,000,000");
  if (cores < 0) throw_error("cluster: cores = ", cores, " is out of range; expected >= 0 (0 = one device per rank)");
  if (gpus() > 100'000'000)
    throw_error("cluster: gpus_per_node x nodes = ", gpus(), " exceeds 100,000,000 GPUs");
  require_positive("inter_node_bytes_per_s_per_gpu", inter_node_bytes_per_s_per_gpu);
  require_range("node_overhead_watts", node_overhead_watts, 0, 1e6, "0 to 1,000,000 W per node");
  require_range("pue", pue, 1, 3, "1.0 (no facility overhead) to 3.0");
  require_positive("gpu_mtbf_hours", gpu_mtbf_hours);
  require_positive("node_mtbf_hours", node_mtbf_hours);
  require_positive("storage_write_bytes_per_s", storage_write_bytes_per_s);
  require_range("restart_seconds", restart_seconds, 0, 1e7, "0 to 10,000,000 s");
  require_range("price_per_gpu_hour", price_per_gpu_hour, 0, 1e4, "0 (unpriced) to 10,000");
}

}  // namespace loom::plan
