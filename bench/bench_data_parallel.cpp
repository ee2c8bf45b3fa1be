// Data-parallel training throughput under mpirun: a ~14M-parameter GPT-2-style model, a fixed
// per-rank batch (weak scaling), gradient buckets all-reduced during backward. Rank 0 prints
// one JSON object: tokens/s over all ranks, time per step, communication time (first bucket
// issued to last bucket done), the part of it that backward did not hide (waiting in
// finish()), and the overlap fraction = 1 - exposed / communication.
// With --zero-stage 1-3 the step runs through ZeroOptimizer instead, and the JSON adds each
// rank's live bytes of parameters, gradients and optimizer state and its wire bytes per step.
//   mpirun -np N bench_data_parallel [--steps S] [--bucket-mb M] [--zero-stage Z]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <nlohmann/json.hpp>

#include "loom/core/rng.hpp"
#include "loom/dist/runtime.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/transformer.hpp"
#include "loom/obs/trace.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/zero_optimizer.hpp"
#include "loom/optim/adamw.hpp"

int main(int argc, char** argv) {
  int64_t batch = 4, seq = 128, steps = 5, warmup = 1;
  double bucket_mb = 25.0;
  int zero_stage = 0;
  CLI::App app{"loom data-parallel benchmark (run under mpirun)"};
  app.add_option("--batch", batch, "sequences per rank");
  app.add_option("--seq", seq);
  app.add_option("--steps", steps);
  app.add_option("--bucket-mb", bucket_mb);
  app.add_option("--zero-stage", zero_stage)->check(CLI::Range(0, 3));
  CLI11_PARSE(app, argc, argv);

  loom::DistRuntime runtime;
  const auto world = runtime.world();
  loom::cpu::set_num_threads(1);  // one core per rank
  loom::ModelConfig config;       // GPT-2 style, 6 x 384, 8192-token vocabulary: 13.7M params
  config.vocab_size = 8192;
  config.max_seq_len = seq;
  config.n_layer = 6;
  config.n_embd = 384;
  config.n_head = config.n_kv_head = 6;
  config.ffn_hidden = 4 * 384;
  loom::Transformer model(config);
  model.init_weights(1);
  const bool sharded = zero_stage > 0 && world->size() > 1;
  std::unique_ptr<loom::AdamW> optimizer;
  std::unique_ptr<loom::ZeroOptimizer> zero;
  std::unique_ptr<loom::GradientBucketReducer> reducer;
  if (sharded) {
    zero = std::make_unique<loom::ZeroOptimizer>(
        model, world, loom::ZeroConfig{zero_stage, static_cast<int64_t>(bucket_mb * 1e6), false}, loom::AdamWConfig{});
  } else {
    optimizer = std::make_unique<loom::AdamW>(model.parameters(), loom::AdamWConfig{});
  }
  if (!sharded && world->size() > 1) {
    reducer = std::make_unique<loom::GradientBucketReducer>(
        model.parameters_in_grad_ready_order(), world, static_cast<int64_t>(bucket_mb * 1e6));
    reducer->attach(model);
  }
  const loom::CounterRng rng(3, static_cast<uint64_t>(world->rank()));
  std::vector<int32_t> tokens(static_cast<size_t>(batch * seq + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % 8192);

  double total_s = 0, comm_s = 0, exposed_s = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    world->barrier();
    world->reset_stats();
    const double start = loom::TraceRecorder::now_s();
    if (zero) zero->zero_grad();
    else model.zero_grad();
    model.forward(tokens.data(), tokens.data() + 1, batch, seq, {true, 1.0f / static_cast<float>(batch * seq)});
    model.backward();
    double step_comm = 0, step_exposed = 0;
    if (reducer) {
      const double wait_start = loom::TraceRecorder::now_s();
      reducer->finish();
      step_exposed = loom::TraceRecorder::now_s() - wait_start;
      step_comm = reducer->last_timings().back().finished_s - reducer->last_timings().front().issued_s;
    }
    if (zero) zero->step(1e-4, 1.0);
    else optimizer->update(1e-4);
    if (s >= warmup) {
      total_s += loom::TraceRecorder::now_s() - start;
      comm_s += step_comm;
      exposed_s += step_exposed;
    }
  }
  if (world->rank() == 0) {
    const double step_s = total_s / static_cast<double>(steps);
    const nlohmann::json out = {
        {"ranks", world->size()}, {"parameters", config.parameter_count()}, {"batch_per_rank", batch},
        {"seq", seq}, {"buckets", reducer ? reducer->bucket_count() : 0},
        {"ms_per_step", step_s * 1e3},
        {"tokens_per_s", static_cast<double>(batch * seq * world->size()) / step_s},
        {"comm_ms_per_step", comm_s / static_cast<double>(steps) * 1e3},
        {"exposed_comm_ms_per_step", exposed_s / static_cast<double>(steps) * 1e3},
        {"overlap_fraction", comm_s > 0 ? 1.0 - exposed_s / comm_s : 0.0},
        {"zero_stage", sharded ? zero_stage : 0},
        {"wire_bytes_sent_per_step", std::accumulate(world->stats().bytes_sent.begin(), world->stats().bytes_sent.end(), int64_t{0})},
        {"live_bytes",
         {{"parameters", loom::HostAllocator::instance().live_bytes(loom::MemCategory::Parameters)},
          {"gradients", loom::HostAllocator::instance().live_bytes(loom::MemCategory::Gradients)},
          {"optimizer_state", loom::HostAllocator::instance().live_bytes(loom::MemCategory::OptimizerState)}}}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}
