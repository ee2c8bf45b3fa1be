// cuDNN's fused flash attention (attention_cudnn.cpp, LOOM_CUDA_ATTENTION=cudnn) against causal
// attention computed in double from the same bf16 q|k|v and d_out (attention_reference.hpp),
// on loom's fused layouts: GQA, partial tiles, GPT-2's and Llama's real shapes. cuDNN, like
// FlashAttention-2 and loom's tensor-core kernels, rounds each probability and each dS to bf16
// once before its product and keeps the softmax statistics in f32, so the same element-by-element
// bound holds (test_cuda_attention_tensor_cores.cpp's header derives it); the lse to 1e-4
// relative. Skipped, saying why, where loom was built without the cudnn-frontend headers or
// libcudnn.so.9 does not load; the GPU checks print the skips.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "gpu_test_support.hpp"
#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/attention_cudnn.hpp"

namespace loom::cuda::test {
namespace {

class CudnnAttentionTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    DeviceBuffer<bf16> probe(64);
    const std::string why = detail::cudnn_attention_refusal({1, 8, 1, 1, 64}, {probe.get()});
    if (!why.empty()) GTEST_SKIP() << why;
    previous_ = attention_kernel();
    set_attention_kernel(AttentionKernel::cudnn);
  }
  void TearDown() override { set_attention_kernel(previous_); }

 private:
  AttentionKernel previous_ = AttentionKernel::automatic;
};

const AttentionShape kShapes[] = {
    {2, 70, 4, 4, 64},    // a sequence no tile size divides, two sequences
    {1, 200, 8, 2, 128},  // 4 query heads per kv head
    {1, 64, 2, 1, 128},   // every head on one kv head
    {2, 1024, 4, 4, 64},  // GPT-2's head width at its 1024-token context
    {1, 512, 8, 2, 128},  // Llama 3's head width and grouping
};

TEST_F(CudnnAttentionTest, ForwardAndBackwardWithinTheirRoundings) {
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(describe(s));
    expect_forward_backward_within_roundings(s, 900 + 3 * static_cast<uint32_t>(&s - kShapes));
  }
}

// The same bits twice: cuDNN's deterministic backward, as loom's own kernels are.
TEST_F(CudnnAttentionTest, BackwardIsDeterministic) {
  expect_backward_deterministic({2, 200, 8, 2, 128}, 910);
}

// Its lse is the statistic loom's tensor-core kernels keep, so either backward runs from the
// other's forward: cuDNN's backward on the pipelined kernels' out and lse, and the pipelined
// backward on cuDNN's, each against the same backward on its own forward (f32 statistics summed
// in another order: the lse to 1e-4 relative; outputs within two roundings of the largest).
TEST_F(CudnnAttentionTest, AgreesWithLoomsTensorCoreKernels) {
  const AttentionShape s{1, 300, 4, 2, 64};
  const auto qkv = to_bf16(random_vector(static_cast<size_t>(s.seq_len * s.qkv_ld()), 920, -2, 2));
  const auto d_out = to_bf16(random_vector(static_cast<size_t>(s.seq_len * s.out_ld()), 921));
  const AttentionKernel kernels[] = {AttentionKernel::cudnn, AttentionKernel::pipelined};
  DeviceBuffer<bf16> g_qkv(qkv), g_dout(d_out);
  DeviceBuffer<bf16> g_out[2] = {DeviceBuffer<bf16>(d_out.size()),
                                 DeviceBuffer<bf16>(d_out.size())};
  DeviceBuffer<float> g_lse[2] = {DeviceBuffer<float>(static_cast<size_t>(s.heads * s.seq_len)),
                                  DeviceBuffer<float>(static_cast<size_t>(s.heads * s.seq_len))};
  for (int k = 0; k < 2; ++k) {
    set_attention_kernel(kernels[k]);
    cuda::attention_forward(g_out[k].get(), g_lse[k].get(), g_qkv.get(), s);
  }
  expect_close(g_lse[0].download(), g_lse[1].download(), 1e-4, 1e-5, "lse");
  const auto out0 = from_bf16(g_out[0].download()), out1 = from_bf16(g_out[1].download());
  expect_close(out0, out1, 0.0, 2 * kBf16Rounding * max_abs(out1), "out");
  // backward kernel b on forward f's out and lse, for all four pairs.
  std::vector<float> d_qkv[2][2];
  for (int b = 0; b < 2; ++b)
    for (int f = 0; f < 2; ++f) {
      set_attention_kernel(kernels[b]);
      DeviceBuffer<bf16> g_dqkv(qkv.size());
      cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out[f].get(),
                               g_lse[f].get(), s);
      d_qkv[b][f] = from_bf16(g_dqkv.download());
    }
  const double bound = 2 * kBf16Rounding * max_abs(d_qkv[1][1]);
  expect_close(d_qkv[0][0], d_qkv[1][1], 0.0, bound, "cuDNN on its own forward vs pipelined");
  expect_close(d_qkv[0][1], d_qkv[0][0], 0.0, bound, "cuDNN backward on the pipelined forward");
  expect_close(d_qkv[1][0], d_qkv[1][1], 0.0, bound, "pipelined backward on cuDNN's forward");
}

TEST_F(CudnnAttentionTest, RefusalsNameTheProblem) {
  DeviceBuffer<bf16> buf(1 << 16);
  DeviceBuffer<float> lse(1 << 10);
  EXPECT_NE(detail::cudnn_attention_refusal({1, 8, 2, 2, 84}, {buf.get()}).find("head_dim 84"),
            std::string::npos);
  EXPECT_NE(detail::cudnn_attention_refusal({1, 8, 2, 2, 64}, {buf.get() + 1}).find("16-byte"),
            std::string::npos);
  try {
    cuda::attention_forward(buf.get(), lse.get(), buf.get(), {1, 8, 2, 2, 84});
    ADD_FAILURE() << "head_dim 84 ran under LOOM_CUDA_ATTENTION=cudnn";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_CUDA_ATTENTION=cudnn"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::cuda::test
