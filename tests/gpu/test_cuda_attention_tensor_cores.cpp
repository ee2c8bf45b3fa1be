// Tensor-core attention (attention_mma.cu) against causal attention computed here in double from
// the same bf16 q|k|v and d_out, on the head widths it takes (64 and 128), with GQA, partial
// tiles and a real model's shape (GPT-2: 1024 tokens, head_dim 64; Llama: head_dim 128, 4 query
// heads per kv head).
//
// Tolerance, element by element, from the roundings the kernels make: each probability (for
// out and dV) and each dS (for dK and dQ) is rounded to bf16 once before its product. Rounding
// to nearest with bf16's 8-bit significand is off by at most half an ulp, 2^-8 of the value at
// the bottom of a binade (2^-9 at its top), so an output may be off by 2^-8 M, where M is the same
// sum over absolute values (M_out = sum_j P_ij |v_j|, M_dV = sum_i P_ij |dO_i|, M_dK = scale sum_i
// |dS_ij| |q_i| with |dS_ij| bounded by P_ij (sum_d |dO_id v_jd| + |D_i|), M_dQ alike over k_j);
// the stored bf16 result adds 2^-8 |want|; f32 accumulation over at most 1024 terms adds
// 2^-14 M. The backward's D_i comes from the GPU's stored output on both sides. The lse is f32
// throughout (exp2 in place of exp, scores summed in another order): 1e-4 relative, as the f32
// kernels' test.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "gpu_test_support.hpp"
#include "loom/kernels/cuda/attention.hpp"

