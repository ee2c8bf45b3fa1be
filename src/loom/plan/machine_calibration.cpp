#include "loom/plan/machine_calibration.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/attention.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/kernels/cpu/fp8.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/cpu/norms.hpp"
#include "loom/plan/calibration_loops.hpp"
#include "loom/plan/cuda_calibration.hpp"

namespace loom::plan {
namespace {

using calibration::ComputeRounds;
using calibration::fill;

void measure_gemms(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  const std::vector<int64_t> rows = o.quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{128, 512, 2048};
  const std::vector<int64_t> ins = o.quick ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{64, 256, 1024};
  const std::vector<int64_t> outs = o.quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{256, 1024, 4096};
  const int64_t max_rows = rows.back(), max_in = ins.back(), max_out = outs.back();
  std::vector<float> x(static_cast<size_t>(max_rows * max_in)), w(static_cast<size_t>(max_out * max_in)),
      y(static_cast<size_t>(max_rows * max_out)), dx(x.size()), dw(w.size());
  fill(x, 1.0f), fill(w, 0.05f), fill(y, 0.01f);
  ComputeRounds rounds(world, o);
  struct Shape {
    int64_t n, in, out;
    size_t forward, backward;  // their slots in `rounds`
  };
  std::vector<Shape> shapes;
  for (const int64_t n : rows)
    for (const int64_t in : ins)
      for (const int64_t out : outs)
        shapes.push_back({n, in, out, rounds.add([&, n, in, out] {
                            cpu::linear_forward(y.data(), out, x.data(), w.data(), nullptr, n, in,
                                                out);
                          }),
                          rounds.add([&, n, in, out] {
                            cpu::linear_backward(dx.data(), false, dw.data(), nullptr, y.data(),
                                                 out, x.data(), w.data(), n, in, out);
                          })});
  rounds.run();
  double best_rate = 0;
  for (const Shape& s : shapes) {
    const double forward = rounds.seconds(s.forward), backward = rounds.seconds(s.backward);
    const double m = static_cast<double>(s.n), nn = static_cast<double>(s.out),
                 k = static_cast<double>(s.in);
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
  // Each case's buffers, alive until the rounds have run.
  struct Buffers {
    cpu::AttentionShape shape;
    std::vector<float> qkv, out, lse, d_out, d_qkv;
    size_t forward = 0, backward = 0;  // slots in `rounds`
  };
  std::vector<std::unique_ptr<Buffers>> buffers;
  ComputeRounds rounds(world, o);
  for (const Case& c : cases) {
    auto b = std::make_unique<Buffers>();
    b->shape = cpu::AttentionShape{c.batch, c.seq, c.heads, c.heads, c.head_dim};
    const int64_t rows = c.batch * c.seq;
    b->qkv.resize(static_cast<size_t>(rows * b->shape.qkv_ld()));
    b->out.resize(static_cast<size_t>(rows * b->shape.out_ld()));
    b->lse.resize(static_cast<size_t>(c.batch * c.heads * c.seq));
    b->d_out.resize(b->out.size());
    b->d_qkv.resize(b->qkv.size());
    fill(b->qkv, 0.5f), fill(b->d_out, 0.01f);
    Buffers* p = b.get();
    b->forward = rounds.add(
        [p] { cpu::attention_forward(p->out.data(), p->lse.data(), p->qkv.data(), p->shape); });
    b->backward = rounds.add([p] {
      cpu::attention_backward(p->d_qkv.data(), p->d_out.data(), p->qkv.data(), p->out.data(),
                              p->lse.data(), p->shape);
    });
    buffers.push_back(std::move(b));
  }
  rounds.run();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    // Per head and per matmul (QK^T and PV): a (tokens x mean keys x head_dim) product.
    const double tokens = static_cast<double>(c.batch * c.seq),
                 keys = static_cast<double>(c.seq + 1) / 2;
    const double per = 2.0 * static_cast<double>(c.heads);
    entry.attention_forward_timings.push_back(
        {tokens, keys, static_cast<double>(c.head_dim), rounds.seconds(buffers[i]->forward) / per});
    entry.attention_backward_timings.push_back({tokens, keys, static_cast<double>(c.head_dim),
                                                rounds.seconds(buffers[i]->backward) / per});
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
  ComputeRounds rounds(world, o);
  double bytes = 0;
  std::vector<size_t> slots;
  auto charge = [&](double bytes_per_element, std::function<void()> op) {
    slots.push_back(rounds.add(std::move(op)));
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
  rounds.run();
  double seconds = 0;
  for (const size_t slot : slots) seconds += rounds.seconds(slot);
  entry.memory_bytes_per_s = bytes / seconds;
}

void measure_fp8(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  // FP8 training's emulation (model/fp8_linear.cpp, Fp8Linear::quantize): a new workspace tensor
  // per operand, then one scale per tensor (each row's amax, then every element rounded) or per
  // tile (kernels/cpu/fp8), over one [rows, cols] operand of 2^19 floats; seconds per element.
  const int64_t rows = o.quick ? 64 : 512, cols = o.quick ? 256 : 1024, n = rows * cols;
  std::vector<float> x(static_cast<size_t>(n));
  fill(x, 4.0f);
  const float* in = x.data();
  ComputeRounds rounds(world, o);
  auto add = [&](std::function<void(float*)> quantize) {
    return rounds.add([rows, cols, quantize = std::move(quantize)] {
      const Tensor q = Tensor::empty({rows, cols}, DType::F32, MemCategory::Workspace);
      quantize(q.f32());
    });
  };
  constexpr auto kE4M3 = cpu::Fp8Format::E4M3;
  const size_t tensor = add([=](float* out) {
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r) amax = std::max(amax, cpu::abs_max(in + r * cols, cols));
    cpu::quantize_dequantize(out, cols, in, cols, rows, cols, cpu::fp8_scale(amax, kE4M3, 0),
                             kE4M3);
  });
  auto tiles = [&](int64_t tile_rows, int64_t tile_cols) {
    return add([=](float* out) {
      (void)cpu::quantize_dequantize_tiles(out, cols, in, cols, rows, cols, tile_rows, tile_cols,
                                           kE4M3, 0);
    });
  };
  const size_t row_tiles = tiles(1, 128), column_tiles = tiles(128, 1), blocks = tiles(128, 128);
  rounds.run();
  const double elements = static_cast<double>(n);
  entry.fp8.tensor_s = rounds.seconds(tensor) / elements;
  entry.fp8.row_tiles_s = rounds.seconds(row_tiles) / elements;
  entry.fp8.column_tiles_s = rounds.seconds(column_tiles) / elements;
  entry.fp8.blocks_s = rounds.seconds(blocks) / elements;
}

}  // namespace

namespace calibration {

void measure_comm(ProcessGroup& world, const CalibrationOptions& o, Device device,
                  ProfileEntry& entry) {
  const int ranks = world.size();
  auto comm = std::make_shared<MeasuredComm>();
  const std::vector<int64_t> sizes = o.quick ? std::vector<int64_t>{1 << 12, 1 << 16}
                                             : std::vector<int64_t>{1 << 12, 1 << 16, 1 << 20, 1 << 23};
  const int64_t largest = sizes.back() / 4;  // floats
  const Tensor host_values = Tensor::empty({largest}, DType::F32, MemCategory::Workspace);
  fill(host_values.f32(), static_cast<size_t>(largest), 1.0f);
  const Tensor in = host_values.to(device, MemCategory::CommBuffers);
  const Tensor out = Tensor::zeros({largest}, DType::F32, MemCategory::CommBuffers, device);
  auto first = [](const Tensor& t, int64_t count) { return t.slice_as(0, {count}); };
  // Send/recv between pairs (2i, 2i + 1), every pair at once: half a round trip per message.
  {
    CommTimings series;
    series.p2p = true;
    series.group = 2;
    const bool paired = (world.rank() ^ 1) < ranks;
    const int peer = world.rank() ^ 1;
    for (const int64_t bytes : sizes) {
      const int64_t count = bytes / 4;
      const Tensor sent = first(in, count), received = first(out, count);
      const double round_trip = comm_seconds(world, o, [&] {
        if (!paired) return;
        if (world.rank() % 2 == 0) {
          comm::send(world, sent, peer, 7)->wait();
          comm::recv(world, received, peer, 7)->wait();
        } else {
          comm::recv(world, received, peer, 7)->wait();
          comm::send(world, sent, peer, 7)->wait();
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
        const Tensor whole_in = first(in, count), whole_out = first(out, count);
        const Tensor blocks_in = first(in, block * group), blocks_out = first(out, block * group);
        const Tensor block_in = first(in, block), block_out = first(out, block);
        const double seconds = comm_seconds(world, o, [&] {
          switch (op) {
            case Collective::AllReduce:
              whole_out.copy_from(whole_in);
              comm::all_reduce(*g, whole_out, ReduceOp::Sum)->wait();
              break;
            case Collective::ReduceScatter:
              comm::reduce_scatter(*g, blocks_in, block_out, ReduceOp::Sum)->wait();
              break;
            case Collective::AllGather: comm::all_gather(*g, block_in, blocks_out)->wait(); break;
            case Collective::AllToAll: comm::all_to_all(*g, blocks_in, blocks_out)->wait(); break;
            case Collective::Broadcast: comm::broadcast(*g, whole_out, 0)->wait(); break;
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

}  // namespace calibration

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
  if (options.device == Device::CUDA) return calibrate_cuda(world, options);
  ProfileEntry entry;
  entry.ranks = world.size();
  entry.threads_per_rank = cpu::num_threads();
  measure_gemms(world, options, entry);
  measure_attention(world, options, entry);
  measure_memory(world, options, entry);
  measure_fp8(world, options, entry);
  if (world.size() > 1) calibration::measure_comm(world, options, Device::CPU, entry);
  return entry;
}

}  // namespace loom::plan
