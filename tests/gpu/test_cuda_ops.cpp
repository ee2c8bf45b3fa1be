// kernels/ops.hpp on CUDA against the same ops on the CPU (the reference), through device
// Tensors: the dispatch, the column blocks and the f32/bf16 choice the model relies on.
// Tolerances: f32 on the GPU differs from the CPU only in summation order (1e-5 on O(1)
// values); a bf16 output is the f32 result rounded once, at most 2^-9 relative (plus the same
// order differences), so bf16 checks allow 2^-8 relative.
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/loss_sum.hpp"
#include "tensor_test_support.hpp"

namespace loom::cuda::test {
namespace {

void expect_close(const Tensor& device, const Tensor& reference, double rel, double abs,
                  const char* what) {
  const auto got = device.to_f32_vector(), want = reference.to_f32_vector();
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess =
        std::abs(double(got[i]) - want[i]) - (abs + rel * std::abs(double(want[i])));
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  EXPECT_LE(worst_excess, 0.0) << what << ": element " << worst << " is " << got[worst]
                               << ", expected " << want[worst];
}

constexpr double kF32 = 1e-5, kBf16 = 1.0 / 256;

using CudaOps = CudaTest;

TEST_F(CudaOps, TensorsRoundTripBitwiseAndCountOnTheDevice) {
  const Tensor host = host_tensor(random_vector(1000, 1), {10, 100});
  const MemStats before = device_memory::stats(Device::CUDA);
  {
    const Tensor d = on_cuda(host);
    EXPECT_EQ(d.device(), Device::CUDA);
    EXPECT_EQ(device_memory::stats(Device::CUDA).live_bytes[size_t(MemCategory::Activations)] -
                  before.live_bytes[size_t(MemCategory::Activations)],
              4000);
    EXPECT_EQ(d.to_f32_vector(), host.to_f32_vector());
    EXPECT_EQ(on_cuda(host, DType::BF16).to_f32_vector(), rounded(host).to_f32_vector());
    Tensor rows = d.narrow_rows(2, 4);
    rows.zero_();
    auto expected = host.to_f32_vector();
    std::fill(expected.begin() + 200, expected.begin() + 400, 0.0f);
    EXPECT_EQ(d.to_f32_vector(), expected);
  }
  EXPECT_EQ(device_memory::stats(Device::CUDA).live_bytes[size_t(MemCategory::Activations)],
            before.live_bytes[size_t(MemCategory::Activations)]);
}

TEST_F(CudaOps, LinearForwardAndBackwardIntoColumnBlocks) {
  const int64_t rows = 33, in = 48, out = 40, ld = 100, col = 30;
  const Tensor x = host_tensor(random_vector(rows * in, 2), {rows, in});
  const Tensor w = host_tensor(random_vector(out * in, 3, -0.2f, 0.2f), {out, in});
  const Tensor b = host_tensor(random_vector(out, 4), {out});
  const Tensor dy = host_tensor(random_vector(rows * ld, 5), {rows, ld});
  for (DType dtype : {DType::F32, DType::BF16}) {
    const bool bf = dtype == DType::BF16;
    const Tensor xr = bf ? rounded(x) : x, wr = bf ? rounded(w) : w, br = bf ? rounded(b) : b,
                 dyr = bf ? rounded(dy) : dy;
    Tensor y = Tensor::zeros({rows, ld}, DType::F32, MemCategory::Workspace);
    ops::linear_forward(y, col, xr, wr, &br);
    Tensor yd = on_cuda(Tensor::zeros({rows, ld}, DType::F32, MemCategory::Workspace), dtype);
    const Tensor bd = on_cuda(br, dtype);
    ops::linear_forward(yd, col, on_cuda(xr, dtype), on_cuda(wr, dtype), &bd);
    expect_close(yd, y, bf ? kBf16 : kF32, kF32, "linear_forward");

    Tensor dx = Tensor::zeros({rows, in}, DType::F32, MemCategory::Workspace);
    Tensor dw = Tensor::zeros({out, in}, DType::F32, MemCategory::Workspace);
    Tensor db = Tensor::zeros({out}, DType::F32, MemCategory::Workspace);
    ops::linear_backward(dx, false, dw, db, dyr, col, xr, wr);
    Tensor dxd = on_cuda(Tensor::zeros({rows, in}, DType::F32, MemCategory::Workspace), dtype);
    Tensor dwd = on_cuda(Tensor::zeros({out, in}, DType::F32, MemCategory::Workspace));
    Tensor dbd = on_cuda(Tensor::zeros({out}, DType::F32, MemCategory::Workspace));
    ops::linear_backward(dxd, false, dwd, dbd, on_cuda(dyr, dtype), col, on_cuda(xr, dtype),
                         on_cuda(wr, dtype));
    expect_close(dxd, dx, bf ? kBf16 : kF32, 1e-4, "linear_backward d_input");
    expect_close(dwd, dw, kF32, 1e-4, "linear_backward d_weight (f32 accumulation)");
    expect_close(dbd, db, kF32, 1e-4, "linear_backward d_bias");
  }
}

// The MLP's fused GELU products through the op layer: taken for bf16 on CUDA (the model's GPU
// precision) and declined for f32, against linear + GELU on the CPU in f32 from the same
// bf16-rounded values. Tolerances: the bf16 outputs' rounding (2^-8 relative) plus the f32
// sums' absolute error at these sizes (1e-4, as the linear test above).
TEST_F(CudaOps, GeluFusedProductsMatchLinearAndGelu) {
  const int64_t rows = 32, in = 48, hidden = 64, out = 40;
  const Tensor x = rounded(host_tensor(random_vector(rows * in, 30), {rows, in}));
  const Tensor w1 = rounded(host_tensor(random_vector(hidden * in, 31, -0.2f, 0.2f), {hidden, in}));
  const Tensor b1 = rounded(host_tensor(random_vector(hidden, 32), {hidden}));
  const Tensor w2 =
      rounded(host_tensor(random_vector(out * hidden, 33, -0.2f, 0.2f), {out, hidden}));
  const Tensor dy = rounded(host_tensor(random_vector(rows * out, 34), {rows, out}));
  auto f32 = [](const Shape& shape) {
    return Tensor::zeros(shape, DType::F32, MemCategory::Workspace);
  };

  Tensor pre = f32({rows, hidden}), act = f32({rows, hidden});
  ops::linear_forward(pre, 0, x, w1, &b1);
  ops::gelu_forward(act, pre);
  Tensor d_act = f32({rows, hidden}), d_pre = f32({rows, hidden});
  Tensor dw2 = f32({out, hidden});
  ops::linear_backward(d_act, false, dw2, Tensor(), dy, 0, act, w2);

  // f32 on CUDA: declined, nothing written.
  Tensor act32 = on_cuda(f32({rows, hidden})), pre32 = on_cuda(f32({rows, hidden}));
  const Tensor b1_32 = on_cuda(b1);
  EXPECT_FALSE(ops::linear_gelu_forward(act32, pre32, on_cuda(x), on_cuda(w1), &b1_32));
  EXPECT_EQ(act32.to_f32_vector(), std::vector<float>(size_t(rows * hidden), 0.0f));

  const Tensor b1d = on_cuda(b1, DType::BF16);
  Tensor actd = on_cuda(f32({rows, hidden}), DType::BF16),
         pred = on_cuda(f32({rows, hidden}), DType::BF16);
  ASSERT_TRUE(ops::linear_gelu_forward(actd, pred, on_cuda(x, DType::BF16),
                                       on_cuda(w1, DType::BF16), &b1d));
  expect_close(pred, pre, kBf16, 1e-4, "pre");
  expect_close(actd, act, kBf16, 1e-4, "act");
  Tensor d_pred = on_cuda(f32({rows, hidden}), DType::BF16), dw2d = on_cuda(f32({out, hidden}));
  ASSERT_TRUE(ops::linear_backward_through_gelu(d_pred, dw2d, Tensor(), on_cuda(dy, DType::BF16),
                                                actd, on_cuda(w2, DType::BF16), pred));
  // d_pre: gelu' of the bf16 pre the GPU kept, times an f32 sum, rounded; the reference takes
  // gelu' of that same pre. Absolute: one rounding of the largest d_act, for cuBLASLt's GELU
  // derivative, whose tanh is not documented to be exact.
  Tensor pre_kept = f32({rows, hidden});
  pre_kept.copy_from(pred);  // bf16 on the GPU to f32 here: exact
  ops::gelu_backward(d_pre, d_act, pre_kept);
  double largest = 0;
  for (float v : d_act.to_f32_vector()) largest = std::max(largest, std::fabs(double(v)));
  expect_close(d_pred, d_pre, 2 * kBf16, kBf16 * largest, "d_pre");
  // d_weight: dy^T act in f32 from the GPU's bf16 act. Against the CPU's product of that same
  // act the two differ only in f32 summation order (32 rows); against the CPU's f32 act each term
  // would carry act's rounding, 2^-9 of |dy||act| summed, which cancellation can make far larger
  // than 2^-8 of the result (it did on an H100: -0.2245 for -0.2120).
  Tensor act_kept = f32({rows, hidden}), d_act_kept = f32({rows, hidden}),
         dw2_kept = f32({out, hidden});
  act_kept.copy_from(actd);
  ops::linear_backward(d_act_kept, false, dw2_kept, Tensor(), dy, 0, act_kept, w2);
  // Summation order: at most 32 x 2^-24 of the largest sum of |terms|.
  double abs_sum = 0;
  {
    const auto dyv = dy.to_f32_vector(), av = act_kept.to_f32_vector();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t h = 0; h < hidden; ++h) {
        double sum = 0;
        for (int64_t r = 0; r < rows; ++r)
          sum += std::fabs(double(dyv[size_t(r * out + o)]) * av[size_t(r * hidden + h)]);
        abs_sum = std::max(abs_sum, sum);
      }
  }
  expect_close(dw2d, dw2_kept, kF32, rows * 0x1p-24 * abs_sum, "d_weight");
}

TEST_F(CudaOps, NormsForwardAndBackward) {
  const int64_t rows = 17, dim = 64;
  const Tensor x = host_tensor(random_vector(rows * dim, 6), {rows, dim});
  const Tensor w = host_tensor(random_vector(dim, 7, 0.5f, 1.5f), {dim});
  const Tensor b = host_tensor(random_vector(dim, 8), {dim});
  const Tensor dy = host_tensor(random_vector(rows * dim, 9), {rows, dim});
  auto f32 = [](const Shape& s) { return Tensor::zeros(s, DType::F32, MemCategory::Workspace); };
  Tensor y = f32({rows, dim}), mean = f32({rows}), rstd = f32({rows});
  ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f);
  Tensor yd = on_cuda(f32({rows, dim})), meand = on_cuda(f32({rows})), rstdd = on_cuda(f32({rows}));
  ops::layernorm_forward(yd, meand, rstdd, on_cuda(x), on_cuda(w), on_cuda(b), 1e-5f);
  expect_close(yd, y, kF32, kF32, "layernorm_forward");
  expect_close(rstdd, rstd, kF32, kF32, "layernorm rstd");
  Tensor dx = f32({rows, dim}), dw = f32({dim}), db = f32({dim});
  ops::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
  Tensor dxd = on_cuda(f32({rows, dim})), dwd = on_cuda(f32({dim})), dbd = on_cuda(f32({dim}));
  ops::layernorm_backward(dxd, dwd, dbd, on_cuda(dy), on_cuda(x), on_cuda(w), meand, rstdd);
  expect_close(dxd, dx, 1e-4, 1e-4, "layernorm_backward d_input");
  expect_close(dwd, dw, 1e-4, 1e-4, "layernorm_backward d_weight");
  Tensor r = f32({rows, dim}), rr = f32({rows});
  ops::rmsnorm_forward(r, rr, x, w, 1e-6f);
  Tensor rd = on_cuda(f32({rows, dim})), rrd = on_cuda(f32({rows}));
  ops::rmsnorm_forward(rd, rrd, on_cuda(x), on_cuda(w), 1e-6f);
  expect_close(rd, r, kF32, kF32, "rmsnorm_forward");
}

