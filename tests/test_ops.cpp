// kernels/ops.hpp on the CPU: the Tensor ops the model computes through, against loom::cpu's
// kernels called directly (the reference) and hand-computed values, plus the checks that name
// a bad call. The same ops on CUDA are checked against these in tests/gpu/test_cuda_ops.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gradcheck.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/loss_sum.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

Tensor tensor_of(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  std::memcpy(t.f32(), values.data(), values.size() * sizeof(float));
  return t;
}

TEST(Ops, LinearWritesItsColumnBlockOnly) {
  // y[:, 2:5] = x W^T + b in a [2, 7] buffer; the other columns keep their sentinel.
  const Tensor x = tensor_of({1, 2, -1, 0.5f, 3, -2}, {2, 3});
  const Tensor w = tensor_of({1, 0, 0, 0, 1, 0, 1, 1, 1}, {3, 3});
  const Tensor b = tensor_of({0.25f, -0.5f, 1}, {3});
  Tensor y = tensor_of(std::vector<float>(14, 9.0f), {2, 7});
  ops::linear_forward(y, 2, x, w, &b);
  const std::vector<float> expected = {
      9, 9, 1.25f, 1.5f, 3,    9, 9,  // row 0: x0 + b0, x1 + b1, sum + b2
      9, 9, 0.75f, 2.5f, 2.5f, 9, 9};
  EXPECT_EQ(y.to_f32_vector(), expected);
}

TEST(Ops, GeluFusionsDeclineOnTheCpuAndWriteNothing) {
  // The fused MLP products exist on CUDA only; on the CPU they return false and leave their
  // outputs and gradients as they were, so the model runs its two-kernel path.
  const Tensor x = tensor_of({1, 2, -1, 0.5f, 3, -2}, {2, 3});
  const Tensor w = tensor_of({1, 0, 0, 0, 1, 0, 1, 1, 1}, {3, 3});
  const Tensor b = tensor_of({0.25f, -0.5f, 1}, {3});
  Tensor act = tensor_of(std::vector<float>(6, 7.0f), {2, 3});
  Tensor pre = tensor_of(std::vector<float>(6, 8.0f), {2, 3});
  EXPECT_FALSE(ops::linear_gelu_forward(act, pre, x, w, &b));
  EXPECT_EQ(act.to_f32_vector(), std::vector<float>(6, 7.0f));
  EXPECT_EQ(pre.to_f32_vector(), std::vector<float>(6, 8.0f));
  Tensor d_pre = tensor_of(std::vector<float>(6, 5.0f), {2, 3});
  Tensor dw = tensor_of(std::vector<float>(9, 0.0f), {3, 3});
  Tensor db = tensor_of(std::vector<float>(3, 0.0f), {3});
  EXPECT_FALSE(ops::linear_backward_through_gelu(d_pre, dw, db, x, x, w, pre));
  EXPECT_EQ(d_pre.to_f32_vector(), std::vector<float>(6, 5.0f));
  EXPECT_EQ(dw.to_f32_vector(), std::vector<float>(9, 0.0f));
  // A shape mismatch is still an error that names the op.
  Tensor narrow = tensor_of(std::vector<float>(4, 0.0f), {2, 2});
  EXPECT_THROW(ops::linear_gelu_forward(narrow, pre, x, w, &b), Error);
}

TEST(Ops, LinearBackwardEqualsTheCpuKernel) {
  const int64_t rows = 5, in = 7, out = 4, ld = 10, col = 3;
  const auto xv = random_vector(rows * in, 1), wv = random_vector(out * in, 2),
             dyv = random_vector(rows * ld, 3);
  const Tensor x = tensor_of(xv, {rows, in}), w = tensor_of(wv, {out, in}),
               dy = tensor_of(dyv, {rows, ld});
  Tensor dx = Tensor::zeros({rows, in}, DType::F32, MemCategory::Workspace);
  Tensor dw = Tensor::zeros({out, in}, DType::F32, MemCategory::Workspace);
  Tensor db = Tensor::zeros({out}, DType::F32, MemCategory::Workspace);
  ops::linear_backward(dx, false, dw, db, dy, col, x, w);
  std::vector<float> rdx(rows * in), rdw(out * in, 0.0f), rdb(out, 0.0f);
  cpu::linear_backward(rdx.data(), false, rdw.data(), rdb.data(), dyv.data() + col, ld, xv.data(),
                       wv.data(), rows, in, out);
  EXPECT_EQ(dx.to_f32_vector(), rdx);
  EXPECT_EQ(dw.to_f32_vector(), rdw);
  EXPECT_EQ(db.to_f32_vector(), rdb);
}

