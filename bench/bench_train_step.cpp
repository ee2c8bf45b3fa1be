// Training-step throughput of loom on the CPU: one full step (forward, backward, clipping,
// AdamW) of a preset model on random tokens, timed after warm-up. Prints one JSON object.
// MFU is model FLOPs (model/flops.hpp) per second over the SGEMM rate this same program
// measures on the same threads, so the ratio needs no outside number.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/core/rng.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/flops.hpp"
#include "loom/model/transformer.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/grad_clip.hpp"

int main(int argc, char** argv) {
  std::string preset = "gpt2-124m", recompute = "none";
  int64_t batch = 4, seq = 64, steps = 5, warmup = 2, vocab_chunk = loom::kDefaultVocabChunk;
  int threads = 2;
  CLI::App app{"loom training-step benchmark"};
  app.add_option("--preset", preset);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--threads", threads);
  app.add_option("--vocab-chunk", vocab_chunk);
  app.add_option("--recompute", recompute);
  CLI11_PARSE(app, argc, argv);

  loom::cpu::set_num_threads(threads);
  const double peak_before = loom::cpu::measure_sgemm_gflops(2048, 3);
  const loom::ModelConfig config = loom::model_preset(preset);
  loom::Transformer model(config, loom::parse_recompute(recompute), vocab_chunk);
  model.init_weights(1);
  loom::AdamW optimizer(model.parameters(), {});
  const loom::CounterRng rng(2, 0);
  std::vector<int32_t> tokens(static_cast<size_t>(batch * seq + 1));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>(rng.bits(i) % static_cast<uint64_t>(config.vocab_size));

  auto step = [&] {
    model.zero_grad();
    model.forward(tokens.data(), tokens.data() + 1, batch, seq, {true, 1.0f / static_cast<float>(batch * seq)});
    model.backward();
    optimizer.step(1e-4, 1.0);  // global-norm clipping at 1.0, then the update
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  std::vector<double> seconds;
  for (int64_t i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double peak_gflops = loom::cpu::measure_sgemm_gflops(2048, 3);
  const double flops = loom::flops_per_token(config, seq) * static_cast<double>(batch * seq);
  const nlohmann::json out = {
      {"engine", "loom"}, {"preset", preset}, {"batch", batch}, {"seq", seq}, {"threads", threads},
      {"recompute", recompute}, {"vocab_chunk", vocab_chunk}, {"steps", steps},
      {"ms_per_step", median * 1e3}, {"ms_per_step_min", seconds.front() * 1e3},
      {"tokens_per_s", static_cast<double>(batch * seq) / median},
      {"model_gflop_per_step", flops / 1e9}, {"sgemm_peak_gflops", peak_gflops}, {"sgemm_peak_before_gflops", peak_before},
      {"achieved_gflops", flops / median / 1e9}, {"mfu", flops / median / (peak_gflops * 1e9)},
      {"peak_memory_bytes", loom::HostAllocator::instance().stats().total_peak_bytes}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