TEST_F(CudaOps, AttentionRopeAndSwiglu) {
  const ops::AttentionShape shape{2, 24, 4, 2, 16};
  const int64_t rows = shape.batch * shape.seq_len;
  const Tensor qkv = host_tensor(random_vector(rows * shape.qkv_ld(), 10), {rows, shape.qkv_ld()});
  const Tensor d_out =
      host_tensor(random_vector(rows * shape.out_ld(), 11), {rows, shape.out_ld()});
  auto f32 = [](const Shape& s) { return Tensor::zeros(s, DType::F32, MemCategory::Workspace); };
  // RoPE on q and k, then attention, as the model runs them.
  const ops::Rope rope(shape.head_dim, shape.seq_len, 10000.0);
  Tensor q = qkv.clone(MemCategory::Workspace);
  rope.apply(q, shape.batch, shape.seq_len, shape.heads + shape.kv_heads, false);
  Tensor qd = on_cuda(qkv);
  rope.apply(qd, shape.batch, shape.seq_len, shape.heads + shape.kv_heads, false);
  expect_close(qd, q, kF32, kF32, "rope");
  Tensor out = f32({rows, shape.out_ld()}), lse = f32({shape.batch, shape.heads, shape.seq_len});
  ops::attention_forward(out, lse, q, shape);
  Tensor outd = on_cuda(f32({rows, shape.out_ld()})),
         lsed = on_cuda(f32({shape.batch, shape.heads, shape.seq_len}));
  ops::attention_forward(outd, lsed, qd, shape);
  expect_close(outd, out, 1e-5, 1e-5, "attention_forward");
  expect_close(lsed, lse, 1e-5, 1e-5, "attention lse");
  Tensor dq = f32({rows, shape.qkv_ld()});
  ops::attention_backward(dq, d_out, q, out, lse, shape);
  Tensor dqd = on_cuda(f32({rows, shape.qkv_ld()}));
  ops::attention_backward(dqd, on_cuda(d_out), qd, outd, lsed, shape);
  expect_close(dqd, dq, 1e-4, 1e-4, "attention_backward");
  // bf16: the same inputs rounded, the output rounded once.
  Tensor outb = on_cuda(f32({rows, shape.out_ld()}), DType::BF16);
  Tensor out_r = f32({rows, shape.out_ld()});
  ops::attention_forward(out_r, lse, rounded(q), shape);
  ops::attention_forward(outb, lsed, on_cuda(rounded(q), DType::BF16), shape);
  expect_close(outb, out_r, kBf16, 1e-5, "attention_forward bf16");

  const Tensor fused = host_tensor(random_vector(rows * 64, 12), {rows, 64});
  Tensor act = f32({rows, 32});
  ops::swiglu_forward(act, fused);
  Tensor actd = on_cuda(f32({rows, 32}));
  ops::swiglu_forward(actd, on_cuda(fused));
  expect_close(actd, act, kF32, kF32, "swiglu_forward");
}