TEST(Ops, SwigluReadsTheFusedGateAndUp) {
  // silu(g) * u with silu(g) = g / (1 + e^-g): g = 0 gives 0, g = 2 gives 2 / (1 + e^-2).
  const Tensor fused = tensor_of({0, 2, 5, 3}, {1, 4});  // gate | up = [0, 2] | [5, 3]
  Tensor out = Tensor::empty({1, 2}, DType::F32, MemCategory::Workspace);
  ops::swiglu_forward(out, fused);
  const auto y = out.to_f32_vector();
  EXPECT_NEAR(y[0], 0.0, 1e-7);
  EXPECT_NEAR(y[1], 3.0 * 2.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

TEST(Ops, RoundToBf16RoundsF32AndLeavesBf16Alone) {
  // bf16 keeps 7 mantissa bits: near 1 its values are 4/512 apart. 1 + 2/512 and 1 + 6/512 are
  // ties and go to the even neighbour (1 and 1 + 8/512); 1 + 3/512 goes to the nearer 1 + 4/512.
  Tensor x = tensor_of({1.0f + 2.0f / 512, 1.0f + 6.0f / 512, 1.0f + 3.0f / 512}, {3});
  ops::round_to_bf16_(x);
  EXPECT_EQ(x.to_f32_vector(), (std::vector<float>{1.0f, 1.0f + 8.0f / 512, 1.0f + 4.0f / 512}));
  Tensor h = Tensor::empty({2}, DType::BF16, MemCategory::Workspace);
  h.copy_from(tensor_of({1.5f, -2.25f}, {2}));
  ops::round_to_bf16_(h);
  EXPECT_EQ(h.to_f32_vector(), (std::vector<float>{1.5f, -2.25f}));
}

TEST(Ops, SumOfSquaresInDouble) {
  EXPECT_EQ(ops::sum_of_squares(tensor_of({3, -4, 0.5f}, {3})), 25.25);
}

// On the CPU adamw_update_many is adamw_update on each entry in turn: the same values, with no
// working copy and with an f32 one (the bf16 emulation), each with its own weight decay.
TEST(Ops, AdamWManyIsThePerTensorOpOnEach) {
  std::vector<ops::AdamWTensors> many, single;
  for (int k = 0; k < 2; ++k) {
    const int64_t n = 5 + 2 * k;
    std::vector<float> param(static_cast<size_t>(n)), grad(param.size()), m(param.size()),
        v(param.size());
    for (size_t i = 0; i < param.size(); ++i) {
      param[i] = std::sin(1.0f + static_cast<float>(i + 7 * k));
      grad[i] = std::cos(2.0f + static_cast<float>(i + 3 * k));
      m[i] = 0.01f * static_cast<float>(i) - 0.02f;
      v[i] = 0.001f * static_cast<float>(i + 1);
    }
    const ops::AdamWStep step{1e-2f, 0.9f, 0.95f, 1e-8f, k == 0 ? 0.1f : 0.0f, 2, 0.5f};
    for (auto* list : {&many, &single})
      list->push_back({tensor_of(param, {n}), k == 0 ? Tensor() : tensor_of(param, {n}),
                       tensor_of(grad, {n}), tensor_of(m, {n}), tensor_of(v, {n}), step});
  }
  ops::adamw_update_many(many);
  for (const ops::AdamWTensors& t : single)
    ops::adamw_update(t.param, t.working, t.grad, t.exp_avg, t.exp_avg_sq, t.step);
  for (size_t k = 0; k < many.size(); ++k) {
    EXPECT_EQ(many[k].param.to_f32_vector(), single[k].param.to_f32_vector());
    EXPECT_EQ(many[k].exp_avg.to_f32_vector(), single[k].exp_avg.to_f32_vector());
    EXPECT_EQ(many[k].exp_avg_sq.to_f32_vector(), single[k].exp_avg_sq.to_f32_vector());
  }
  EXPECT_EQ(many[1].working.to_f32_vector(), single[1].working.to_f32_vector());
  EXPECT_NO_THROW(ops::adamw_update_many({}));
}

TEST(Ops, BadCallsNameTheOpAndTheShapes) {
  const Tensor x = Tensor::zeros({2, 3}, DType::F32, MemCategory::Workspace);
  const Tensor w = Tensor::zeros({4, 5}, DType::F32, MemCategory::Workspace);
  Tensor y = Tensor::zeros({2, 4}, DType::F32, MemCategory::Workspace);
  EXPECT_NE(error_message([&] {
              ops::linear_forward(y, 0, x, w, nullptr);
            }).find("ops::linear_forward: input [2, 3] does not match weight [4, 5]"),
            std::string::npos);
  const Tensor w2 = Tensor::zeros({4, 3}, DType::F32, MemCategory::Workspace);
  EXPECT_NE(error_message([&] {
              ops::linear_forward(y, 1, x, w2, nullptr);
            }).find("columns [1, 5) of [2, 4]"),
            std::string::npos);
  const Tensor half = Tensor::zeros({2, 3}, DType::BF16, MemCategory::Workspace);
  EXPECT_NE(error_message([&] { ops::gelu_forward(half, half); }).find("computes in f32"),
            std::string::npos);
  EXPECT_NE(error_message([&] { ops::swiglu_forward(y, x); }).find("expected [rows, 2 dim]"),
            std::string::npos);
}

// Key ranges must give each of the B*T query rows a non-empty causal range.
TEST(Ops, AttentionKeyRangesAreCheckedRowByRow) {
  const ops::AttentionShape shape{1, 3, 1, 1, 4};
  const Tensor qkv = Tensor::zeros({3, 12}, DType::F32, MemCategory::Workspace);
  const Tensor out = Tensor::zeros({3, 4}, DType::F32, MemCategory::Workspace);
  const Tensor lse = Tensor::zeros({1, 1, 3}, DType::F32, MemCategory::Workspace);
  const std::vector<int32_t> short_list = {0, 1, 0, 2};
  expect_contains(error_message([&] { ops::attention_forward(out, lse, qkv, shape, short_list); }),
                  {"ops::attention_forward", "4 key-range values for 3 query rows", "(6)"});
  const std::vector<int32_t> future = {0, 1, 0, 3, 0, 3};  // row 1 would see key 2
  expect_contains(error_message([&] { ops::attention_forward(out, lse, qkv, shape, future); }),
                  {"query row 1 of sequence 0 sees keys [0, 3)", "0 <= begin < end <= 2"});
  const std::vector<int32_t> empty_row = {0, 1, 1, 2, 2, 2};
  expect_contains(error_message([&] { ops::attention_backward(qkv, out, qkv, out, lse, shape, empty_row); }),
                  {"ops::attention_backward", "query row 2", "[2, 2)"});
  const std::vector<int32_t> fine = {0, 1, 1, 2, 0, 3};
  ops::attention_forward(out, lse, qkv, shape, fine);  // zero q: uniform over the range
  EXPECT_FLOAT_EQ(lse.to_f32_vector()[2], std::log(3.0f));
  EXPECT_FLOAT_EQ(lse.to_f32_vector()[1], 0.0f);  // one key
}

// Position ids replace each row's index: a row at position 0 is not rotated and takes table
// row 0; ids past the table are refused by name.
TEST(Ops, PositionIdsPickTheRowsAndAreChecked) {
  const Tensor table = Tensor::zeros({4, 2}, DType::F32, MemCategory::Workspace);
  for (int i = 0; i < 8; ++i) table.f32()[i] = static_cast<float>(i);
  const Tensor token_table = Tensor::zeros({3, 2}, DType::F32, MemCategory::Workspace);
  const Tensor out = Tensor::zeros({3, 2}, DType::F32, MemCategory::Workspace);
  const std::vector<int32_t> tokens = {0, 1, 2}, positions = {3, 0, 1};
  ops::embedding_forward(out, tokens.data(), token_table, &table, 1, 3, positions);
  EXPECT_EQ(out.to_f32_vector(), (std::vector<float>{6, 7, 0, 1, 2, 3}));
  const std::vector<int32_t> past = {0, 4, 1};
  expect_contains(error_message([&] { ops::embedding_forward(out, tokens.data(), token_table, &table, 1, 3, past); }),
                  {"ops::embedding_forward", "position 4 of row 1", "[0, 4)"});
  ops::Rope rope(2, 4, 10000.0);
  const Tensor x = Tensor::zeros({3, 2}, DType::F32, MemCategory::Workspace);
  for (int i = 0; i < 6; ++i) x.f32()[i] = 1.0f;
  rope.apply(x, 1, 3, 1, false, std::vector<int32_t>{1, 0, 0});
  const std::vector<float> rotated = x.to_f32_vector();
  EXPECT_FLOAT_EQ(rotated[2], 1.0f);  // rows 1 and 2 at position 0: unrotated
  EXPECT_FLOAT_EQ(rotated[5], 1.0f);
  EXPECT_NEAR(rotated[0], std::cos(1.0f) - std::sin(1.0f), 1e-6);  // row 0 at position 1
  expect_contains(error_message([&] { rope.apply(x, 1, 3, 1, false, std::vector<int32_t>{0, 1}); }),
                  {"ops::rope_apply", "2 position ids for rows up to 3"});
}

// Cross-attention through the op layer: one query over two keys with zero scores averages the
// two values; shapes and ranges outside the keys are refused by name.
TEST(Ops, CrossAttentionAveragesVisibleValuesAndChecksItsArguments) {
  const ops::CrossAttentionShape shape{1, 1, 2, 1, 1, 2};
  const Tensor q = Tensor::zeros({1, 2}, DType::F32, MemCategory::Workspace);
  const Tensor kv = Tensor::zeros({2, 4}, DType::F32, MemCategory::Workspace);
  kv.f32()[2] = 1.0f, kv.f32()[3] = 2.0f;  // value of key 0
  kv.f32()[6] = 3.0f, kv.f32()[7] = 6.0f;  // value of key 1
  const Tensor out = Tensor::zeros({1, 2}, DType::F32, MemCategory::Workspace);
  const Tensor lse = Tensor::zeros({1, 1, 1}, DType::F32, MemCategory::Workspace);
  ops::cross_attention_forward(out, lse, q, kv, shape, std::vector<int32_t>{0, 2});
  EXPECT_EQ(out.to_f32_vector(), (std::vector<float>{2.0f, 4.0f}));
  EXPECT_FLOAT_EQ(lse.to_f32_vector()[0], std::log(2.0f));
  ops::cross_attention_forward(out, lse, q, kv, shape, std::vector<int32_t>{1, 2});
  EXPECT_EQ(out.to_f32_vector(), (std::vector<float>{3.0f, 6.0f}));
  // A row may see none of the keys (a ring block outside its range): zero output, lse -inf.
  ops::cross_attention_forward(out, lse, q, kv, shape, std::vector<int32_t>{1, 1});
  EXPECT_EQ(out.to_f32_vector(), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(lse.to_f32_vector()[0], -std::numeric_limits<float>::infinity());
  expect_contains(error_message([&] { ops::cross_attention_forward(out, lse, q, kv, shape, std::vector<int32_t>{0, 3}); }),
                  {"ops::cross_attention_forward", "sees keys [0, 3)", "<= 2"});
  expect_contains(error_message([&] { ops::cross_attention_forward(out, lse, q, kv, shape, std::vector<int32_t>{2, 1}); }),
                  {"sees keys [2, 1)", "0 <= begin <= end <= 2"});
  // Merging the two one-key results (each lse 0 for a zero query) gives their average.
  const Tensor other = Tensor::zeros({1, 2}, DType::F32, MemCategory::Workspace);
  const Tensor other_lse = Tensor::zeros({1, 1, 1}, DType::F32, MemCategory::Workspace);
  ops::cross_attention_forward(out, lse, q, kv, shape, std::vector<int32_t>{0, 1});
  ops::cross_attention_forward(other, other_lse, q, kv, shape, std::vector<int32_t>{1, 2});
  ops::merge_attention_partials(out, lse, other, other_lse, 1, 1);
  EXPECT_EQ(out.to_f32_vector(), (std::vector<float>{2.0f, 4.0f}));
  EXPECT_FLOAT_EQ(lse.to_f32_vector()[0], std::log(2.0f));
  const ops::CrossAttentionShape wrong{1, 1, 3, 1, 1, 2};
  expect_contains(error_message([&] { ops::cross_attention_forward(out, lse, q, kv, wrong, std::vector<int32_t>{0, 1}); }),
                  {"kv [2, 4]", "1 queries over 3 keys"});
}

// The residual add before a norm: residual [1, 1, -1, -1] + delta [0.5, -0.5, 0.5, -0.5] =
// [1.5, 0.5, -0.5, -1.5], mean 0 and mean square (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25, so
// LayerNorm (weight 1, bias 0, eps 0) and RMSNorm both give sum / sqrt(1.25); in the second row
// [1, -1, 1, -1] + [2^-10, 0, 0, 0] the first sum 1 + 2^-10 rounds to 1 in bf16 (half an ulp of 1
// is 2^-8) when the sum is rounded. The sum may
// be the delta's buffer, the residual's, or its own; each equals ops::add_into then the norm.
TEST(Ops, AddNormSumsThenNormalisesTheSum) {
  const std::vector<float> residual = {1, 1, -1, -1, 1, -1, 1, -1};
  const std::vector<float> delta = {0.5f, -0.5f, 0.5f, -0.5f, 0x1p-10f, 0, 0, 0};
  const Tensor weight = tensor_of({1, 1, 1, 1}, {4}), bias = tensor_of({0, 0, 0, 0}, {4});
  const double r = 1 / std::sqrt(1.25);
  for (const bool layernorm : {true, false}) {
    for (const bool round : {false, true}) {
      for (const int where : {0, 1, 2}) {  // the sum into delta, into residual, apart
        SCOPED_TRACE(testing::Message() << (layernorm ? "LayerNorm" : "RMSNorm") << " round "
                                        << round << " sum " << where);
        const Tensor res = tensor_of(residual, {2, 4}), del = tensor_of(delta, {2, 4});
        const Tensor sum = where == 0   ? del
                           : where == 1 ? res
                                        : tensor_of(std::vector<float>(8), {2, 4});
        Tensor out = tensor_of(std::vector<float>(8), {2, 4});
        Tensor mean = tensor_of({0, 0}, {2}), rstd = tensor_of({0, 0}, {2});
        ops::add_norm_forward(sum, out, mean, rstd, res, del, weight, layernorm ? bias : Tensor(),
                              0.0f, round);
        const std::vector<float> s = sum.to_f32_vector(), o = out.to_f32_vector();
        const std::vector<double> want = {1.5 * r, 0.5 * r, -0.5 * r, -1.5 * r};
        for (int i = 0; i < 4; ++i) {
          EXPECT_EQ(s[i], residual[i] + delta[i]);
          EXPECT_NEAR(o[i], want[i], 1e-6);
        }
        EXPECT_EQ(s[4], round ? 1.0f : 1.0f + 0x1p-10f);
        // The same as the unfused ops in turn, bit for bit.
        Tensor ref_sum = tensor_of(residual, {2, 4}),
               ref_out = tensor_of(std::vector<float>(8), {2, 4});
        Tensor ref_mean = tensor_of({0, 0}, {2}), ref_rstd = tensor_of({0, 0}, {2});
        ops::add_into(ref_sum, tensor_of(delta, {2, 4}));
        if (round) ops::round_to_bf16_(ref_sum);
        if (layernorm)
          ops::layernorm_forward(ref_out, ref_mean, ref_rstd, ref_sum, weight, bias, 0.0f);
        else
          ops::rmsnorm_forward(ref_out, ref_rstd, ref_sum, weight, 0.0f);
        EXPECT_EQ(s, ref_sum.to_f32_vector());
        EXPECT_EQ(o, ref_out.to_f32_vector());
        EXPECT_EQ(rstd.to_f32_vector(), ref_rstd.to_f32_vector());
        if (layernorm) {
          EXPECT_EQ(mean.to_f32_vector(), ref_mean.to_f32_vector());
        }
      }
    }
  }
  // Shapes that do not agree are refused by name.
  const Tensor wide = tensor_of(std::vector<float>(12), {3, 4});
  EXPECT_THROW(ops::add_norm_forward(wide, wide, Tensor(), tensor_of({0, 0, 0}, {3}),
                                     tensor_of(residual, {2, 4}), wide, weight, Tensor(), 0, false),
               Error);
}

TEST(Ops, HeadLossAddsIntoALossSumAndReturnsZero) {
  // A zero head gives every logit 0: each row with a target loses log(vocab) exactly (by hand),
  // and the ignored row nothing. With loss_sum the op returns 0 and the sum accumulates there;
  // values the host adds come back with it.
  const int64_t rows = 6, dim = 4, vocab = 10;
  const Tensor hidden = tensor_of(std::vector<float>(rows * dim, 0.5f), {rows, dim});
  const Tensor head = Tensor::zeros({vocab, dim}, DType::F32, MemCategory::Workspace);
  const std::vector<int32_t> targets = {0, 3, -1, 9, 2, 7};
  LossSum sum(Device::CPU);
  ops::CrossEntropyArgs args;
  args.hidden = hidden;
  args.weight = head;
  args.targets = targets.data();
  args.vocab_chunk = 4;
  const double direct = ops::lm_head_cross_entropy(args);
  EXPECT_NEAR(direct, 5 * std::log(10.0), 1e-5);
  args.loss_sum = sum.slot();
  EXPECT_EQ(ops::lm_head_cross_entropy(args), 0.0);
  EXPECT_EQ(ops::lm_head_cross_entropy(args), 0.0);
  sum.add(0.25);
  EXPECT_NEAR(sum.read(), 10 * std::log(10.0) + 0.25, 2e-5);
  sum.reset();
  EXPECT_EQ(sum.read(), 0.0);
}

TEST(Ops, ShardLossFromReducedStatisticsByHand) {
  // Two rows of statistics (max | sum of exp | target logit) and the maxima over all shards.
  // Row 0: its sum 2 at max 1 is 2 e^-0.5 at the global 1.5, lse = 1.5 + ln(2 e^-0.5) = 1 + ln 2,
  // loss = lse - 0.5. Row 1 is ignored (target -1): lse 2 + ln 3, no loss.
  const Tensor stats = tensor_of({1, 2, 2, 3, 0.5f, 0}, {3, 2});
  const Tensor global_max = tensor_of({1.5f, 2}, {2});
  ops::shard_rescale_sums(stats, global_max);
  const std::vector<float> rescaled = stats.to_f32_vector();
  EXPECT_NEAR(rescaled[2], 2 * std::exp(-0.5), 1e-6);
  EXPECT_EQ(rescaled[3], 3.0f);
  const std::vector<int32_t> targets = {3, -1};
  Tensor lse = Tensor::empty({2}, DType::F32, MemCategory::Workspace);
  std::vector<float> row_losses(2, -1.0f);
  const double loss =
      ops::shard_loss(lse, stats, global_max, targets.data(), row_losses.data(), nullptr);
  EXPECT_NEAR(loss, 0.5 + std::log(2.0), 1e-6);
  EXPECT_NEAR(lse.to_f32_vector()[0], 1 + std::log(2.0), 1e-6);
  EXPECT_NEAR(lse.to_f32_vector()[1], 2 + std::log(3.0), 1e-6);
  EXPECT_NEAR(row_losses[0], 0.5 + std::log(2.0), 1e-6);
  EXPECT_EQ(row_losses[1], 0.0f);
  LossSum sum(Device::CPU);
  sum.add(1.0);
  EXPECT_EQ(ops::shard_loss(lse, stats, global_max, targets.data(), nullptr, sum.slot()), 0.0);
  EXPECT_NEAR(sum.read(), 1.5 + std::log(2.0), 1e-6);
  // Statistics of the wrong shape are refused by name.
  expect_contains(error_message([&] {
                    ops::shard_rescale_sums(tensor_of({1, 2, 3, 4}, {2, 2}), global_max);
                  }),
                  {"shard_rescale_sums", "F32 [3, 2]", "[2, 2]"});
}

TEST(Ops, CudaTensorsWithoutCudaAreRefusedByName) {
  // Without CUDA in the build, or without a visible GPU, a CUDA tensor is refused with the cause.
  if (device_memory::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  const std::string expected = device_memory::built_with(Device::CUDA)
                                   ? "no CUDA device is visible"
                                   : "device 'cuda' is not built into this loom";
  const std::string message = error_message(
      [] { (void)Tensor::empty({4}, DType::F32, MemCategory::Activations, Device::CUDA); });
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  const Tensor host = Tensor::zeros({4}, DType::F32, MemCategory::Workspace);
  EXPECT_NE(
      error_message([&] { (void)host.to(Device::CUDA, MemCategory::Workspace); }).find(expected),
      std::string::npos);
}

}  // namespace
}  // namespace loom::test
