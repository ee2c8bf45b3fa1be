// The op layer's FP8 functions on CUDA (ops.hpp, "FP8 on CUDA"): model/fp8_linear's device path.
#include <cuda_runtime.h>

#include <algorithm>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/fp8.hpp"
#include "loom/kernels/cuda/gemm.hpp"
#include "loom/kernels/cuda/ops_cuda.hpp"
#include "loom/kernels/cuda/ops_cuda_common.cuh"

namespace loom::ops::cuda_impl {

namespace {
Tensor device_floats(int64_t n) {
  return Tensor::empty({n}, DType::F32, MemCategory::Workspace, Device::CUDA);
}
// Bytes in an F32 tensor's storage (Tensor has no byte dtype).
Tensor device_bytes(int64_t n) { return device_floats((n + 3) / 4); }
const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.raw()); }
uint8_t* mutable_bytes(const Tensor& t) { return static_cast<uint8_t*>(t.raw()); }

__global__ void max_into_kernel(float* slot, const float* amax) {
  // Non-negative floats (and a positive NaN) order as their bits: cpu's NaN-wins max.
  *slot = __int_as_float(max(__float_as_int(*slot), __float_as_int(*amax)));
}
}  // namespace

Tensor fp8_amax(const Tensor& x, int64_t col, int64_t cols) {
  const int64_t rows = x.size(0), ld = x.size(1);
  LOOM_CHECK(col >= 0 && cols >= 0 && col + cols <= ld, "fp8_amax: columns [", col, ", ",
             col + cols, ") of a tensor ", ld, " wide");
  Tensor amax = Tensor::zeros({1}, DType::F32, MemCategory::Workspace, Device::CUDA);
  if (x.dtype() == DType::BF16)
    cuda::fp8_amax(f32(amax), b16(x) + col, rows, cols, ld);
  else
    cuda::fp8_amax(f32(amax), f32(x) + col, rows, cols, ld);
  return amax;
}

void fp8_max_into(const Tensor& slots, int64_t index, const Tensor& amax) {
  LOOM_CHECK(index >= 0 && index < slots.numel(), "fp8_max_into: slot ", index, " of ",
             slots.numel());
  max_into_kernel<<<1, 1, 0, cuda::current_stream()>>>(f32(slots) + index, f32(amax));
  LOOM_CUDA_CHECK_LAUNCH();
}

Tensor fp8_scale_pairs(const std::vector<float>& scales) {
  const int64_t n = static_cast<int64_t>(scales.size());
  Tensor pairs = device_floats(std::max<int64_t>(2 * n, 2));  // {inverse, scale}: see fp8.hpp
  std::vector<float> host(static_cast<size_t>(2 * n));
  for (size_t i = 0; i < scales.size(); ++i)
    host[2 * i] = 1.0f / scales[i], host[2 * i + 1] = scales[i];
  // From pageable memory the copy returns once `host` is staged: no wait for the device.
  if (n > 0)
    LOOM_CUDA_CHECK(cudaMemcpyAsync(pairs.raw(), host.data(), host.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, cuda::current_stream()));
  return pairs;
}

Tensor fp8_scale_pair(float scale) { return fp8_scale_pairs({scale}); }

Tensor fp8_scale_pair(const Tensor& amax, cpu::Fp8Format format, int margin) {
  Tensor pair = device_floats(2);
  cuda::fp8_scale_from_amax(f32(pair), f32(amax), format, margin);
  return pair;
}

namespace {
float* amax_slot(const char* op, const Tensor* slots, int64_t index) {
  if (!slots) return nullptr;
  LOOM_CHECK(slots->device() == Device::CUDA && slots->dtype() == DType::F32 && index >= 0 &&
                 index < slots->numel(),
             op, ": amax slot ", index, " of a ", slots->numel(),
             "-element tensor (a device F32 one expected)");
  return f32(*slots) + index;
}
}  // namespace

