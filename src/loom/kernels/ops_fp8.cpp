// The op layer's FP8 functions (ops.hpp, "FP8 on CUDA"): CUDA only; the CPU emulates FP8 in f32.
#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/kernels/ops_common.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/kernels/cuda/ops_cuda.hpp"
#endif

namespace loom::ops {

using detail::device_of;

namespace {
[[noreturn]] void fp8_codes_need_cuda(const char* op) {
  throw_error("ops::", op,
              ": FP8 codes exist on CUDA only (the CPU emulates FP8 in f32: "
              "model/fp8_linear)");
}
}  // namespace

Tensor fp8_amax([[maybe_unused]] const Tensor& x, [[maybe_unused]] int64_t col,
                [[maybe_unused]] int64_t cols) {
  LOOM_OPS_ON_CUDA(device_of("fp8_amax", {&x}), fp8_amax(x, col, cols))
  fp8_codes_need_cuda("fp8_amax");
}
void fp8_max_into([[maybe_unused]] const Tensor& slots, [[maybe_unused]] int64_t index,
                  [[maybe_unused]] const Tensor& amax) {
  LOOM_OPS_ON_CUDA(device_of("fp8_max_into", {&slots, &amax}), fp8_max_into(slots, index, amax))
  fp8_codes_need_cuda("fp8_max_into");
}
Tensor fp8_scale_pair([[maybe_unused]] float scale) {
#ifdef LOOM_HAVE_CUDA
  return cuda_impl::fp8_scale_pair(scale);
#else
  (void)scale;
  fp8_codes_need_cuda("fp8_scale_pair");
#endif
}
Tensor fp8_scale_pairs([[maybe_unused]] const std::vector<float>& scales) {
#ifdef LOOM_HAVE_CUDA
  return cuda_impl::fp8_scale_pairs(scales);
#else
  fp8_codes_need_cuda("fp8_scale_pairs");
#endif
}
Tensor fp8_scale_pair([[maybe_unused]] const Tensor& amax, [[maybe_unused]] cpu::Fp8Format format,
                      [[maybe_unused]] int margin) {
  LOOM_OPS_ON_CUDA(device_of("fp8_scale_pair", {&amax}), fp8_scale_pair(amax, format, margin))
  fp8_codes_need_cuda("fp8_scale_pair");
}
Fp8Codes fp8_quantize([[maybe_unused]] const Tensor& x, [[maybe_unused]] int64_t col,
                      [[maybe_unused]] int64_t cols, [[maybe_unused]] const Tensor& scale_pair,
                      [[maybe_unused]] cpu::Fp8Format format, [[maybe_unused]] bool transposed,
                      [[maybe_unused]] const Tensor* amax_slots,
                      [[maybe_unused]] int64_t amax_index) {
  LOOM_OPS_ON_CUDA(
      device_of("fp8_quantize", {&x, &scale_pair}),
      fp8_quantize(x, col, cols, scale_pair, format, transposed, amax_slots, amax_index))
  fp8_codes_need_cuda("fp8_quantize");
}
Fp8Codes fp8_quantize_tiles([[maybe_unused]] const Tensor& x, [[maybe_unused]] int64_t col,
                            [[maybe_unused]] int64_t cols, [[maybe_unused]] cpu::Fp8Format format,
                            [[maybe_unused]] int margin, [[maybe_unused]] bool along_rows,
                            [[maybe_unused]] bool down_columns,
                            [[maybe_unused]] const Tensor* amax_slots,
                            [[maybe_unused]] int64_t amax_index) {
  LOOM_OPS_ON_CUDA(device_of("fp8_quantize_tiles", {&x}),
                   fp8_quantize_tiles(x, col, cols, format, margin, along_rows, down_columns,
                                      amax_slots, amax_index))
  fp8_codes_need_cuda("fp8_quantize_tiles");
}
Fp8Codes fp8_quantize_blocks([[maybe_unused]] const Tensor& x,
                             [[maybe_unused]] cpu::Fp8Format format, [[maybe_unused]] int margin,
                             [[maybe_unused]] bool transposed,
                             [[maybe_unused]] const Tensor* amax_slots,
                             [[maybe_unused]] int64_t amax_index) {
  LOOM_OPS_ON_CUDA(device_of("fp8_quantize_blocks", {&x}),
                   fp8_quantize_blocks(x, format, margin, transposed, amax_slots, amax_index))
  fp8_codes_need_cuda("fp8_quantize_blocks");
}
void fp8_gemm([[maybe_unused]] const Tensor& c, [[maybe_unused]] int64_t c_col,
              [[maybe_unused]] float beta, [[maybe_unused]] const Fp8Codes& a,
              [[maybe_unused]] bool a_transposed, [[maybe_unused]] const Fp8Codes& b,
              [[maybe_unused]] bool b_transposed) {
  LOOM_OPS_ON_CUDA(device_of("fp8_gemm", {&c, &a.codes, &b.codes}),
                   fp8_gemm(c, c_col, beta, a, a_transposed, b, b_transposed))
  fp8_codes_need_cuda("fp8_gemm");
}
void bias_grad_columns([[maybe_unused]] const Tensor& d_bias, [[maybe_unused]] const Tensor& d_out,
                       [[maybe_unused]] int64_t col) {
  LOOM_OPS_ON_CUDA(device_of("bias_grad_columns", {&d_bias, &d_out}),
                   bias_grad_columns(d_bias, d_out, col))
  fp8_codes_need_cuda("bias_grad_columns");
}

void add_bias_columns([[maybe_unused]] const Tensor& out, [[maybe_unused]] int64_t col,
                      [[maybe_unused]] const Tensor& bias) {
  LOOM_OPS_ON_CUDA(device_of("add_bias_columns", {&out, &bias}), add_bias_columns(out, col, bias))
  fp8_codes_need_cuda("add_bias_columns");
}

}  // namespace loom::ops
