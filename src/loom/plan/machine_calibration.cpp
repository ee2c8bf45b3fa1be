#include "loom/plan/machine_calibration.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/attention.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/cpu/norms.hpp"

namespace loom::plan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The mean over ranks of each rank's figure.
double mean_over_ranks(ProcessGroup& world, double value) {
  float v = static_cast<float>(value);
  world.all_reduce(&v, 1, ReduceOp::Avg)->wait();
  return static_cast<double>(v);
}

double max_over_ranks(ProcessGroup& world, double value) {
  float v = static_cast<float>(value);
  world.all_reduce(&v, 1, ReduceOp::Max)->wait();
  return static_cast<double>(v);
}

// Seconds per call of `op`, run on every rank at once: the same number of calls on every rank
// (from a probe), timed from a barrier until the last rank is done, so that ranks sharing
// cores are charged the machine's whole time for their calls (as in training, where the
// slowest rank sets the pace) even where the scheduler ran some loops before others; the
// best loop of `repeats`.
template <class Op>
double compute_seconds(ProcessGroup& world, const CalibrationOptions& o, Op&& op) {
  world.barrier();
  op();  // warm-up: page in the buffers, size OpenBLAS's workspace
  world.barrier();
  Clock::time_point start = Clock::now();
  op();
  const double probe = max_over_ranks(world, seconds_since(start));
  const int64_t calls = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(o.min_loop_seconds / std::max(probe, 1e-7))), 1, 1000000);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < o.repeats; ++r) {
    world.barrier();
    start = Clock::now();
    for (int64_t c = 0; c < calls; ++c) op();
    best = std::min(best, max_over_ranks(world, seconds_since(start)) / static_cast<double>(calls));
  }
  return best;
}

// Seconds per call of a communication `op` every rank issues: the same number of calls on
// every rank (from a probe), best of `repeats` loops, averaged over the ranks.
template <class Op>
double comm_seconds(ProcessGroup& world, const CalibrationOptions& o, Op&& op) {
  world.barrier();
  Clock::time_point start = Clock::now();
  op();
  const double probe = max_over_ranks(world, seconds_since(start));
  const int64_t calls = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(o.min_loop_seconds / std::max(probe, 1e-7))), 1, 100000);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < o.repeats; ++r) {
    world.barrier();
    start = Clock::now();
    for (int64_t c = 0; c < calls; ++c) op();
    best = std::min(best, seconds_since(start) / static_cast<double>(calls));
  }
  return mean_over_ranks(world, best);
}

void fill(std::vector<float>& v, float scale) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 1000.0f;
}

void measure_gemms(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  const std::vector<int64_t> rows = o.quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{128, 512, 2048};
  const std::vector<int64_t> ins = o.quick ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{64, 256, 1024};
  const std::vector<int64_t> outs = o.quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{256, 1024, 4096};
  const int64_t max_rows = rows.back(), max_in = ins.back(), max_out = outs.back();
  std::vector<float> x(static_cast<size_t>(max_rows * max_in)), w(static_cast<size_t>(max_out * max_in)),
      y(static_cast<size_t>(max_rows * max_out)), dx(x.size()), dw(w.size());
  fill(x, 1.0f), fill(w, 0.05f), fill(y, 0.01f);
  double best_rate = 0;
  for (const int64_t n : rows)
    for (const int64_t in : ins)
      for (const int64_t out : outs) {
        const double forward = compute_seconds(world, o, [&] {
          cpu::linear_forward(y.data(), out, x.data(), w.data(), nullptr, n, in, out);
        });
        const double backward = compute_seconds(world, o, [&] {
          cpu::linear_backward(dx.data(), false, dw.data(), nullptr, y.data(), out, x.data(), w.data(), n, in, out);
        });
        const double m = static_cast<double>(n), nn = static_cast<double>(out), k = static_cast<double>(in);
        entry.gemm_timings.push_back({m, nn, k, forward});
        entry.gemm_timings.push_back({m, nn, k, backward / 2});  // two products: d_input and d_weight
        best_rate = std::max({best_rate, 2 * m * nn * k / forward, 4 * m * nn * k / backward});
      }
  entry.peak_flops = best_rate;
  entry.gemm = fit_gemm_efficiency(entry.gemm_timings, best_rate);
}