Fp8Codes fp8_quantize(const Tensor& x, int64_t col, int64_t cols, const Tensor& scale_pair,
                      cpu::Fp8Format format, bool transposed, const Tensor* amax_slots,
                      int64_t amax_index) {
  const int64_t rows = x.size(0), ld = x.size(1);
  LOOM_CHECK(col >= 0 && cols >= 0 && col + cols <= ld, "fp8_quantize: columns [", col, ", ",
             col + cols, ") of a tensor ", ld, " wide");
  float* amax = nullptr;
  if (amax_slots) {
    LOOM_CHECK(amax_slots->device() == Device::CUDA && amax_slots->dtype() == DType::F32 &&
                   amax_index >= 0 && amax_index < amax_slots->numel(),
               "fp8_quantize: amax slot ", amax_index, " of a ", amax_slots->numel(),
               "-element tensor (a device F32 one expected)");
    amax = f32(*amax_slots) + amax_index;
  }
  Fp8Codes q;
  q.format = format, q.rows = rows, q.cols = cols, q.scale_pair = scale_pair;
  q.codes = device_bytes(rows * cols);
  if (transposed) q.codes_t = device_bytes(rows * cols);
  uint8_t* codes_t = transposed ? mutable_bytes(q.codes_t) : nullptr;
  if (x.dtype() == DType::BF16)
    cuda::fp8_quantize(mutable_bytes(q.codes), codes_t, b16(x) + col, rows, cols, ld,
                       f32(scale_pair), format, amax);
  else
    cuda::fp8_quantize(mutable_bytes(q.codes), codes_t, f32(x) + col, rows, cols, ld,
                       f32(scale_pair), format, amax);
  return q;
}

Fp8Codes fp8_quantize_tiles(const Tensor& x, int64_t col, int64_t cols, cpu::Fp8Format format,
                            int margin, bool along_rows, bool down_columns,
                            const Tensor* amax_slots, int64_t amax_index) {
  const int64_t rows = x.size(0), ld = x.size(1);
  LOOM_CHECK(col >= 0 && cols >= 0 && col + cols <= ld, "fp8_quantize_tiles: columns [", col, ", ",
             col + cols, ") of a tensor ", ld, " wide");
  float* amax = amax_slot("fp8_quantize_tiles", amax_slots, amax_index);
  Fp8Codes q;
  q.format = format, q.rows = rows, q.cols = cols, q.tiling = Fp8Tiling::Tiles;
  // rows and cols are multiples of 128 (the kernels refuse others), so the layouts have no
  // padding and every factor is written.
  if (along_rows) {
    q.codes = device_bytes(rows * cols);
    q.scales =
        device_floats(std::max<int64_t>((cols + 127) / 128 * cuda::fp8_vec128_scales_ld(rows), 1));
  }
  if (down_columns) {
    q.codes_t = device_bytes(rows * cols);
    q.scales_t =
        device_floats(std::max<int64_t>((rows + 127) / 128 * cuda::fp8_vec128_scales_ld(cols), 1));
  }
  uint8_t* codes = along_rows ? mutable_bytes(q.codes) : nullptr;
  uint8_t* codes_t = down_columns ? mutable_bytes(q.codes_t) : nullptr;
  float* scales = along_rows ? f32(q.scales) : nullptr;
  float* scales_t = down_columns ? f32(q.scales_t) : nullptr;
  if (x.dtype() == DType::BF16)
    cuda::fp8_quantize_tiles(codes, scales, codes_t, scales_t, b16(x) + col, rows, cols, ld, format,
                             margin, amax);
  else
    cuda::fp8_quantize_tiles(codes, scales, codes_t, scales_t, f32(x) + col, rows, cols, ld, format,
                             margin, amax);
  return q;
}

Fp8Codes fp8_quantize_blocks(const Tensor& x, cpu::Fp8Format format, int margin, bool transposed,
                             const Tensor* amax_slots, int64_t amax_index) {
  const int64_t rows = x.size(0), cols = x.size(1);
  float* amax = amax_slot("fp8_quantize_blocks", amax_slots, amax_index);
  Fp8Codes q;
  q.format = format, q.rows = rows, q.cols = cols, q.tiling = Fp8Tiling::Blocks;
  auto zeros = [](int64_t n) {  // a row of blocks is padded to 4: those entries defined too
    return Tensor::zeros({std::max<int64_t>(n, 1)}, DType::F32, MemCategory::Workspace,
                         Device::CUDA);
  };
  q.codes = device_bytes(rows * cols);
  q.scales = zeros((rows + 127) / 128 * cuda::fp8_blk128_scales_ld(cols));
  if (transposed) {
    q.codes_t = device_bytes(rows * cols);
    q.scales_t = zeros((cols + 127) / 128 * cuda::fp8_blk128_scales_ld(rows));
  }
  uint8_t* codes_t = transposed ? mutable_bytes(q.codes_t) : nullptr;
  float* scales_t = transposed ? f32(q.scales_t) : nullptr;
  if (x.dtype() == DType::BF16)
    cuda::fp8_quantize_blocks(mutable_bytes(q.codes), f32(q.scales), codes_t, scales_t, b16(x),
                              rows, cols, cols, format, margin, amax);
  else
    cuda::fp8_quantize_blocks(mutable_bytes(q.codes), f32(q.scales), codes_t, scales_t, f32(x),
                              rows, cols, cols, format, margin, amax);
  return q;
}

