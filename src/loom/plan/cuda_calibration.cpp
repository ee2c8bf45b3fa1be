#include "loom/plan/cuda_calibration.hpp"

#include <algorithm>
#include <vector>

#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/plan/calibration_loops.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/kernels/cuda/device_info.hpp"
#endif

namespace loom::plan {
namespace {

using calibration::compute_seconds;

// How long the largest GEMM runs before the first figure: an idle GPU starts at low clocks,
// and boost takes tens of milliseconds to settle.
constexpr double kWarmUpSeconds = 0.5, kQuickWarmUpSeconds = 0.1;

void require_cuda() {
  if (!device_memory::built_with(Device::CUDA))
    throw_error(
        "calibration on CUDA: this loom was built without CUDA (no nvcc at configure time, or "
        "-DLOOM_WITH_CUDA=OFF); rebuild where nvcc is found, or calibrate the CPU");
  if (device_memory::cuda_device_count() == 0)
    throw_error(
        "calibration on CUDA: no CUDA device is visible to this process (check nvidia-smi and "
        "CUDA_VISIBLE_DEVICES); run on a machine with a GPU, or calibrate the CPU");
}

// A GPU op returns once queued: every timed loop waits for the device before reading the clock.
void wait_for_gpu() { device_memory::synchronize(Device::CUDA); }

// A tensor on the GPU holding calibration::fill's values at `scale`, in `dtype`.
Tensor filled_on_gpu(const Shape& shape, DType dtype, float scale) {
  const Tensor host = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  calibration::fill(host.f32(), static_cast<size_t>(host.numel()), scale);
  const Tensor device = Tensor::empty(shape, dtype, MemCategory::Workspace, Device::CUDA);
  device.copy_from(host);
  return device;
}

void measure_gemms(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  // From a small model's projections at a short batch to an 8B model's MLP at 16 x 1024 tokens.
  const std::vector<int64_t> rows =
      o.quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 4096, 16384};
  const std::vector<int64_t> widths =
      o.quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{512, 1024, 2048, 4096, 8192};
  const int64_t max_rows = rows.back(), max_width = widths.back();
  // One buffer per operand, sized for the largest shape; each shape takes a view of its start.
  const Tensor x = filled_on_gpu({max_rows * max_width}, DType::BF16, 1.0f);
  const Tensor w = filled_on_gpu({max_width * max_width}, DType::BF16, 0.05f);
  const Tensor dy = filled_on_gpu({max_rows * max_width}, DType::BF16, 0.01f);
  const Tensor y =
      Tensor::empty({max_rows * max_width}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  const Tensor dx =
      Tensor::empty({max_rows * max_width}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  const Tensor dw =
      Tensor::zeros({max_width * max_width}, DType::F32, MemCategory::Workspace, Device::CUDA);

  // Clocks up before anything is timed: the largest forward product, back to back.
  {
    const Tensor xs = x.slice_as(0, {max_rows, max_width}),
                 ws = w.slice_as(0, {max_width, max_width}),
                 ys = y.slice_as(0, {max_rows, max_width});
    const double warm_up = o.quick ? kQuickWarmUpSeconds : kWarmUpSeconds;
    world.barrier();
    for (const calibration::Clock::time_point start = calibration::Clock::now();
         calibration::seconds_since(start) < warm_up;) {
      ops::linear_forward(ys, 0, xs, ws, nullptr);
      wait_for_gpu();
    }
  }

  double best_rate = 0;
  for (const int64_t n : rows)
    for (const int64_t in : widths)
      for (const int64_t out : widths) {
        const Tensor xs = x.slice_as(0, {n, in}), ws = w.slice_as(0, {out, in}),
                     ys = y.slice_as(0, {n, out});
        const Tensor dys = dy.slice_as(0, {n, out}), dxs = dx.slice_as(0, {n, in}),
                     dws = dw.slice_as(0, {out, in});
        const double forward = compute_seconds(
            world, o, [&] { ops::linear_forward(ys, 0, xs, ws, nullptr); }, wait_for_gpu);
        const double backward = compute_seconds(
            world, o, [&] { ops::linear_backward(dxs, false, dws, Tensor(), dys, 0, xs, ws); },
            wait_for_gpu);
        const double m = static_cast<double>(n), nn = static_cast<double>(out),
                     k = static_cast<double>(in);
        entry.gemm_timings.push_back({m, nn, k, forward});
        // The backward is two products of the forward's size: d_input and d_weight.
        entry.gemm_timings.push_back({m, nn, k, backward / 2});
        best_rate = std::max({best_rate, 2 * m * nn * k / forward, 4 * m * nn * k / backward});
      }
  entry.peak_flops = best_rate;
  entry.gemm = fit_gemm_efficiency(entry.gemm_timings, best_rate);
}

void measure_attention(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  struct Case {
    int64_t batch, seq, heads, head_dim;
  };
  // 16384 tokens at sequences of 256 to 4096; head_dim 64 as GPT-2 and Llama 3.2 1B have it
  // (12 heads: GPT-2 124M), 128 as Llama 3 8B (16 heads).
  const std::vector<Case> cases =
      o.quick ? std::vector<Case>{{16, 256, 12, 64}, {4, 1024, 8, 128}}
              : std::vector<Case>{{64, 256, 12, 64},  {16, 1024, 12, 64},  {4, 4096, 12, 64},
                                  {64, 256, 16, 128}, {16, 1024, 16, 128}, {4, 4096, 16, 128}};
  for (const Case& c : cases) {
    const ops::AttentionShape shape{c.batch, c.seq, c.heads, c.heads, c.head_dim};
    const int64_t rows = c.batch * c.seq;
    const Tensor qkv = filled_on_gpu({rows, shape.qkv_ld()}, DType::BF16, 0.5f);
    const Tensor d_out = filled_on_gpu({rows, shape.out_ld()}, DType::BF16, 0.01f);
    const Tensor out =
        Tensor::empty({rows, shape.out_ld()}, DType::BF16, MemCategory::Workspace, Device::CUDA);
    const Tensor d_qkv =
        Tensor::empty({rows, shape.qkv_ld()}, DType::BF16, MemCategory::Workspace, Device::CUDA);
    const Tensor lse =
        Tensor::empty({c.batch, c.heads, c.seq}, DType::F32, MemCategory::Workspace, Device::CUDA);
    const double forward = compute_seconds(
        world, o, [&] { ops::attention_forward(out, lse, qkv, shape); }, wait_for_gpu);
    // The forward has run: out and lse hold what the backward reads.
    const double backward = compute_seconds(
        world, o, [&] { ops::attention_backward(d_qkv, d_out, qkv, out, lse, shape); },
        wait_for_gpu);
    // Per head and per matmul (QK^T and PV): a (tokens x mean keys x head_dim) product.
    const double tokens = static_cast<double>(rows), keys = static_cast<double>(c.seq + 1) / 2;
    const double per = 2.0 * static_cast<double>(c.heads);
    entry.attention_forward_timings.push_back(
        {tokens, keys, static_cast<double>(c.head_dim), forward / per});
    entry.attention_backward_timings.push_back(
        {tokens, keys, static_cast<double>(c.head_dim), backward / per});
  }
  entry.attention_forward = fit_gemm_efficiency(entry.attention_forward_timings, entry.peak_flops);
  entry.attention_backward =
      fit_gemm_efficiency(entry.attention_backward_timings, entry.peak_flops);
}

void measure_memory(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  // The engine's memory-bound ops over one [rows, width] bf16 activation, each charged the
  // bytes it must move (each tensor of the activation's size read or written once, 2 bytes an
  // element; the [width] parameters and [rows] statistics are negligible): layer norm forward
  // (x -> y, 2 tensors) and backward (6, below), GELU forward (2) and backward (3), the
  // residual add (y += x, 3), as on the CPU. Their total bytes over their total time is what the
  // time model's activation traffic streams at on this GPU.
  const int64_t rows = o.quick ? 4096 : 16384, width = o.quick ? 1024 : 2048;
  const double element_bytes = static_cast<double>(dtype_size_bytes(DType::BF16));
  const Tensor x = filled_on_gpu({rows, width}, DType::BF16, 1.0f);
  const Tensor dy = filled_on_gpu({rows, width}, DType::BF16, 0.01f);
  const Tensor weight = filled_on_gpu({width}, DType::BF16, 1.0f);
  const Tensor bias = Tensor::zeros({width}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  const Tensor y = Tensor::zeros({rows, width}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  const Tensor dx = Tensor::zeros({rows, width}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  const Tensor d_weight = Tensor::zeros({width}, DType::F32, MemCategory::Workspace, Device::CUDA);
  const Tensor d_bias = Tensor::zeros({width}, DType::F32, MemCategory::Workspace, Device::CUDA);
  const Tensor mean = Tensor::empty({rows}, DType::F32, MemCategory::Workspace, Device::CUDA);
  const Tensor rstd = Tensor::empty({rows}, DType::F32, MemCategory::Workspace, Device::CUDA);
  double seconds = 0, bytes = 0;
  auto charge = [&](double tensors, auto&& op) {
    seconds += compute_seconds(world, o, op, wait_for_gpu);
    bytes += tensors * element_bytes * static_cast<double>(rows * width);
  };
  charge(2, [&] { ops::layernorm_forward(y, mean, rstd, x, weight, bias, 1e-5f); });
  // The backward reads dy, x and the input gradient it accumulates into and writes that; its
  // weight partials read dy and x again: 6.
  charge(6, [&] { ops::layernorm_backward(dx, d_weight, d_bias, dy, x, weight, mean, rstd); });
  charge(2, [&] { ops::gelu_forward(y, x); });
  charge(3, [&] { ops::gelu_backward(dx, dy, x); });
  charge(3, [&] { ops::add_into(y, x); });
  entry.memory_bytes_per_s = bytes / seconds;
}

void measure_streams(ProcessGroup& world, const CalibrationOptions& o, ProfileEntry& entry) {
  // The plain streaming kernels, which on an H100 ran near 2-3 TB/s where the norms above ran
  // near 1.5: a residual-gradient add in bf16 and in f32 (3 tensors each) and one AdamW step
  // over a flat f32 master with a bf16 working copy (reads gradient, master and both moments,
  // writes master, moments and the working copy: 30 bytes a parameter). The time model charges
  // the engine's adds, row dots, RoPE, SwiGLU, the loss's passes over the logits and the
  // optimizer at their total bytes over their total time.
  // Even the quick run's bf16 add (3 x 32 MB) is beyond an H100's 50 MB L2.
  const int64_t n = o.quick ? int64_t{16} << 20 : int64_t{32} << 20;
  const Tensor a16 = filled_on_gpu({n}, DType::BF16, 1.0f);
  const Tensor b16 = filled_on_gpu({n}, DType::BF16, 0.01f);
  const Tensor a32 = filled_on_gpu({n}, DType::F32, 1.0f);
  const Tensor b32 = filled_on_gpu({n}, DType::F32, 0.01f);
  const Tensor master = filled_on_gpu({n}, DType::F32, 0.05f);
  const Tensor grad = filled_on_gpu({n}, DType::F32, 0.001f);
  const Tensor m = Tensor::zeros({n}, DType::F32, MemCategory::Workspace, Device::CUDA);
  const Tensor v = Tensor::zeros({n}, DType::F32, MemCategory::Workspace, Device::CUDA);
  const Tensor working = Tensor::empty({n}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  const double elements = static_cast<double>(n);
  double seconds = 0, bytes = 0;
  seconds += compute_seconds(
      world, o, [&] { ops::add_into(a16, b16); }, wait_for_gpu);
  bytes += 3 * 2 * elements;
  seconds += compute_seconds(
      world, o, [&] { ops::add_into(a32, b32); }, wait_for_gpu);
  bytes += 3 * 4 * elements;
  int64_t step = 0;
  seconds += compute_seconds(
      world, o,
      [&] {
        ops::adamw_update(master, working, grad, m, v,
                          ops::AdamWStep{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step});
      },
      wait_for_gpu);
  bytes += 30 * elements;
  entry.stream_bytes_per_s = bytes / seconds;
}

}  // namespace

CudaMachine describe_cuda_machine(int device) {
  require_cuda();
#ifdef LOOM_HAVE_CUDA
  const cuda::DeviceInfo info = cuda::device_info();
  if (info.devices.empty())
    throw_error("calibration on CUDA: the CUDA runtime lists no device (",
                info.error.empty() ? "no reason given" : info.error, ")");
  const int index = device >= 0 && device < static_cast<int>(info.devices.size()) ? device : 0;
  const cuda::DeviceProperties& gpu = info.devices[static_cast<size_t>(index)];
  CudaMachine machine;
  machine.gpus = static_cast<int64_t>(info.devices.size());
  machine.memory_bytes = gpu.total_memory_bytes;
  machine.name =
      gpu.name + " (" + std::to_string(machine.gpus) + (machine.gpus == 1 ? " GPU)" : " GPUs)");
  return machine;
#else
  (void)device;
  throw_error("calibration on CUDA: this loom was built without CUDA");
#endif
}

ProfileEntry calibrate_cuda(ProcessGroup& world, const CalibrationOptions& options) {
  require_cuda();
  ProfileEntry entry;
  entry.ranks = world.size();
  entry.threads_per_rank = 1;  // one GPU each (or a share of one), whatever its host threads
  measure_gemms(world, options, entry);
  measure_attention(world, options, entry);
  measure_memory(world, options, entry);
  measure_streams(world, options, entry);
  // NCCL collective calibration needs a GPU per rank (2+ GPUs) and is not done yet: with
  // several ranks this measures MPI's, device buffers staged through the host.
  if (world.size() > 1) calibration::measure_comm(world, options, Device::CUDA, entry);
  return entry;
}

}  // namespace loom::plan