// The residual add before a norm on CUDA in bf16: one fused kernel (kernels/cuda/norms) that
// stores the rounded sum and normalises it as stored, against the unfused ops on the same
// device bit for bit (add_into rounds the sum the same way, and the norm kernel is the same),
// on 67 rows of 770 (GPT-2's width is 768: rows not a multiple of a block's 8, a width not of a
// warp's 32, so every tail runs), LayerNorm and RMSNorm, the sum written over the delta (as the
// block does) and into its own buffer; and against the CPU on the same bf16 values (the sum,
// rounded, exactly; the norm within the output's bf16 rounding, 2^-8, and f32 order).
TEST_F(CudaOps, AddNormFusedEqualsTheUnfusedOps) {
  const int64_t rows = 67, dim = 770;
  const Tensor residual = rounded(host_tensor(random_vector(rows * dim, 31), {rows, dim}));
  const Tensor delta = rounded(host_tensor(random_vector(rows * dim, 32), {rows, dim}));
  const Tensor weight = rounded(host_tensor(random_vector(dim, 33, 0.5f, 1.5f), {dim}));
  const Tensor bias = rounded(host_tensor(random_vector(dim, 34), {dim}));
  auto zeros = [](const Shape& s) { return Tensor::zeros(s, DType::F32, MemCategory::Workspace); };
  for (const bool layernorm : {true, false}) {
    for (const bool own_buffer : {false, true}) {
      SCOPED_TRACE(testing::Message() << (layernorm ? "LayerNorm" : "RMSNorm")
                                      << (own_buffer ? ", sum apart" : ", sum over delta"));
      const Tensor b = layernorm ? bias : Tensor(),
                   bd = layernorm ? on_cuda(bias, DType::BF16) : Tensor();
      const Tensor wd = on_cuda(weight, DType::BF16), rd = on_cuda(residual, DType::BF16);
      const Tensor dd = on_cuda(delta, DType::BF16);
      const Tensor sum = own_buffer ? on_cuda(zeros({rows, dim}), DType::BF16) : dd;
      Tensor out = on_cuda(zeros({rows, dim}), DType::BF16);
      Tensor mean = on_cuda(zeros({rows})), rstd = on_cuda(zeros({rows}));
      ops::add_norm_forward(sum, out, mean, rstd, rd, dd, wd, bd, 1e-5f, true);
      // Unfused on the device.
      Tensor ref_sum = on_cuda(delta, DType::BF16),
             ref_out = on_cuda(zeros({rows, dim}), DType::BF16);
      Tensor ref_mean = on_cuda(zeros({rows})), ref_rstd = on_cuda(zeros({rows}));
      ops::add_into(ref_sum, rd);
      if (layernorm)
        ops::layernorm_forward(ref_out, ref_mean, ref_rstd, ref_sum, wd, bd, 1e-5f);
      else
        ops::rmsnorm_forward(ref_out, ref_rstd, ref_sum, wd, 1e-5f);
      EXPECT_EQ(sum.to_f32_vector(), ref_sum.to_f32_vector());
      EXPECT_EQ(out.to_f32_vector(), ref_out.to_f32_vector());
      EXPECT_EQ(rstd.to_f32_vector(), ref_rstd.to_f32_vector());
      if (layernorm) {
        EXPECT_EQ(mean.to_f32_vector(), ref_mean.to_f32_vector());
      }
      // The CPU on the same values.
      Tensor cpu_sum = delta.clone(MemCategory::Workspace), cpu_out = zeros({rows, dim});
      Tensor cpu_mean = zeros({rows}), cpu_rstd = zeros({rows});
      ops::add_norm_forward(cpu_sum, cpu_out, cpu_mean, cpu_rstd, residual, cpu_sum, weight, b,
                            1e-5f, true);
      EXPECT_EQ(sum.to_f32_vector(), cpu_sum.to_f32_vector());
      expect_close(out, cpu_out, 1.0 / 256, 1e-5, "add_norm_forward out");
    }
  }
}

