// The rates kernels sustain in training, by GPU family: a GEMM's share of the dense peak by its
// shape, and fused attention's by its keys per query and head width (declared in
// time_model.hpp, which prices a layer and a step with them).
#include "loom/plan/time_model.hpp"

namespace loom::plan {

double GemmEfficiency::efficiency(double m, double n, double k) const {
  auto saturate = [&](double d) { return d / (d + half_dim); };
  return peak_fraction * saturate(m) * saturate(n) * saturate(k);
}

// What training sustains end to end, per GPU family: the two numbers were chosen on a coarse
// grid (fraction in steps of 0.05, half_dim in powers of 2) against the 28 utilisation figures
// of published/public_runs.json (`loom plan --validate`): A100 0.75 (Narayanan et al. 2021
// report 163-171 of 312 TFLOP/s end to end with recomputation, MosaicML 0.60-0.74 HFU) and
// H100 0.60 (MosaicML's H100 HFU tops out at 0.59: at these peaks kernels, launches and
// overlap lose more). half_dim 256: a 2048-wide GEMM runs at 89% of a large one. H200 and
// B200 take the H100 figure until published runs say otherwise.
GemmEfficiency default_gemm_efficiency(const GpuSpec& gpu) {
  const bool ampere = ampere_part(gpu);
  return {ampere ? 0.75 : 0.60, 256};
}

// Fused attention runs at its own rate, not a GEMM's: a kernel that keeps its tiles on chip
// loses little to a 64- or 128-wide head (FlashAttention-2 at head 64 runs about 0.87x its
// rate at 128: Dao 2023, Fig. 4), so the head width saturates at 24, the keys per query at 256
// (short sequences spend more of the kernel on its diagonal block and its prologue). The two
// fractions are what training sustains end to end, chosen like the GEMM ones on a 0.05 grid:
// against the long-sequence rows of llm-foundry's benchmark tables (scripts/train/benchmarking/
// README.md at 061f2c7: 201 rows, 512 to 65,536 tokens, heads of 64 and 128, whose 18 the shared
// file holds) and the shared file's flash-attention runs. A100 0.40 (about 105 TFLOP/s at 128-wide
// heads and long sequences), H100 0.25 (about 210: 2023's kernels were not Hopper's); H200 and
// B200 take the H100 figure until runs say otherwise.
double fused_attention_efficiency(const GpuSpec& gpu, double keys, double head_dim,
                                  double kernel_speedup) {
  const bool ampere = ampere_part(gpu);
  const double fraction = (ampere ? 0.40 : 0.25) * kernel_speedup;
  return fraction * keys / (keys + 256) * head_dim / (head_dim + 24);
}

}  // namespace loom::plan