void measure_attention(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  struct Case {
    int64_t batch, seq, heads, head_dim;
  };
  const std::vector<Case> cases =
      o.quick ? std::vector<Case>{{2, 64, 2, 16}, {1, 128, 2, 32}}
              : std::vector<Case>{{16, 128, 4, 32}, {4, 512, 4, 32}, {1, 2048, 4, 32},
                                  {16, 128, 4, 64}, {4, 512, 4, 64}, {1, 2048, 4, 64}};
  for (const Case& c : cases) {
    const cpu::AttentionShape shape{c.batch, c.seq, c.heads, c.heads, c.head_dim};
    const int64_t rows = c.batch * c.seq;
    std::vector<float> qkv(static_cast<size_t>(rows * shape.qkv_ld())), out(static_cast<size_t>(rows * shape.out_ld())),
        lse(static_cast<size_t>(c.batch * c.heads * c.seq)), d_out(out.size()), d_qkv(qkv.size());
    fill(qkv, 0.5f), fill(d_out, 0.01f);
    const double forward = compute_seconds(world, o, [&] { cpu::attention_forward(out.data(), lse.data(), qkv.data(), shape); });
    const double backward = compute_seconds(world, o, [&] {
      cpu::attention_backward(d_qkv.data(), d_out.data(), qkv.data(), out.data(), lse.data(), shape);
    });
    // Per head and per matmul (QK^T and PV): a (tokens x mean keys x head_dim) product.
    const double tokens = static_cast<double>(rows), keys = static_cast<double>(c.seq + 1) / 2;
    const double per = 2.0 * static_cast<double>(c.heads);
    entry.attention_forward_timings.push_back({tokens, keys, static_cast<double>(c.head_dim), forward / per});
    entry.attention_backward_timings.push_back({tokens, keys, static_cast<double>(c.head_dim), backward / per});
  }
  entry.attention_forward = fit_gemm_efficiency(entry.attention_forward_timings, entry.peak_flops);
  entry.attention_backward = fit_gemm_efficiency(entry.attention_backward_timings, entry.peak_flops);
}

void measure_memory(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  // The engine's memory-bound kernels over one [rows, width] activation of 2^19 floats (2 MiB,
  // a layer's worth for the models that train on a CPU), each charged the bytes it must move
  // (inputs read once, outputs written once): layer norm forward (x -> y, 8 B per element) and
  // backward (dy, x -> dx, 12), GELU forward (8) and backward (12), the residual add (12). Their
  // total bytes over their total time is what the time model's activation traffic streams at:
  // not the copy bandwidth, since GELU's tanh and the norms' reductions cost arithmetic too.
  const int64_t rows = o.quick ? 64 : 512, width = o.quick ? 256 : 1024, n = rows * width;
  std::vector<float> x(static_cast<size_t>(n)), y(x.size()), dy(x.size()), dx(x.size()), weight(static_cast<size_t>(width), 1.0f),
      bias(static_cast<size_t>(width)), d_weight(weight.size()), d_bias(bias.size()), mean(static_cast<size_t>(rows)),
      rstd(mean.size());
  fill(x, 1.0f), fill(dy, 0.01f);
  double seconds = 0, bytes = 0;
  auto charge = [&](double bytes_per_element, auto&& op) {
    seconds += compute_seconds(world, o, op);
    bytes += bytes_per_element * static_cast<double>(n);
  };
  charge(8, [&] { cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), weight.data(), bias.data(), rows, width, 1e-5f); });
  charge(12, [&] {
    cpu::layernorm_backward(dx.data(), d_weight.data(), d_bias.data(), dy.data(), x.data(), weight.data(), mean.data(),
                            rstd.data(), rows, width);
  });
  charge(8, [&] { cpu::gelu_forward(y.data(), x.data(), n); });
  charge(12, [&] { cpu::gelu_backward(dx.data(), dy.data(), x.data(), n); });
  charge(12, [&] { cpu::add(y.data(), x.data(), dy.data(), n); });
  entry.memory_bytes_per_s = bytes / seconds;
}