TEST_F(CudaOps, EmbeddingHeadLossAndSumOfSquares) {
  const int64_t batch = 2, seq = 8, dim = 32, vocab = 50, rows = batch * seq;
  std::vector<int32_t> tokens(rows), targets(rows);
  for (int64_t i = 0; i < rows; ++i)
    tokens[i] = int32_t((7 * i + 3) % vocab), targets[i] = int32_t((5 * i + 1) % vocab);
  targets[3] = -1;  // ignored
  const Tensor table = host_tensor(random_vector(vocab * dim, 13), {vocab, dim});
  const Tensor pos = host_tensor(random_vector(seq * dim, 14), {seq, dim});
  auto f32 = [](const Shape& s) { return Tensor::zeros(s, DType::F32, MemCategory::Workspace); };
  Tensor emb = f32({rows, dim});
  ops::embedding_forward(emb, tokens.data(), table, &pos, batch, seq);
  Tensor embd = on_cuda(f32({rows, dim}));
  const Tensor posd = on_cuda(pos);
  ops::embedding_forward(embd, tokens.data(), on_cuda(table), &posd, batch, seq);
  expect_close(embd, emb, 0, 0, "embedding_forward (a copy and one add)");

  ops::CrossEntropyArgs cpu_args{
      emb, table, targets.data(), 16, 0.5f, f32({rows, dim}), f32({vocab, dim}), Tensor()};
  const double loss = ops::lm_head_cross_entropy(cpu_args);
  ops::CrossEntropyArgs gpu_args{embd,
                                 on_cuda(table),
                                 targets.data(),
                                 16,
                                 0.5f,
                                 on_cuda(f32({rows, dim})),
                                 on_cuda(f32({vocab, dim})),
                                 Tensor()};
  const double loss_d = ops::lm_head_cross_entropy(gpu_args);
  EXPECT_NEAR(loss_d, loss, 1e-5 * loss);
  expect_close(gpu_args.d_hidden, cpu_args.d_hidden, 1e-4, 1e-6, "cross-entropy d_hidden");
  expect_close(gpu_args.d_weight, cpu_args.d_weight, 1e-4, 1e-6, "cross-entropy d_weight");
  EXPECT_NEAR(ops::sum_of_squares(embd), ops::sum_of_squares(emb), 1e-9 * ops::sum_of_squares(emb));
}

