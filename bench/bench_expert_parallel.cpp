// Expert parallelism under mpirun: every rank is a data-parallel rank with its own tokens (one
// core each), and one mixture-of-experts layer runs forward and backward over them, first with
// every expert on every rank (ep = 1, the baseline: no all-to-all, each rank multiplies its own
// tokens by all experts' weights), then with the experts spread over the ranks (ep = ranks: each
// rank holds E / ep experts and multiplies every rank's tokens routed to them, which the
// all-to-alls carry). Both in the same launch, on the same cores, tokens and weights. One JSON
// object per line: ms per step (the slowest rank's, best of --steps after a warm-up), GFLOP/s
// per rank (6 x active matmul FLOPs), all-to-all ms and MB sent per rank, and the experts'
// parameter bytes per rank.
//   mpirun -np R bench_expert_parallel [--tokens T] [--dim C] [--ffn F] [--experts E] [--top-k K] [--steps S]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/core/rng.hpp"
#include "loom/dist/runtime.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/moe.hpp"
#include "loom/obs/trace.hpp"
#include "loom/parallel/expert_parallel.hpp"

namespace {

void fill(const loom::Tensor& t, uint64_t seed, uint64_t stream, float scale) {
  const loom::CounterRng rng(seed, stream);
  float* v = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = scale * static_cast<float>(rng.normal(static_cast<uint64_t>(i)));
}

loom::Tensor tensor(const loom::Shape& shape) {
  return loom::Tensor::zeros(shape, loom::DType::F32, loom::MemCategory::Workspace);
}

double max_over(loom::ProcessGroup& group, double value) {
  float v = static_cast<float>(value);
  loom::comm::all_reduce(group, &v, 1, loom::ReduceOp::Max)->wait();
  return v;
}

struct Measured {
  double step_s = 1e30, a2a_s = 0, a2a_bytes = 0, expert_bytes = 0;
};

Measured run(const loom::MoeSpec& base, int ep, loom::ProcessGroup& world,
             const std::shared_ptr<loom::GroupExpertExchange>& exchange, const loom::Tensor& x, int64_t steps) {
  loom::MoeSpec spec = base;
  spec.ep_size = ep;
  spec.ep_rank = ep > 1 ? world.rank() : 0;
  loom::MoeLayer layer(spec, "model.layers.0.block_sparse_moe", ep > 1 ? exchange.get() : nullptr);
  // The same weights at every ep: expert e's from stream e wherever it lives.
  fill(layer.router.value, 1, 0, 0.5f);
  Measured m;
  for (size_t i = 0; i < layer.gate.size(); ++i) {
    const uint64_t e = static_cast<uint64_t>(spec.first_expert()) + i;
    fill(layer.gate[i].value, 2, e, 0.02f);
    fill(layer.up[i].value, 3, e, 0.02f);
    fill(layer.down[i].value, 4, e, 0.02f);
    for (const auto* p : {&layer.gate[i], &layer.up[i], &layer.down[i]}) {
      m.expert_bytes += static_cast<double>(p->value.nbytes());
      p->grad.zero_();
    }
  }
  const loom::Tensor out = tensor(x.shape()), d_x = tensor(x.shape()), d_out = tensor(x.shape());
  fill(d_out, 5, static_cast<uint64_t>(world.rank()), 1e-3f);
  for (int64_t s = 0; s <= steps; ++s) {  // step 0 warms up
    if (exchange) exchange->reset_counters();
    world.barrier();
    const double start = loom::TraceRecorder::now_s();
    loom::MoeStash stash;
    layer.forward(out, x, stash);
    layer.backward(d_x, d_out, x, stash, 0.0f, 0.0f);
    world.barrier();
    if (s == 0) continue;
    const double took = loom::TraceRecorder::now_s() - start;
    if (took < m.step_s) {
      m.step_s = took;
      m.a2a_s = ep > 1 ? exchange->seconds() : 0;
      m.a2a_bytes = ep > 1 ? static_cast<double>(exchange->row_bytes_sent()) : 0;
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 2048, dim = 512, ffn = 1024, experts = 8, top_k = 2, steps = 5;
  CLI::App app{"loom expert-parallel benchmark (run under mpirun; ep = ranks against ep = 1)"};
  app.add_option("--tokens", tokens, "tokens per rank");
  app.add_option("--dim", dim);
  app.add_option("--ffn", ffn, "each expert's width");
  app.add_option("--experts", experts);
  app.add_option("--top-k", top_k);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);

  loom::DistRuntime runtime;
  const auto world = runtime.world();
  const int ranks = world->size();
  if (experts % ranks != 0) {
    std::fprintf(stderr, "--experts %lld does not split over %d ranks\n", static_cast<long long>(experts), ranks);
    return 2;
  }
  loom::cpu::set_num_threads(1);
  const double core_gflops = loom::cpu::measure_sgemm_gflops();
  loom::MoeSpec spec;
  spec.dim = dim;
  spec.experts = experts;
  spec.top_k = top_k;
  spec.ffn_hidden = ffn;
  const loom::Tensor x = tensor({tokens, dim});
  fill(x, 6, static_cast<uint64_t>(world->rank()), 1.0f);  // each rank its own tokens
  const auto exchange = std::make_shared<loom::GroupExpertExchange>(world);
  const double flops = 6.0 * 3.0 * static_cast<double>(dim * ffn * top_k * tokens);  // per rank, on average
  Measured baseline;
  for (int ep : {1, ranks}) {
    Measured m = run(spec, ep, *world, exchange, x, steps);
    m.step_s = max_over(*world, m.step_s);
    m.a2a_s = max_over(*world, m.a2a_s);
    m.a2a_bytes = max_over(*world, m.a2a_bytes);
    if (ep == 1) baseline = m;
    if (world->rank() != 0) continue;
    const nlohmann::json out = {{"ep", ep},
                                {"ranks", ranks},
                                {"tokens_per_rank", tokens},
                                {"dim", dim},
                                {"ffn", ffn},
                                {"experts", experts},
                                {"top_k", top_k},
                                {"ms_per_step", 1e3 * m.step_s},
                                {"vs_ep1", baseline.step_s / m.step_s},
                                {"gflops_per_rank", flops / m.step_s / 1e9},
                                {"core_sgemm_gflops", core_gflops},
                                {"a2a_ms_per_step", 1e3 * m.a2a_s},
                                {"a2a_mb_sent_per_rank", m.a2a_bytes / 1e6},
                                {"expert_param_mb_per_rank", m.expert_bytes / 1e6}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