void measure_comm(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  const int ranks = world.size();
  auto comm = std::make_shared<MeasuredComm>();
  const std::vector<int64_t> sizes = o.quick ? std::vector<int64_t>{1 << 12, 1 << 16}
                                             : std::vector<int64_t>{1 << 12, 1 << 16, 1 << 20, 1 << 23};
  const int64_t largest = sizes.back() / 4;  // floats
  std::vector<float> in(static_cast<size_t>(largest)), out(static_cast<size_t>(largest));
  fill(in, 1.0f);
  // Send/recv between pairs (2i, 2i + 1), every pair at once: half a round trip per message.
  {
    CommTimings series;
    series.p2p = true;
    series.group = 2;
    const bool paired = (world.rank() ^ 1) < ranks;
    const int peer = world.rank() ^ 1;
    for (const int64_t bytes : sizes) {
      const int64_t count = bytes / 4;
      const double round_trip = comm_seconds(world, o, [&] {
        if (!paired) return;
        if (world.rank() % 2 == 0) {
          world.send(in.data(), count, peer, 7)->wait();
          world.recv(out.data(), count, peer, 7)->wait();
        } else {
          world.recv(out.data(), count, peer, 7)->wait();
          world.send(in.data(), count, peer, 7)->wait();
        }
      });
      series.timings.push_back({static_cast<double>(bytes), round_trip / 2});
    }
    comm->p2p = fit_alpha_beta(series.timings);
    entry.comm_timings.push_back(std::move(series));
  }
  for (int group = 2; group <= ranks; ++group) {
    if (ranks % group != 0) continue;
    const std::shared_ptr<ProcessGroup> g = world.split(world.rank() / group, world.rank(), "calibrate");
    for (const Collective op : {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
                                Collective::AllToAll, Collective::Broadcast}) {
      CommTimings series;
      series.op = op;
      series.group = group;
      for (const int64_t bytes : sizes) {
        const int64_t count = bytes / 4, block = count / group;  // the whole buffer, as collective_time counts it
        const double seconds = comm_seconds(world, o, [&] {
          switch (op) {
            case Collective::AllReduce: std::copy(in.begin(), in.begin() + count, out.begin());
              g->all_reduce(out.data(), count, ReduceOp::Sum)->wait(); break;
            case Collective::ReduceScatter: g->reduce_scatter(in.data(), out.data(), block, ReduceOp::Sum)->wait(); break;
            case Collective::AllGather: g->all_gather(in.data(), out.data(), block)->wait(); break;
            case Collective::AllToAll: g->all_to_all(in.data(), out.data(), block)->wait(); break;
            case Collective::Broadcast: g->broadcast(out.data(), count, 0)->wait(); break;
          }
        });
        series.timings.push_back({static_cast<double>(bytes), seconds});
      }
      comm->collectives.push_back({op, group, fit_alpha_beta(series.timings)});
      entry.comm_timings.push_back(std::move(series));
    }
  }
  entry.comm = std::move(comm);
}

}  // namespace

std::string describe_machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  const unsigned cores = std::thread::hardware_concurrency();
  return (model.empty() ? std::string("unknown CPU") : model) + " (" + std::to_string(cores) + " cores)";
}

int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
}

ProfileEntry calibrate_machine(ProcessGroup& world, const CalibrationOptions& options) {
  if (options.repeats < 1) throw_error("calibrate: repeats = ", options.repeats, "; expected >= 1");
  if (!(options.min_loop_seconds > 0)) throw_error("calibrate: min_loop_seconds must be positive");
  ProfileEntry entry;
  entry.ranks = world.size();
  entry.threads_per_rank = cpu::num_threads();
  measure_gemms(world, options, entry);
  measure_attention(world, options, entry);
  measure_memory(world, options, entry);
  if (world.size() > 1) measure_comm(world, options, entry);
  return entry;
}

}  // namespace loom::plan
