// A mixture-of-experts layer's row movement on CUDA against the CPU (kernels/ops.hpp, "mixture
// of experts"): the gather of each token's kept copies, the weighted combine and both
// backwards, with slots dropped by a capacity. The CPU ops are the layer's own loops, checked
// against PyTorch in tests/test_moe.cpp.
// Tolerances: gather and its backward move or add the same f32 values in the same order: exact
// in f32. The combine sums k products in the CPU's order (FMA contraction may differ: 1e-6
// relative); the weights' gradients are f32 warp sums of C products of values in [-1, 1] where
// the CPU sums in double (within C^2 2^-24). bf16 rows: each result rounded once (2^-8).
#include <cmath>
#include <cstring>
#include <string>

#include "gpu_test_support.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
#include "tensor_test_support.hpp"

namespace loom::cuda::test {
namespace {

void expect_near(const Tensor& device, const Tensor& reference, double rel,
                 const std::string& what) {
  const auto got = device.to_f32_vector(), want = reference.to_f32_vector();
  expect_close(got, want, rel, 1e-6 * max_abs(want), what.c_str());
}

using CudaMoeOps = CudaTest;

TEST_F(CudaMoeOps, GatherCombineAndTheirBackwardMatchTheCpu) {
  const int64_t rows = 37, k = 3, c = 48, kept = 90;  // 111 slots, 21 dropped
  // Each kept row is one slot's, in a scrambled order (47 is coprime to 111); token 0 loses all
  // three of its slots (its combined output must be 0) and 18 more slots are dropped.
  std::vector<int32_t> position(rows * k, -1);
  int32_t next_row = 0;
  for (int32_t i = 0; i < rows * k && next_row < kept; ++i) {
    const int32_t slot = (i * 47) % int32_t(rows * k);
    if (slot >= k) position[slot] = next_row++;
  }
  const Tensor x = host_tensor(random_vector(rows * c, 1), {rows, c});
  const Tensor weights = host_tensor(random_vector(rows * k, 2, 0.0f, 1.0f), {rows, k});
  const Tensor expert_out = host_tensor(random_vector(kept * c, 3), {kept, c});
  const Tensor d_out = host_tensor(random_vector(rows * c, 4), {rows, c});
  const Tensor d_routed = host_tensor(random_vector(kept * c, 5), {kept, c});
  const Tensor d_x0 = host_tensor(random_vector(rows * c, 6), {rows, c});  // accumulated into
  for (const DType dtype : {DType::F32, DType::BF16}) {
    const bool bf16 = dtype == DType::BF16;
    const std::string name = bf16 ? "bf16" : "f32";
    auto input = [&](const Tensor& t) {
      return bf16 ? rounded(t) : t.clone(MemCategory::Workspace);
    };
    const Tensor xs = input(x), eo = input(expert_out), g = input(d_out), dr = input(d_routed);

    Tensor routed = Tensor::zeros({kept, c}, DType::F32, MemCategory::Workspace);
    Tensor routed_d = on_cuda(routed, dtype);
    ops::moe_gather(routed, xs, position, k);
    ops::moe_gather(routed_d, on_cuda(xs, dtype), position, k);
    EXPECT_EQ(routed_d.to_f32_vector(), routed.to_f32_vector())
        << name << ": gather moves values exactly";

    Tensor d_x = input(d_x0), d_x_d = on_cuda(input(d_x0), dtype);
    ops::moe_gather_backward(d_x, dr, position, k);
    ops::moe_gather_backward(d_x_d, on_cuda(dr, dtype), position, k);
    expect_near(d_x_d, d_x, bf16 ? 1.0 / 256 : 0.0, name + ": gather backward");

    // Outputs start as NaN: every element must be written (a token whose slots were all dropped
    // gets 0, a dropped slot's weight gradient 0).
    const Tensor nans = host_tensor(std::vector<float>(rows * c, std::nanf("")), {rows, c});
    Tensor out = Tensor::empty({rows, c}, DType::F32, MemCategory::Workspace),
           out_d = on_cuda(nans, dtype);
    const Tensor weights_d = on_cuda(weights);
    ops::moe_combine(out, eo, weights, position, k);
    ops::moe_combine(out_d, on_cuda(eo, dtype), weights_d, position, k);
    expect_near(out_d, out, bf16 ? 1.0 / 256 : 1e-6, name + ": combine");
    const auto token0 = out_d.to_f32_vector();
    for (int64_t j = 0; j < c; ++j) ASSERT_EQ(token0[j], 0.0f) << name << ": token 0 kept no slot";

    Tensor d_eo = Tensor::zeros({kept, c}, DType::F32, MemCategory::Workspace),
           d_eo_d = on_cuda(d_eo, dtype);
    Tensor d_w = Tensor::empty({rows, k}, DType::F32, MemCategory::Workspace);
    Tensor d_w_d = on_cuda(host_tensor(std::vector<float>(rows * k, std::nanf("")), {rows, k}));
    ops::moe_combine_backward(d_eo, d_w, g, eo, weights, position, k);
    ops::moe_combine_backward(d_eo_d, d_w_d, on_cuda(g, dtype), on_cuda(eo, dtype), weights_d,
                              position, k);
    expect_near(d_eo_d, d_eo, bf16 ? 1.0 / 256 : 0.0, name + ": d_expert_out (one product each)");
    // f32 sums of c products of values in [-1, 1]: within c u sum|terms| <= c^2 2^-24 of the double
    // sum.
    expect_close(d_w_d.to_f32_vector(), d_w.to_f32_vector(), 0.0,
                 double(c * c) * std::ldexp(1.0, -24), (name + ": d_weights").c_str());
    const auto dw = d_w_d.to_f32_vector();
    for (size_t s = 0; s < position.size(); ++s) {
      if (position[s] < 0) {
        EXPECT_EQ(dw[s], 0.0f) << name << ": dropped slot " << s;
      }
    }
  }
}

}  // namespace
}  // namespace loom::cuda::test