// The pieces of tensor-parallel layers: the input-gradient and bias halves of a linear
// backward, a vector added to every row, a vocabulary shard's lookup and its learned positions
// for a block of rows, and the two passes of the head over a shard (ids [20, 45) of 50).
TEST_F(CudaOps, TensorParallelPiecesMatchTheCpu) {
  const int64_t rows = 12, in = 16, out = 24, dim = 16, begin = 20, shard = 25, seq = 8;
  auto f32 = [](const Shape& s) { return Tensor::zeros(s, DType::F32, MemCategory::Workspace); };
  const Tensor w = host_tensor(random_vector(out * in, 21), {out, in});
  const Tensor d_out = host_tensor(random_vector(rows * (out + 2), 22), {rows, out + 2});
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const bool bf16 = dtype == DType::BF16;
    const double rel = bf16 ? kBf16 : kF32;
    // The CPU reference on the values the device holds (bf16-rounded for bf16).
    const Tensor wr = bf16 ? rounded(w) : w, dr = bf16 ? rounded(d_out) : d_out;
    Tensor d_in = f32({rows, in});
    ops::linear_input_grad(d_in, false, dr, 2, wr);
    Tensor d_in_d = on_cuda(f32({rows, in}), dtype);
    ops::linear_input_grad(d_in_d, false, on_cuda(d_out, dtype), 2, on_cuda(w, dtype));
    expect_close(d_in_d, d_in, rel, 1e-5, "linear_input_grad");

    Tensor db = f32({out + 2});
    ops::bias_grad(db, dr);
    Tensor db_d = on_cuda(f32({out + 2}));
    ops::bias_grad(db_d, on_cuda(d_out, dtype));
    expect_close(db_d, db, 1e-5, 1e-5, "bias_grad (f32 sums)");

    const Tensor v = host_tensor(random_vector(out + 2, 23), {out + 2});
    Tensor sum = dr.clone(MemCategory::Workspace);
    ops::add_row_vector(sum, bf16 ? rounded(v) : v);
    Tensor sum_d = on_cuda(d_out, dtype);
    ops::add_row_vector(sum_d, on_cuda(v, dtype));
    expect_close(sum_d, sum, rel, 0, "add_row_vector (one add, rounded once)");

    std::vector<int32_t> tokens(rows), targets(rows);
    for (int64_t i = 0; i < rows; ++i)
      tokens[i] = int32_t((7 * i + 3) % 50), targets[i] = int32_t((11 * i + 2) % 50);
    targets[4] = -1;
    const Tensor table = host_tensor(random_vector(shard * dim, 24), {shard, dim});
    const Tensor tr = bf16 ? rounded(table) : table;
    Tensor emb = f32({rows, dim});
    ops::embedding_shard_forward(emb, tokens.data(), tr, begin);
    Tensor emb_d = on_cuda(f32({rows, dim}), dtype);
    ops::embedding_shard_forward(emb_d, tokens.data(), on_cuda(table, dtype), begin);
    expect_close(emb_d, emb, 0, 0, "embedding_shard_forward (copies and zeros)");
    const Tensor pos = host_tensor(random_vector(seq * dim, 25), {seq, dim});
    ops::add_position_rows(emb, bf16 ? rounded(pos) : pos, 5, seq);
    ops::add_position_rows(emb_d, on_cuda(pos, dtype), 5, seq);
    if (bf16) ops::round_to_bf16_(emb);
    expect_close(emb_d, emb, 0, 0, "add_position_rows (one add, rounded once)");

    const Tensor g = host_tensor(random_vector(rows * dim, 26), {rows, dim});
    const Tensor gr = bf16 ? rounded(g) : g;
    Tensor d_table = f32({shard, dim}), d_pos = f32({seq, dim});
    ops::embedding_shard_backward(d_table, gr, tokens.data(), begin);
    ops::position_rows_backward(d_pos, gr, 5, seq);
    Tensor d_table_d = on_cuda(f32({shard, dim})), d_pos_d = on_cuda(f32({seq, dim}));
    const Tensor g_d = on_cuda(g, dtype);
    ops::embedding_shard_backward(d_table_d, g_d, tokens.data(), begin);
    ops::position_rows_backward(d_pos_d, g_d, 5, seq);
    expect_close(d_table_d, d_table, 1e-6, 1e-6, "embedding_shard_backward");
    expect_close(d_pos_d, d_pos, 1e-6, 1e-6, "position_rows_backward");

    for (int64_t chunk : {int64_t{7}, shard}) {  // uneven chunks, and one chunk kept for pass 2
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      ops::ShardLogitsArgs c{gr, tr, targets.data(), begin, chunk, f32({rows, chunk})};
      ops::ShardLogitsArgs d{g_d,   on_cuda(table, dtype),      targets.data(), begin,
                             chunk, on_cuda(f32({rows, chunk}))};
      Tensor stats = f32({3, rows}), stats_d = on_cuda(f32({3, rows}));
      ops::shard_logit_stats(c, stats);
      ops::shard_logit_stats(d, stats_d);
      const std::vector<float> st = stats.to_f32_vector(), sd = stats_d.to_f32_vector();
      for (int64_t r = 0; r < rows; ++r) {
        const float m = st[r], s = st[rows + r], t = st[2 * rows + r];
        EXPECT_NEAR(sd[r], m, 1e-5 * (1 + std::abs(m))) << "max, row " << r;
        EXPECT_NEAR(sd[rows + r], s, 1e-4 * s) << "sum of exp, row " << r;
        EXPECT_NEAR(sd[2 * rows + r], t, 1e-5 * (1 + std::abs(t))) << "target logit, row " << r;
      }
      // Another shard's maxima, 0.75 above: sums scaled by exp(-0.75); then the loss, returned
      // and added into a device slot (the same kernel both ways: the same double).
      std::vector<float> other_max(rows);
      for (int64_t r = 0; r < rows; ++r) other_max[r] = st[r] + 0.75f;
      const Tensor gmax = host_tensor(other_max, {rows}), gmax_d = on_cuda(gmax);
      ops::shard_rescale_sums(stats, gmax);
      ops::shard_rescale_sums(stats_d, gmax_d);
      expect_close(stats_d, stats, 1e-4, 0, "shard_rescale_sums");
      Tensor lse_t = f32({rows}), lse_d = on_cuda(f32({rows}));
      std::vector<float> row_losses(rows), row_losses_d(rows);
      const double loss =
          ops::shard_loss(lse_t, stats, gmax, targets.data(), row_losses.data(), nullptr);
      const double loss_d =
          ops::shard_loss(lse_d, stats_d, gmax_d, targets.data(), row_losses_d.data(), nullptr);
      EXPECT_NEAR(loss_d, loss, 1e-5 * std::abs(loss));
      expect_close(lse_d, lse_t, 1e-5, 1e-5, "shard_loss lse");
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_NEAR(row_losses_d[r], row_losses[r], 1e-4) << "row loss " << r;
      EXPECT_EQ(row_losses_d[4], 0.0f) << "an ignored row";
      LossSum sum(Device::CUDA);
      EXPECT_EQ(ops::shard_loss(lse_d, stats_d, gmax_d, targets.data(), nullptr, sum.slot()), 0.0);
      EXPECT_EQ(sum.read(), loss_d);

      std::vector<float> lse_values(rows);
      for (int64_t r = 0; r < rows; ++r)
        lse_values[r] = st[r] + std::log(st[rows + r]) + 0.5f;  // any lse
      const Tensor lse = host_tensor(lse_values, {rows}), lse_on_device = on_cuda(lse);
      Tensor dh = f32({rows, dim}), dw = f32({shard, dim});
      ops::shard_logit_grad(c, lse, 0.25f, dh, dw);
      Tensor dh_d = on_cuda(f32({rows, dim}), dtype), dw_d = on_cuda(f32({shard, dim}));
      ops::shard_logit_grad(d, lse_on_device, 0.25f, dh_d, dw_d);
      // bf16: each logit gradient g is rounded once (2^-9 relative) before the products, and
      // d_hidden once more on output. With |values| <= 1: a d_hidden row sums |g| <= 2 x 0.25
      // over the shard, a d_weight row |g| <= 0.25 over 12 rows, which bounds the absolute
      // error by that sum x 2^-9.
      const double g_rounding = 1.0 / 512;
      expect_close(dh_d, dh, bf16 ? kBf16 : 1e-4, bf16 ? 0.5 * g_rounding : 1e-5,
                   "shard_logit_grad d_hidden");
      expect_close(dw_d, dw, 1e-4, bf16 ? rows * 0.25 * g_rounding : 1e-5,
                   "shard_logit_grad d_weight");
    }
  }
}