void fp8_gemm(const Tensor& c, int64_t c_col, float beta, const Fp8Codes& a, bool a_transposed,
              const Fp8Codes& b, bool b_transposed) {
  auto operand = [](const Fp8Codes& q, bool transposed) {
    const Tensor& codes = transposed ? q.codes_t : q.codes;
    LOOM_CHECK(codes.defined(), "fp8_gemm: the ", transposed ? "transposed " : "",
               "codes were not made (fp8_quantize's `transposed`, fp8_quantize_tiles' "
               "`along_rows` / `down_columns`)");
    if (q.tiling == Fp8Tiling::PerTensor)
      return cuda::Fp8Operand{bytes(codes), q.format, f32(q.scale_pair)};
    return cuda::Fp8Operand{bytes(codes), q.format, f32(transposed ? q.scales_t : q.scales),
                            q.tiling == Fp8Tiling::Tiles ? cuda::Fp8Scaling::Tiles1x128
                                                         : cuda::Fp8Scaling::Blocks128x128};
  };
  const int64_t m = a_transposed ? a.cols : a.rows, k = a_transposed ? a.rows : a.cols;
  const int64_t n = b_transposed ? b.cols : b.rows, kb = b_transposed ? b.rows : b.cols;
  LOOM_CHECK(k == kb, "fp8_gemm: inner sizes ", k, " and ", kb);
  LOOM_CHECK(c.size(0) == m && c_col >= 0 && c_col + n <= c.size(1), "fp8_gemm: output [",
             c.size(0), ", ", c.size(1), "] cannot take columns [", c_col, ", ", c_col + n, ") of ",
             m, " rows");
  const cuda::Fp8Operand oa = operand(a, a_transposed), ob = operand(b, b_transposed);
  if (c.dtype() == DType::BF16)
    cuda::fp8_gemm(b16(c) + c_col, c.size(1), beta, oa, ob, m, n, k);
  else
    cuda::fp8_gemm(f32(c) + c_col, c.size(1), beta, oa, ob, m, n, k);
}

void bias_grad_columns(const Tensor& d_bias, const Tensor& d_out, int64_t col) {
  const int64_t rows = d_out.size(0), width = d_bias.numel(), ld = d_out.size(1);
  LOOM_CHECK(col >= 0 && col + width <= ld, "bias_grad_columns: columns [", col, ", ", col + width,
             ") of ", ld);
  if (d_out.dtype() == DType::BF16)
    cuda::linear_backward(static_cast<bf16*>(nullptr), false, nullptr, f32(d_bias),
                          b16(d_out) + col, ld, nullptr, nullptr, rows, 0, width);
  else
    cuda::linear_backward(static_cast<float*>(nullptr), false, nullptr, f32(d_bias),
                          f32(d_out) + col, ld, nullptr, nullptr, rows, 0, width);
}

void add_bias_columns(const Tensor& out, int64_t col, const Tensor& bias) {
  const int64_t rows = out.size(0), width = bias.numel(), ld = out.size(1);
  LOOM_CHECK(col >= 0 && col + width <= ld, "add_bias_columns: columns [", col, ", ", col + width,
             ") of ", ld);
  if (is_bf16("add_bias_columns", {&out, &bias}))
    cuda::add_bias(b16(out) + col, ld, b16(bias), rows, width);
  else
    cuda::add_bias(f32(out) + col, ld, f32(bias), rows, width);
}

}  // namespace loom::ops::cuda_impl
