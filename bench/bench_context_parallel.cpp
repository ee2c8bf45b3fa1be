// Context-parallel training throughput under mpirun: every rank of the world is one cp rank
// (cp = ranks), one core each, a small Llama-style model on long sequences, forward and backward
// of one sequence per step, for each cp_comm. With one rank it runs the baseline instead: the
// whole sequence in one process with --threads threads (run it with as many as the cp run has
// cores: its best settings on the same cores; a separate launch, since MPI ranks waiting at a
// barrier spin and would take the baseline's cores). One JSON object per line: ms per step,
// tokens/s, MFU against the measured one-core SGEMM peak times the cores used, attention compute
// and exposed communication per step (the slowest rank's), wire bytes sent per step per rank,
// and the activation peak per rank (the allocator's).
//   mpirun -np C bench_context_parallel [--steps S] [--seq T] [--layers L] [--embd D]
//                                       [--heads H] [--kv-heads K] [--comm p2p,allgather,a2a]
//   bench_context_parallel --threads C [same options]      (the baseline)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/allocator.hpp"
#include "loom/core/rng.hpp"
#include "loom/dist/runtime.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/flops.hpp"
#include "loom/model/transformer.hpp"
#include "loom/obs/trace.hpp"
#include "loom/parallel/context_parallel.hpp"

namespace {

struct Measured {
  double step_s = 0, attention_s = 0, exposed_comm_s = 0, wire_bytes = 0;
  double activation_peak = 0;
};

double activation_peak() {
  return static_cast<double>(
      loom::HostAllocator::instance().stats().peak_bytes[static_cast<size_t>(loom::MemCategory::Activations)]);
}

// Steps of forward + backward on one sequence; `cp` null runs the whole sequence here.
Measured run(const loom::ModelConfig& config, const std::vector<int32_t>& tokens, int64_t seq, int64_t steps,
             const std::shared_ptr<loom::ContextAttention>& cp, const std::shared_ptr<loom::ProcessGroup>& group) {
  loom::Transformer model(config);
  model.init_weights(1);
  if (cp) model.set_context_parallel(cp);
  Measured m;
  for (int64_t s = 0; s <= steps; ++s) {  // step 0 warms up
    model.zero_grad();
    if (cp) {
      cp->reset_timing();
      group->reset_stats();
    }
    if (group) group->barrier();
    loom::HostAllocator::instance().reset_peaks();
    const double start = loom::TraceRecorder::now_s();
    model.forward(tokens.data(), tokens.data() + 1, 1, seq, {true, 1.0f / static_cast<float>(seq)});
    model.backward();
    if (group) group->barrier();
    if (s == 0) continue;
    const double n = static_cast<double>(steps);
    m.step_s += (loom::TraceRecorder::now_s() - start) / n;
    m.activation_peak = std::max(m.activation_peak, activation_peak());
    if (cp) {
      m.attention_s += cp->timing().compute_s / n;
      m.exposed_comm_s += cp->timing().exposed_comm_s / n;
      int64_t sent = 0;
      for (int64_t b : group->stats().bytes_sent) sent += b;
      m.wire_bytes += static_cast<double>(sent) / n;
    }
  }
  return m;
}

// The largest of every rank's value.
double max_over(loom::ProcessGroup& group, double value) {
  float v = static_cast<float>(value);
  std::vector<float> all(static_cast<size_t>(group.size()));
  loom::comm::all_gather(group, &v, all.data(), 1)->wait();
  return *std::max_element(all.begin(), all.end());
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 2, seq = 8192, layers = 2, embd = 128, heads = 4, kv_heads = 2;
  int threads = 1;
  std::string comms = "p2p,allgather,a2a";
  CLI::App app{"loom context-parallel benchmark (run under mpirun, cp = ranks)"};
  app.add_option("--steps", steps);
  app.add_option("--seq", seq, "tokens per sequence (one sequence per step)");
  app.add_option("--layers", layers);
  app.add_option("--embd", embd);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--comm", comms, "cp_comm values, comma-separated");
  app.add_option("--threads", threads, "threads of the one-rank baseline");
  CLI11_PARSE(app, argc, argv);

  loom::DistRuntime runtime;
  const auto world = runtime.world();
  const int64_t ranks = world->size();
  loom::ModelConfig config;  // Llama style: RoPE, RMSNorm, SwiGLU, GQA
  config.arch = loom::Architecture::Llama;
  config.vocab_size = 512;
  config.max_seq_len = seq;
  config.n_layer = layers;
  config.n_embd = embd;
  config.n_head = heads;
  config.n_kv_head = kv_heads;
  config.ffn_hidden = 3 * embd;
  config.tied_embeddings = false;
  config.validate();
  const loom::CounterRng rng(5, 0);
  std::vector<int32_t> tokens(static_cast<size_t>(seq + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % 512);
  const double flops_per_step = loom::flops_per_token(config, seq) * static_cast<double>(seq);
  loom::cpu::set_num_threads(1);
  const double core_gflops = loom::cpu::measure_sgemm_gflops();

  auto report = [&](const std::string& way, int64_t cp, const Measured& m, double peak_gflops) {
    const nlohmann::json out = {
        {"cp_comm", way},
        {"cp", cp},
        {"seq", seq},
        {"layers", layers},
        {"embd", embd},
        {"ms_per_step", 1e3 * m.step_s},
        {"tokens_per_s", static_cast<double>(seq) / m.step_s},
        {"mfu", flops_per_step / m.step_s / (peak_gflops * 1e9)},
        {"attention_ms_per_step", 1e3 * m.attention_s},
        {"exposed_comm_ms_per_step", 1e3 * m.exposed_comm_s},
        {"wire_mb_sent_per_step_per_rank", m.wire_bytes / 1e6},
        {"activation_peak_mb_per_rank", m.activation_peak / 1e6},
        {"sgemm_peak_gflops", peak_gflops},
    };
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  };
  if (ranks == 1) {  // the baseline
    loom::cpu::set_num_threads(threads);
    report("none", 1, run(config, tokens, seq, steps, nullptr, nullptr), core_gflops * threads);
    return 0;
  }

  std::stringstream list(comms);
  for (std::string name; std::getline(list, name, ',');) {
    const loom::CpComm comm = loom::parse_cp_comm(name, "--comm");
    const auto attention = loom::make_context_attention(world, comm);
    Measured m = run(config, tokens, seq, steps, attention, world);
    m.step_s = max_over(*world, m.step_s);
    m.attention_s = max_over(*world, m.attention_s);
    m.exposed_comm_s = max_over(*world, m.exposed_comm_s);
    m.wire_bytes = max_over(*world, m.wire_bytes);
    m.activation_peak = max_over(*world, m.activation_peak);
    if (world->rank() == 0) report(name, ranks, m, core_gflops * static_cast<double>(ranks));
  }
  return 0;
}
