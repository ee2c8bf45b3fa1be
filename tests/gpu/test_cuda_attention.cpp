// Causal flash attention against loom::cpu's tiled attention (itself checked against a naive
// reference in tests/test_kernels.cpp), forward (out, lse) and backward (d_qkv), over shapes
// that hit partial tiles, several tiles, grouped-query attention and both head-dim
// instantiations (<= 64 and <= 128, including a head_dim that is not a multiple of 4).
// f32: rtol 1e-4 with an absolute floor of 1e-5 x max|want| (sums over up to 200 keys in a
// different order, libdevice expf against the CPU's polynomial exp). bf16: the CPU gets the
// same bf16 q|k|v (and, for backward, the GPU's own bf16 output and d_out), so the difference is
// f32 order plus one output rounding: rtol 2e-2, atol 1e-2 x max|want|; lse stays f32 (1e-4).
#include <gtest/gtest.h>

#include <string>

#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/attention.hpp"
#include "loom/kernels/cuda/attention.hpp"

namespace loom::cuda::test {
namespace {

// These tests are the scalar kernels' (bf16 would otherwise take the tensor cores for head_dim
// 64 and 128: test_cuda_attention_tensor_cores.cpp).
class CudaAttentionTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    set_attention_kernel(AttentionKernel::scalar);
  }
  void TearDown() override { set_attention_kernel(AttentionKernel::automatic); }
};

const AttentionShape kShapes[] = {
    {2, 70, 4, 4, 16},    // two query tiles, the second partial; multi-head attention
    {1, 130, 4, 2, 32},   // three tiles, GQA (2 query heads per kv head)
    {1, 64, 2, 1, 64},    // exactly one tile, all heads share one kv head
    {2, 33, 3, 1, 20},    // head_dim not a multiple of 4 or 32
    {1, 200, 2, 2, 128},  // the largest head_dim, four tiles
    {1, 97, 4, 2, 80},    // head_dim between the instantiations
};

std::string describe(const AttentionShape& s) {
  return "batch " + std::to_string(s.batch) + " seq " + std::to_string(s.seq_len) + " heads " +
         std::to_string(s.heads) + " kv_heads " + std::to_string(s.kv_heads) + " head_dim " +
         std::to_string(s.head_dim);
}

size_t qkv_size(const AttentionShape& s) {
  return static_cast<size_t>(s.batch * s.seq_len * s.qkv_ld());
}
size_t out_size(const AttentionShape& s) {
  return static_cast<size_t>(s.batch * s.seq_len * s.out_ld());
}
size_t lse_size(const AttentionShape& s) {
  return static_cast<size_t>(s.batch * s.heads * s.seq_len);
}

void expect_f32(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, 1e-4, 1e-5 * max_abs(want), what);
}

TEST_F(CudaAttentionTest, F32ForwardAndBackwardMatchCpu) {
  uint32_t seed = 100;
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(describe(s));
    // Scores of a few units: softmax neither uniform nor one-hot.
    const auto qkv = random_vector(qkv_size(s), ++seed, -2.0f, 2.0f);
    const auto d_out = random_vector(out_size(s), ++seed);
    std::vector<float> out(out_size(s)), lse(lse_size(s)), d_qkv(qkv_size(s));
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), s);
    cpu::attention_backward(d_qkv.data(), d_out.data(), qkv.data(), out.data(), lse.data(), s);

    DeviceBuffer<float> g_qkv(qkv), g_dout(d_out), g_out(out.size()), g_lse(lse.size());
    // d_qkv starts as garbage: backward must overwrite every element.
    DeviceBuffer<float> g_dqkv(random_vector(qkv.size(), ++seed, 1e3f, 2e3f));
    cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
    expect_f32(g_out.download(), out, "out");
    expect_f32(g_lse.download(), lse, "lse");
    cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
    expect_f32(g_dqkv.download(), d_qkv, "d_qkv");
  }
}

TEST_F(CudaAttentionTest, Bf16ForwardAndBackwardMatchCpu) {
  uint32_t seed = 200;
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(describe(s));
    const auto qkv = rounded_to_bf16(random_vector(qkv_size(s), ++seed, -2.0f, 2.0f));
    const auto d_out = rounded_to_bf16(random_vector(out_size(s), ++seed));
    std::vector<float> out(out_size(s)), lse(lse_size(s));
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), s);

    DeviceBuffer<bf16> g_qkv(to_bf16(qkv)), g_dout(to_bf16(d_out)), g_out(out.size()),
        g_dqkv(qkv.size());
    DeviceBuffer<float> g_lse(lse.size());
    cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
    const auto got_out = from_bf16(g_out.download());
    const auto got_lse = g_lse.download();
    expect_close(got_out, out, 2e-2, 1e-2 * max_abs(out), "out");
    expect_f32(got_lse, lse, "lse");

    // Backward from what the GPU stored: its bf16 out and f32 lse.
    std::vector<float> d_qkv(qkv.size());
    cpu::attention_backward(d_qkv.data(), d_out.data(), qkv.data(), got_out.data(), got_lse.data(),
                            s);
    cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
    expect_close(from_bf16(g_dqkv.download()), d_qkv, 2e-2, 1e-2 * max_abs(d_qkv), "d_qkv");
  }
}

TEST_F(CudaAttentionTest, BackwardIsDeterministic) {
  const AttentionShape s{1, 130, 4, 2, 32};
  DeviceBuffer<float> g_qkv(random_vector(qkv_size(s), 300)),
      g_dout(random_vector(out_size(s), 301));
  DeviceBuffer<float> g_out(out_size(s)), g_lse(lse_size(s)), first(qkv_size(s)),
      second(qkv_size(s));
  cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
  cuda::attention_backward(first.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
  cuda::attention_backward(second.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
  EXPECT_EQ(first.download(), second.download());
}

TEST_F(CudaAttentionTest, RejectsUnsupportedShapes) {
  DeviceBuffer<float> buf(1 << 16), lse(1 << 10);
  EXPECT_THROW(
      cuda::attention_forward(buf.get(), lse.get(), buf.get(), AttentionShape{1, 8, 2, 2, 160}),
      Error);
  EXPECT_THROW(
      cuda::attention_forward(buf.get(), lse.get(), buf.get(), AttentionShape{1, 8, 3, 2, 16}),
      Error);
}

}  // namespace
}  // namespace loom::cuda::test