namespace loom::cuda::test {
namespace {

class TensorCoreAttentionTest : public CudaTest {
 protected:
  void TearDown() override { set_attention_kernel(AttentionKernel::automatic); }
};

const AttentionShape kShapes[] = {
    {2, 70, 4, 4, 64},    // partial second tile, multi-head
    {1, 200, 8, 2, 128},  // four tiles, the last partial; 4 query heads per kv head
    {1, 64, 2, 1, 128},   // exactly one tile, every head on one kv head
    {1, 1024, 4, 4, 64},  // GPT-2's head width at its 1024-token context
    {1, 512, 8, 2, 128},  // Llama 3's head width and grouping
    {1, 130, 2, 2, 64},   // the pipelined forward's 128-row tile and two rows past it
};

// The two tensor-core implementations: attention_mma.cu's, and attention_pipelined.cu's (cp.async
// stages, ldmatrix fragments, 128-row forward tiles at head_dim 64).
const AttentionKernel kTensorCoreKernels[] = {AttentionKernel::tensor_cores,
                                              AttentionKernel::pipelined};
const char* name(AttentionKernel kernel) {
  return kernel == AttentionKernel::pipelined ? "pipelined" : "tensor_cores";
}

TEST_F(TensorCoreAttentionTest, ForwardAndBackwardWithinTheirRoundings) {
  for (const AttentionKernel kernel : kTensorCoreKernels)
    for (const AttentionShape& s : kShapes) {
      SCOPED_TRACE(std::string(name(kernel)) + ": " + describe(s));
      set_attention_kernel(kernel);  // throws if a shape would fall back
      expect_forward_backward_within_roundings(s, 500 + 3 * static_cast<uint32_t>(&s - kShapes));
    }
}

TEST_F(TensorCoreAttentionTest, AgreesWithTheScalarKernels) {
  const AttentionShape s{1, 300, 4, 2, 64};
  const auto qkv = to_bf16(random_vector(static_cast<size_t>(s.seq_len * s.qkv_ld()), 600, -2, 2));
  const auto d_out = to_bf16(random_vector(static_cast<size_t>(s.seq_len * s.out_ld()), 601));
  std::vector<float> results[2];
  for (int k = 0; k < 2; ++k) {
    set_attention_kernel(k == 0 ? AttentionKernel::scalar : AttentionKernel::tensor_cores);
    DeviceBuffer<bf16> g_qkv(qkv), g_dout(d_out), g_out(d_out.size()), g_dqkv(qkv.size());
    DeviceBuffer<float> g_lse(static_cast<size_t>(s.heads * s.seq_len));
    cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
    cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
    results[k] = from_bf16(g_out.download());
    const auto d = from_bf16(g_dqkv.download());
    results[k].insert(results[k].end(), d.begin(), d.end());
  }
  // Two kernels, not the same code (so not the same bits), apart by the tensor cores' rounding
  // of P and dS and each one's output rounding: two roundings of the largest value.
  EXPECT_NE(results[0], results[1]);
  expect_close(results[1], results[0], 0.0, 2 * kBf16Rounding * max_abs(results[0]),
               "tensor cores vs scalar");
}

// The pipelined kernels compute the same products as attention_mma.cu's, in the same order per
// element; only where tiles come from differs (and the compiler's fusing of a multiply-add may),
// so, as the scalar comparison above, they agree within two roundings of the largest value.
TEST_F(TensorCoreAttentionTest, PipelinedAgreesWithTheFirstTensorCoreKernels) {
  for (const AttentionShape& s :
       {AttentionShape{2, 300, 4, 2, 64}, AttentionShape{1, 200, 8, 2, 128}}) {
    SCOPED_TRACE(describe(s));
    const auto qkv =
        to_bf16(random_vector(static_cast<size_t>(s.batch * s.seq_len * s.qkv_ld()), 610, -2, 2));
    const auto d_out =
        to_bf16(random_vector(static_cast<size_t>(s.batch * s.seq_len * s.out_ld()), 611));
    std::vector<float> out[2], d_qkv[2];
    for (int k = 0; k < 2; ++k) {
      set_attention_kernel(kTensorCoreKernels[k]);
      DeviceBuffer<bf16> g_qkv(qkv), g_dout(d_out), g_out(d_out.size()), g_dqkv(qkv.size());
      DeviceBuffer<float> g_lse(static_cast<size_t>(s.batch * s.heads * s.seq_len));
      cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
      cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(),
                               s);
      out[k] = from_bf16(g_out.download());
      d_qkv[k] = from_bf16(g_dqkv.download());
    }
    expect_close(out[1], out[0], 0.0, 2 * kBf16Rounding * max_abs(out[0]), "out");
    expect_close(d_qkv[1], d_qkv[0], 0.0, 2 * kBf16Rounding * max_abs(d_qkv[0]), "d_qkv");
  }
}

TEST_F(TensorCoreAttentionTest, BackwardIsDeterministic) {
  for (const AttentionKernel kernel : kTensorCoreKernels) {
    SCOPED_TRACE(name(kernel));
    set_attention_kernel(kernel);
    expect_backward_deterministic({2, 200, 8, 2, 128}, 700);
  }
}

TEST_F(TensorCoreAttentionTest, SelectionAndRefusals) {
  DeviceBuffer<bf16> buf(1 << 16);
  DeviceBuffer<float> lse(1 << 10);
  EXPECT_EQ(tensor_cores_refusal({1, 8, 2, 2, 64}, {buf.get()}), "");
  EXPECT_NE(tensor_cores_refusal({1, 8, 2, 2, 80}, {buf.get()}).find("head_dim 80"),
            std::string::npos);
  EXPECT_NE(tensor_cores_refusal({1, 8, 2, 2, 64}, {buf.get() + 1}).find("16-byte"),
            std::string::npos);
  // automatic: a head width the tensor cores do not take runs on cuDNN where it loads, else on
  // the scalar kernels.
  set_attention_kernel(AttentionKernel::automatic);
  EXPECT_NO_THROW(cuda::attention_forward(buf.get(), lse.get(), buf.get(), {1, 8, 2, 2, 80}));
  set_attention_kernel(AttentionKernel::tensor_cores);
  EXPECT_THROW(cuda::attention_forward(buf.get(), lse.get(), buf.get(), {1, 8, 2, 2, 80}), Error);
  set_attention_kernel(AttentionKernel::pipelined);
  EXPECT_THROW(cuda::attention_forward(buf.get(), lse.get(), buf.get(), {1, 8, 2, 2, 80}), Error);
}

}  // namespace
}  // namespace loom::cuda::test