// The optimizer step the device-neutral AdamW takes: f32 in place, and with an f32 master and a
// bf16 working copy written in the same pass (the working copy is the master rounded once).
TEST_F(CudaOps, AdamWUpdatesInPlaceAndThroughAMaster) {
  const size_t n = 3000;
  const Tensor param = host_tensor(random_vector(n, 11), {30, 100});
  const Tensor grad = host_tensor(random_vector(n, 12), {30, 100});
  const Tensor m = host_tensor(random_vector(n, 13, -0.1f, 0.1f), {30, 100});
  const Tensor v = host_tensor(random_vector(n, 14, 0.0f, 0.1f), {30, 100});
  const ops::AdamWStep step{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
  // CPU reference: in place, then through a master with an f32 working copy.
  const Tensor cpu_param = param.clone(MemCategory::Workspace),
               cpu_m = m.clone(MemCategory::Workspace), cpu_v = v.clone(MemCategory::Workspace);
  ops::adamw_update(cpu_param, Tensor(), grad, cpu_m, cpu_v, step);

  const Tensor d_param = on_cuda(param), d_grad = on_cuda(grad), d_m = on_cuda(m), d_v = on_cuda(v);
  ops::adamw_update(d_param, Tensor(), d_grad, d_m, d_v, step);
  expect_close(d_param, cpu_param, kF32, kF32, "adamw param");
  expect_close(d_m, cpu_m, kF32, kF32, "adamw exp_avg");
  expect_close(d_v, cpu_v, kF32, kF32, "adamw exp_avg_sq");

  const Tensor master = on_cuda(param), working = on_cuda(param, DType::BF16);
  const Tensor m2 = on_cuda(m), v2 = on_cuda(v);
  ops::adamw_update(master, working, d_grad, m2, v2, step);
  expect_close(master, cpu_param, kF32, kF32, "adamw master");
  expect_close(working, rounded(cpu_param), kBf16, kF32, "adamw bf16 working copy");
}

// The optimizers' call: on CUDA one launch for the tensors with no working copy or a bf16 one
// (the kernel's own test checks its arithmetic), the per-tensor op for an f32 working copy;
// every value the per-tensor op's.
TEST_F(CudaOps, AdamWManyEqualsThePerTensorOp) {
  const ops::AdamWStep step{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
  std::vector<ops::AdamWTensors> many, single;
  for (int k = 0; k < 3; ++k) {  // no working copy, a bf16 one, an f32 one
    const int64_t n = 1000 + 333 * k;
    const auto seed = static_cast<uint32_t>(30 + 4 * k);
    const Tensor param = host_tensor(random_vector(n, seed), {n});
    const Tensor grad = host_tensor(random_vector(n, seed + 1), {n});
    const Tensor m = host_tensor(random_vector(n, seed + 2, -0.1f, 0.1f), {n});
    const Tensor v = host_tensor(random_vector(n, seed + 3, 0.0f, 0.1f), {n});
    for (auto* list : {&many, &single}) {
      const Tensor working = k == 0 ? Tensor() : on_cuda(param, k == 1 ? DType::BF16 : DType::F32);
      list->push_back({on_cuda(param), working, on_cuda(grad), on_cuda(m), on_cuda(v), step});
    }
  }
  ops::adamw_update_many(many);
  for (const ops::AdamWTensors& t : single)
    ops::adamw_update(t.param, t.working, t.grad, t.exp_avg, t.exp_avg_sq, t.step);
  for (size_t k = 0; k < many.size(); ++k) {
    SCOPED_TRACE("tensor " + std::to_string(k));
    EXPECT_EQ(many[k].param.to_f32_vector(), single[k].param.to_f32_vector());
    EXPECT_EQ(many[k].exp_avg.to_f32_vector(), single[k].exp_avg.to_f32_vector());
    EXPECT_EQ(many[k].exp_avg_sq.to_f32_vector(), single[k].exp_avg_sq.to_f32_vector());
    if (k > 0) {
      EXPECT_EQ(many[k].working.to_f32_vector(), single[k].working.to_f32_vector());
    }
  }
}

TEST_F(CudaOps, MixedDevicesAreRefused) {
  const Tensor host = Tensor::zeros({2, 2}, DType::F32, MemCategory::Workspace);
  const Tensor device = on_cuda(host);
  EXPECT_THROW(ops::add_into(device, host), Error);
}

}  // namespace
}  // namespace loom::cuda::test
