// Mixture-of-experts layer throughput against a dense SwiGLU MLP with the same active FLOPs,
// forward and backward, in the same run: the MoE layer has E experts of width F and sends each
// token to k of them; the dense MLP has width k F, so both do 6 x 3 C k F FLOPs per token
// (router excluded). The MoE pays for its router, the gather into expert order, per-expert GEMMs
// of uneven sizes (random routing) and the weighted combine. Prints one JSON object: ms per
// step and tokens/s of each, their ratio, GFLOP/s against the measured SGEMM rate, and the
// busiest expert's load over the mean.
//   bench_moe [--tokens T] [--dim C] [--ffn F] [--experts E] [--top-k K] [--steps S] [--threads N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/core/rng.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/moe.hpp"
#include "loom/obs/trace.hpp"

namespace {

void fill(const loom::Tensor& t, uint64_t seed, float scale) {
  const loom::CounterRng rng(seed, 0);
  float* v = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = scale * static_cast<float>(rng.normal(static_cast<uint64_t>(i)));
}

loom::Tensor tensor(const loom::Shape& shape) {
  return loom::Tensor::zeros(shape, loom::DType::F32, loom::MemCategory::Workspace);
}

// The best of `steps` timed runs of `step` after one warm-up.
template <typename Step>
double best_seconds(int64_t steps, Step step) {
  step();
  double best = 1e30;
  for (int64_t s = 0; s < steps; ++s) {
    const double start = loom::TraceRecorder::now_s();
    step();
    best = std::min(best, loom::TraceRecorder::now_s() - start);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 2048, dim = 512, ffn = 1024, experts = 8, top_k = 2, steps = 5;
  int threads = 2;
  CLI::App app{"loom mixture-of-experts layer benchmark"};
  app.add_option("--tokens", tokens);
  app.add_option("--dim", dim);
  app.add_option("--ffn", ffn, "each expert's width");
  app.add_option("--experts", experts);
  app.add_option("--top-k", top_k);
  app.add_option("--steps", steps);
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  loom::cpu::set_num_threads(threads);
  const double sgemm_gflops = loom::cpu::measure_sgemm_gflops(2048, 3);

  const loom::Tensor x = tensor({tokens, dim}), d_out = tensor({tokens, dim});
  fill(x, 1, 1.0f);
  fill(d_out, 2, 1.0f);
  const loom::Tensor out = tensor({tokens, dim}), d_x = tensor({tokens, dim});

  // The MoE layer.
  loom::MoeSpec spec;
  spec.dim = dim, spec.experts = experts, spec.top_k = top_k, spec.ffn_hidden = ffn;
  loom::MoeLayer moe(spec, "moe");
  loom::ParameterList params;
  moe.collect(params);
  for (size_t i = 0; i < params.size(); ++i) fill(params[i]->value, 10 + i, 0.02f);
  loom::MoeStash stash;
  double busiest = 0;
  const double moe_s = best_seconds(steps, [&] {
    moe.forward(out, x, stash);
    moe.backward(d_x, d_out, x, stash, 0.01f, 0.0f);
    const double mean = static_cast<double>(tokens * top_k) / static_cast<double>(experts);
    busiest = static_cast<double>(*std::max_element(stash.counts.begin(), stash.counts.end())) / mean;
  });

  // The dense SwiGLU MLP of width k F: gate | up into one buffer, SwiGLU, down; backward.
  const int64_t wide = top_k * ffn;
  loom::Parameter gate, up, down;
  loom::allocate_parameter(gate, "gate", {wide, dim}, true, false);
  loom::allocate_parameter(up, "up", {wide, dim}, true, false);
  loom::allocate_parameter(down, "down", {dim, wide}, true, false);
  fill(gate.value, 3, 0.02f);
  fill(up.value, 4, 0.02f);
  fill(down.value, 5, 0.02f);
  const loom::Tensor pre = tensor({tokens, 2 * wide}), act = tensor({tokens, wide});
  const loom::Tensor d_pre = tensor({tokens, 2 * wide}), d_act = tensor({tokens, wide});
  const double dense_s = best_seconds(steps, [&] {
    loom::ops::linear_forward(pre, 0, x, gate.value, nullptr);
    loom::ops::linear_forward(pre, wide, x, up.value, nullptr);
    loom::ops::swiglu_forward(act, pre);
    loom::ops::linear_forward(out, 0, act, down.value, nullptr);
    loom::ops::linear_backward(d_act, false, down.grad, loom::Tensor(), d_out, 0, act, down.value);
    loom::ops::swiglu_backward(d_pre, d_act, pre);
    loom::ops::linear_backward(d_x, false, gate.grad, loom::Tensor(), d_pre, 0, x, gate.value);
    loom::ops::linear_backward(d_x, true, up.grad, loom::Tensor(), d_pre, wide, x, up.value);
  });

  const double flops = 6.0 * 3.0 * static_cast<double>(dim * wide) * static_cast<double>(tokens);
  const nlohmann::json report = {
      {"tokens", tokens},
      {"dim", dim},
      {"expert_ffn", ffn},
      {"experts", experts},
      {"top_k", top_k},
      {"threads", threads},
      {"moe_ms", 1e3 * moe_s},
      {"dense_ms", 1e3 * dense_s},
      {"moe_tokens_per_s", static_cast<double>(tokens) / moe_s},
      {"dense_tokens_per_s", static_cast<double>(tokens) / dense_s},
      {"moe_over_dense_time", moe_s / dense_s},
      {"moe_gflops", flops / moe_s / 1e9},
      {"dense_gflops", flops / dense_s / 1e9},
      {"sgemm_peak_gflops", sgemm_gflops},
      {"busiest_expert_over_mean", busiest},
  };
  std::printf("%s\n", report.dump().c_str());
  return 0;
}
