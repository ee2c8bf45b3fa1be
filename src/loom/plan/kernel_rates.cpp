// The rates kernels sustain in training, by GPU family: a GEMM's share of the dense peak by its
// shape, and fused attention's by its keys per query and head width; and loom's own CUDA
// engine's memory-bound kernels of a layer (declared in time_model.hpp, which prices a layer and
// a step with them).
#include <algorithm>
#include <cmath>

#include "loom/plan/time_model.hpp"

namespace loom::plan {

// A part's measured share of its own peak over the H100's (GpuSpec::mamf_share; 80.3% on an
// H100 SXM): 1 where the part has no measurement.
double sustained_share(const GpuSpec& gpu) {
  constexpr double kH100Share = 0.803;
  return gpu.mamf_share > 0 ? gpu.mamf_share / kH100Share : 1.0;
}

double GemmEfficiency::curve(double m, double n, double k) const {
  auto saturate = [&](double d) { return d / (d + half_dim); };
  return peak_fraction * saturate(m) * saturate(n) * saturate(k);
}

double GemmEfficiency::efficiency(double m, double n, double k) const {
  if (!measured) return curve(m, n, k);
  const GemmGrid& g = *measured;
  const double mc = std::clamp(m, g.m.front(), g.m.back()),
               nc = std::clamp(n, g.n.front(), g.n.back()),
               kc = std::clamp(k, g.k.front(), g.k.back());
  // No shape beats the peak, which is the best rate the grid measured.
  return std::min(std::exp(g.at(mc, nc, kc)) * curve(m, n, k) / curve(mc, nc, kc),
                  1.0);  // NaN stays NaN
}

// What training sustains end to end, per GPU family: the two numbers were chosen on a coarse
// grid (fraction in steps of 0.05, half_dim in powers of 2) against the 28 utilisation figures
// of published/public_runs.json (`loom plan --validate`): A100 0.75 (Narayanan et al. 2021
// report 163-171 of 312 TFLOP/s end to end with recomputation, MosaicML 0.60-0.74 HFU) and
// H100 0.60 (MosaicML's H100 HFU tops out at 0.59: at these peaks kernels, launches and
// overlap lose more). half_dim 256: a 2048-wide GEMM runs at 89% of a large one. Other parts
// take the H100 figure scaled by sustained_share.
GemmEfficiency default_gemm_efficiency(const GpuSpec& gpu) {
  const bool ampere = ampere_part(gpu);
  return {ampere ? 0.75 : 0.60 * sustained_share(gpu), 256};
}

// Fused attention runs at its own rate, not a GEMM's: a kernel that keeps its tiles on chip
// loses little to a 64- or 128-wide head (FlashAttention-2 at head 64 runs about 0.87x its
// rate at 128: Dao 2023, Fig. 4), so the head width saturates at 24, the keys per query at 256
// (short sequences spend more of the kernel on its diagonal block and its prologue). The two
// fractions are what training sustains end to end, chosen like the GEMM ones on a 0.05 grid:
// against the long-sequence rows of llm-foundry's benchmark tables (scripts/train/benchmarking/
// README.md at 061f2c7: 201 rows, 512 to 65,536 tokens, heads of 64 and 128, whose 18 the shared
// file holds) and the shared file's flash-attention runs. A100 0.40 (about 105 TFLOP/s at 128-wide
// heads and long sequences), H100 0.25 (about 210: 2023's kernels were not Hopper's); H200 takes
// the H100 figure; other parts it scaled by sustained_share, as the GEMM share is.
double fused_attention_efficiency(const GpuSpec& gpu, double keys, double head_dim,
                                  double kernel_speedup) {
  const bool ampere = ampere_part(gpu);
  const double fraction = (ampere ? 0.40 : 0.25 * sustained_share(gpu)) * kernel_speedup;
  return fraction * keys / (keys + 256) * head_dim / (head_dim + 24);
}

// job.stream_bytes_per_s, or `otherwise` (the GPU's bandwidth) where no profile measured one.
double streaming_rate(const TrainingJob& job, double otherwise) {
  return job.stream_bytes_per_s > 0 ? job.stream_bytes_per_s : otherwise;
}

// loom's CUDA engine's memory-bound kernels of one layer, forward and backward, counted from the
// kernels it launches (model/block.cpp, kernels/cuda/norms.cu; an H100 profile of GPT-2 124M and
// llama-1b, docs/results/h100-2026-11-27, shows which). Norms, per row: each of the two reads its
// input and writes its output forward (2 tensors of the stream's width), and backward reads the
// output gradient, the input and the residual gradient it accumulates into, and writes that
// (4), its weight partials reading the output gradient and the input again (2): 16. Streams: the
// two residual adds forward (3 each: ops::add_into), the two residual-gradient copies backward
// (2 each), attention's row dot of the output and its gradient (2 q), and for Llama RoPE on q and
// k forward and backward (2 each) and SwiGLU (reads gate and up, writes the product; backward
// reads the gradient and both, writes two: 8 of ffn). GPT-2's GELU runs in the GEMM epilogues.
// Norms, adds and copies on the rank's rows (1/tp under sp), the rest on the whole rows' tp share.
double loom_cuda_layer_memory_s(const ModelConfig& m, const PlanLayout& l, const TrainingJob& job,
                                double norm_bytes_per_s) {
  const double b = job.memory.activation_bytes;
  const double rows = static_cast<double>(l.micro_batch * job.seq_len / l.cp),
               t = static_cast<double>(l.tp);
  const double local_rows = l.sequence_parallel ? rows / t : rows;
  const double c = static_cast<double>(m.n_embd), q = static_cast<double>(m.q_dim()) / t,
               kv = static_cast<double>(m.kv_dim()) / t, f = static_cast<double>(m.ffn_hidden) / t;
  const double norms = 16 * c * local_rows * b;
  double stream = (10 * c * local_rows + 2 * q * rows) * b;
  if (m.arch == Architecture::Llama) {
    const double dense_share =
        1 - static_cast<double>(m.moe_layer_count()) / static_cast<double>(m.n_layer);
    stream += (4 * (q + kv) + 8 * f * dense_share) * rows * b;
  }
  return norms / norm_bytes_per_s + stream / streaming_rate(job, norm_bytes_per_s);
}

}  // namespace loom::plan
