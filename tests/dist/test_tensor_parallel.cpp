// Column- and row-parallel linear layers and the MLP they compose, against plain Linear layers
// (fixture and layouts: tensor_parallel_fixture.hpp).
#include "tensor_parallel_fixture.hpp"

namespace loom::test {
namespace {

// The plain (reference) Linear computes on tensors; these run it on vectors of `rows` rows.
void reference_forward(const Linear& layer, std::vector<float>& y, const std::vector<float>& x,
                       int64_t rows) {
  const Tensor out = Tensor::empty({rows, layer.out_features()}, DType::F32, MemCategory::Workspace);
  layer.forward(out, 0, tensor_of({rows, layer.in_features()}, x));
  y = out.to_f32_vector();
}
void reference_backward(Linear& layer, std::vector<float>& dx, const std::vector<float>& dy,
                        const std::vector<float>& x, int64_t rows) {
  const Tensor d_in = Tensor::empty({rows, layer.in_features()}, DType::F32, MemCategory::Workspace);
  layer.backward(d_in, false, tensor_of({rows, layer.out_features()}, dy), 0,
                 tensor_of({rows, layer.in_features()}, x));
  dx = d_in.to_f32_vector();
}
// ---------------------------------------------------------------------------------------------

TEST_F(TensorParallel, ShardHelpersTakeTheRightBlocks) {
  // [6, 2] matrix with value 10*row + column; 1-D bias [6]; two segments {4, 2}.
  std::vector<float> m(12), b(6);
  for (int r = 0; r < 6; ++r) {
    b[r] = static_cast<float>(r);
    for (int c = 0; c < 2; ++c) m[r * 2 + c] = static_cast<float>(10 * r + c);
  }
  const Tensor full = tensor_of({6, 2}, m), bias = tensor_of({6}, b);
  EXPECT_EQ(row_shard(full, 1, 2).to_f32_vector(), (std::vector<float>{30, 31, 40, 41, 50, 51}));
  EXPECT_EQ(row_shard(full, 1, 2, {4, 2}).to_f32_vector(),
            (std::vector<float>{20, 21, 30, 31, 50, 51}));
  EXPECT_EQ(row_shard(bias, 0, 2, {4, 2}).to_f32_vector(), (std::vector<float>{0, 1, 4}));
  EXPECT_EQ(row_shard(full, 0, 2, {4, 2}).shape(), (Shape{3, 2}));
  const Tensor wide = tensor_of({2, 4}, {0, 1, 2, 3, 10, 11, 12, 13});
  EXPECT_EQ(column_shard(wide, 1, 2).to_f32_vector(), (std::vector<float>{2, 3, 12, 13}));
  EXPECT_EQ(column_shard(wide, 3, 4).to_f32_vector(), (std::vector<float>{3, 13}));
}

TEST_F(TensorParallel, SizesThatDoNotDivideByTpAreRejectedNamingLayerDimensionAndTp) {
  expect_contains(error_message([] {
                    (void)tp_shard_size("ColumnParallelLinear 'fc'", "out_features", 10, 4);
                  }),
                  {"ColumnParallelLinear 'fc'", "out_features = 10", "does not divide by tp = 4"});
  expect_contains(
      error_message([] { (void)sequence_shard_rows("RowParallelLinear 'proj'", 6, 4); }),
      {"RowParallelLinear 'proj'", "sequence parallel", "rows (batch x sequence) = 6", "tp = 4"});
  expect_contains(
      error_message([] {
        (void)row_shard(Tensor::zeros({6, 2}, DType::F32, MemCategory::Workspace), 0, 4);
      }),
      {"row_shard", "[6, 2]", "= 6", "tp = 4"});
  expect_contains(
      error_message([] {
        (void)column_shard(Tensor::zeros({2, 6}, DType::F32, MemCategory::Workspace), 0, 4);
      }),
      {"column_shard", "columns = 6", "tp = 4"});

  // The layers themselves, on the world's tp group (every size divides by one rank).
  const auto tp = layouts(world_).front().tp;
  const int n = tp->size();
  if (n == 1) return;
  const std::string tp_text = "tp = " + std::to_string(n);
  const int64_t odd = 2 * n + 1;
  expect_contains(
      error_message([&] { ColumnParallelLinear("h.0.mlp.c_fc", 8, odd, true, tp, false); }),
      {"ColumnParallelLinear 'h.0.mlp.c_fc'", "out_features = " + std::to_string(odd), tp_text});
  expect_contains(error_message([&] {
                    ColumnParallelLinear("h.0.attn.c_attn", 8, std::vector<int64_t>{2 * n, odd},
                                         true, tp, false);
                  }),
                  {"ColumnParallelLinear 'h.0.attn.c_attn'",
                   "out_features segment 1 = " + std::to_string(odd), tp_text});
  expect_contains(
      error_message([&] { RowParallelLinear("h.0.mlp.c_proj", odd, 8, true, tp, false); }),
      {"RowParallelLinear 'h.0.mlp.c_proj'", "in_features = " + std::to_string(odd), tp_text});
  // A vocabulary that does not divide is split unevenly (the model tests train on one); one
  // with fewer entries than ranks is refused.
  const int64_t tiny_vocab = n - 1;
  expect_contains(error_message([&] { VocabParallelEmbedding("wte", tiny_vocab, 8, tp, false); }),
                  {"VocabParallelEmbedding 'wte'", "vocab = " + std::to_string(tiny_vocab),
                   "smaller than " + tp_text});

  // Rows that do not split under sequence parallelism: thrown before any collective.
  ColumnParallelLinear fc("fc", 4, 2 * n, false, tp, true);
  const auto zeros = [](Shape shape) { return Tensor::zeros(shape, DType::F32, MemCategory::Workspace); };
  expect_contains(error_message([&] { fc.forward(zeros({odd, 2}), 0, zeros({odd, 4})); }),
                  {"ColumnParallelLinear 'fc' (sequence parallel)",
                   "rows (batch x sequence) = " + std::to_string(odd), tp_text});
  RowParallelLinear proj("proj", 2 * n, 4, true, tp, true);
  expect_contains(error_message([&] { proj.forward(zeros({odd, 4}), zeros({odd, 2})); }),
                  {"RowParallelLinear 'proj' (sequence parallel)", tp_text});
  VocabParallelCrossEntropyArgs ce;
  ce.rows = 2;
  ce.vocab = tiny_vocab;
  expect_contains(error_message([&] { (void)vocab_parallel_cross_entropy(ce, *tp); }),
                  {"vocab_parallel_cross_entropy", "vocab = " + std::to_string(tiny_vocab),
                   "smaller than " + tp_text});
  // A full tensor of the wrong shape when loading a shard.
  expect_contains(
      error_message([&] {
        fc.load_full(Tensor::zeros({2 * n, 5}, DType::F32, MemCategory::Workspace), nullptr);
      }),
      {"ColumnParallelLinear 'fc'", "full weight is [" + std::to_string(2 * n) + ", 5]",
       "expected [" + std::to_string(2 * n) + ", 4]"});
}


// The unsharded twin: a plain Linear [kOut, kIn] on the full weights, run forward and backward
// once on the full input x and output gradient d.
struct ReferenceLinear {
  ReferenceLinear(const std::vector<float>& w, const std::vector<float>* b, const std::vector<float>& x,
                  const std::vector<float>& d)
      : layer("ref", kIn, kOut, b != nullptr, false), y(kRows * kOut), dx(kRows * kIn) {
    std::copy(w.begin(), w.end(), layer.weight.value.f32());
    if (b != nullptr) std::copy(b->begin(), b->end(), layer.bias.value.f32());
    reference_forward(layer, y, x, kRows);
    reference_backward(layer, dx, d, x, kRows);
  }
  Linear layer;
  std::vector<float> y, dx;
};

// ---------------------------------------------------------------------------------------------
// ColumnParallelLinear: one output, and a fused q|k|v-like output of three segments.

TEST_F(TensorParallel, ColumnParallelLinearMatchesLinear) {
  const std::vector<float> w_all = random_values(kOut * kIn, 1, 0.3),
                           b_all = random_values(kOut, 2);
  const std::vector<float> x = random_values(kRows * kIn, 3), d = random_values(kRows * kOut, 4);
  for (const Layout& layout : layouts(world_))
    for (bool sp : {false, true})
      for (bool bias : {true, false})
        for (const std::vector<int64_t>& segments :
             {std::vector<int64_t>{kOut}, std::vector<int64_t>{8, 4, 4}}) {
          const std::string label = layout.label + (sp ? " sp" : "") + (bias ? " bias" : "") +
                                    " segments=" + std::to_string(segments.size());
          SCOPED_TRACE(label);
          const int tp = layout.tp->size(), rank = layout.tp->rank();
          const int64_t local_out = kOut / tp, local_rows = sp ? kRows / tp : kRows;
          const int64_t r0 = sp ? rank * local_rows : 0, r1 = r0 + local_rows;

          ReferenceLinear ref(w_all, bias ? &b_all : nullptr, x, d);
          const std::vector<float>& y_ref = ref.y;
          const std::vector<float>& dx_ref = ref.dx;

          ColumnParallelLinear layer("h.0.attn.c_attn", kIn, segments, bias, layout.tp, sp);
          const Tensor full_b = tensor_of({kOut}, b_all);
          layer.load_full(tensor_of({kOut, kIn}, w_all), bias ? &full_b : nullptr);
          EXPECT_EQ(layer.local.weight.name, "h.0.attn.c_attn.weight");
          EXPECT_EQ(layer.local.weight.placement.replicated, tp == 1);
          const Tensor input = tensor_of({local_rows, kIn}, row_block(x.data(), kIn, r0, r1));

          // Output into columns [1, 1 + local_out) of a wider tensor: column 0 must survive.
          constexpr float kSentinel = 7.0f;
          const int64_t ld = local_out + 1;
          const Tensor out_tensor = tensor_of({kRows, ld}, std::vector<float>(kRows * ld, kSentinel));
          layer.forward(out_tensor, 1, input);
          const std::vector<float> out = out_tensor.to_f32_vector();
          std::vector<float> got;
          for (int64_t r = 0; r < kRows; ++r) {
            got.insert(got.end(), out.begin() + r * ld + 1, out.begin() + r * ld + 1 + local_out);
            EXPECT_EQ(out[r * ld], kSentinel) << "row " << r;
          }
          expect_close("column forward", got,
                       segment_columns(y_ref.data(), kRows, segments, rank, tp));

          // Backward twice: written, then accumulated (gradient accumulation).
          const std::vector<float> d_local = segment_columns(d.data(), kRows, segments, rank, tp);
          std::vector<float> d_out(kRows * ld, kSentinel);
          for (int64_t r = 0; r < kRows; ++r)
            std::copy_n(d_local.begin() + r * local_out, local_out, d_out.begin() + r * ld + 1);
          const Tensor d_out_tensor = tensor_of({kRows, ld}, d_out);
          const std::vector<float> dx_expected = row_block(dx_ref.data(), kIn, r0, r1);
          const std::vector<float> dw_expected =
              segment_rows(ref.layer.weight.grad.f32(), kIn, segments, rank, tp);
          const std::vector<float> db_expected =
              bias ? segment_rows(ref.layer.bias.grad.f32(), 1, segments, rank, tp)
                   : std::vector<float>{};
          const Tensor dx = tensor_of({local_rows, kIn}, std::vector<float>(local_rows * kIn, -100.0f));
          for (int pass = 1; pass <= 2; ++pass) {
            layer.backward(dx, pass == 2, d_out_tensor, 1, input);
            const auto factor = static_cast<float>(pass);
            expect_close("column d_input", dx.to_f32_vector(), scaled(dx_expected, factor));
            expect_close("column d_weight", layer.local.weight.grad.f32(),
                         scaled(dw_expected, factor));
            if (bias)
              expect_close("column d_bias", layer.local.bias.grad.f32(),
                           scaled(db_expected, factor));
          }
        }
}

// ---------------------------------------------------------------------------------------------

TEST_F(TensorParallel, RowParallelLinearMatchesLinear) {
  const std::vector<float> w_all = random_values(kOut * kIn, 11, 0.3),
                           b_all = random_values(kOut, 12);
  const std::vector<float> x = random_values(kRows * kIn, 13), d = random_values(kRows * kOut, 14);
  for (const Layout& layout : layouts(world_))
    for (bool sp : {false, true})
      for (bool bias : {true, false}) {
        SCOPED_TRACE(layout.label + (sp ? " sp" : "") + (bias ? " bias" : ""));
        const int tp = layout.tp->size(), rank = layout.tp->rank();
        const int64_t local_in = kIn / tp, local_rows = sp ? kRows / tp : kRows;
        const int64_t r0 = sp ? rank * local_rows : 0, r1 = r0 + local_rows;

        ReferenceLinear ref(w_all, bias ? &b_all : nullptr, x, d);
        const std::vector<float>& y_ref = ref.y;
        const std::vector<float>& dx_ref = ref.dx;

        RowParallelLinear layer("h.0.mlp.c_proj", kIn, kOut, bias, layout.tp, sp);
        const Tensor full_b = tensor_of({kOut}, b_all);
        layer.load_full(tensor_of({kOut, kIn}, w_all), bias ? &full_b : nullptr);
        EXPECT_EQ(layer.local.weight.placement.replicated, tp == 1);
        if (bias) {
          EXPECT_TRUE(layer.local.bias.placement.replicated);
        }
        const Tensor input =
            tensor_of({kRows, local_in}, segment_columns(x.data(), kRows, {kIn}, rank, tp));

        const Tensor out = tensor_of({local_rows, kOut}, std::vector<float>(local_rows * kOut, -100.0f));
        layer.forward(out, input);
        expect_close("row forward", out.to_f32_vector(), row_block(y_ref.data(), kOut, r0, r1));

        const std::vector<float> d_out = row_block(d.data(), kOut, r0, r1);
        const Tensor d_out_tensor = tensor_of({local_rows, kOut}, d_out);
        const std::vector<float> dx_expected =
            segment_columns(dx_ref.data(), kRows, {kIn}, rank, tp);
        const std::vector<float> dw_expected =
            segment_columns(ref.layer.weight.grad.f32(), kOut, {kIn}, rank, tp);
        const Tensor dx = tensor_of({kRows, local_in}, std::vector<float>(kRows * local_in, -100.0f));
        for (int pass = 1; pass <= 2; ++pass) {
          layer.backward(dx, pass == 2, d_out_tensor, input);
          const auto factor = static_cast<float>(pass);
          expect_close("row d_input", dx.to_f32_vector(), scaled(dx_expected, factor));
          expect_close("row d_weight", layer.local.weight.grad.f32(), scaled(dw_expected, factor));
        }
        if (!bias) {
          EXPECT_TRUE(layer.sequence_parallel_partial_grads().empty());
          continue;
        }
        const std::vector<float> db_ref(ref.layer.bias.grad.f32(), ref.layer.bias.grad.f32() + kOut);
        if (!sp) {
          EXPECT_TRUE(layer.sequence_parallel_partial_grads().empty());
          expect_close("row d_bias", layer.local.bias.grad.f32(), scaled(db_ref, 2.0f));
          continue;
        }
        // Under SP the bias gradient is the column sum of this rank's rows of d_out only...
        std::vector<float> partial(kOut, 0.0f);
        for (int64_t r = 0; r < local_rows; ++r)
          for (int64_t j = 0; j < kOut; ++j) partial[j] += d_out[r * kOut + j];
        expect_close("row d_bias (SP, this rank's rows)", layer.local.bias.grad.f32(),
                     scaled(partial, 2.0f));
        // ... and the helper's sum over tp completes it.
        const ParameterList partial_grads = layer.sequence_parallel_partial_grads();
        ASSERT_EQ(partial_grads.size(), 1u);
        EXPECT_EQ(partial_grads[0], &layer.local.bias);
        all_reduce_sequence_parallel_grads(partial_grads, *layout.tp);
        expect_close("row d_bias (SP, summed over tp)", layer.local.bias.grad.f32(),
                     scaled(db_ref, 2.0f));
      }
}

// ---------------------------------------------------------------------------------------------
// Column -> activation -> Row, the way an MLP is split: GPT-2 (fc, GELU, proj, with biases) and
// Llama (gate|up fused as two segments, SwiGLU, down, no biases).

TEST_F(TensorParallel, MlpOfColumnThenRowMatchesTheUnshardedMlp) {
  const int64_t h = kIn;
  const std::vector<float> x = random_values(kRows * h, 21), d = random_values(kRows * h, 22);
  for (const Layout& layout : layouts(world_))
    for (bool sp : {false, true})
      for (bool llama : {false, true}) {
        SCOPED_TRACE(layout.label + (sp ? " sp" : "") + (llama ? " llama" : " gpt2"));
        const int tp = layout.tp->size(), rank = layout.tp->rank();
        const bool bias = !llama;
        const std::vector<int64_t> segments =
            llama ? std::vector<int64_t>{kFfn, kFfn} : std::vector<int64_t>{kFfn};
        const int64_t fc_out = llama ? 2 * kFfn : kFfn, local_ffn = kFfn / tp,
                      local_fc_out = fc_out / tp;
        const int64_t local_rows = sp ? kRows / tp : kRows;
        const int64_t r0 = sp ? rank * local_rows : 0, r1 = r0 + local_rows;
        const std::vector<float> w_fc = random_values(fc_out * h, 23, 0.3),
                                 b_fc = random_values(fc_out, 24);
        const std::vector<float> w_proj = random_values(h * kFfn, 25, 0.3),
                                 b_proj = random_values(h, 26);

        // The unsharded MLP.
        Linear fc_ref("fc", h, fc_out, bias, false), proj_ref("proj", kFfn, h, bias, false);
        std::copy(w_fc.begin(), w_fc.end(), fc_ref.weight.value.f32());
        std::copy(w_proj.begin(), w_proj.end(), proj_ref.weight.value.f32());
        if (bias) {
          std::copy(b_fc.begin(), b_fc.end(), fc_ref.bias.value.f32());
          std::copy(b_proj.begin(), b_proj.end(), proj_ref.bias.value.f32());
        }
        auto activation = [&](float* act, const float* pre, int64_t width) {
          if (llama)
            cpu::swiglu_forward(act, pre, pre + width, kRows, width, 2 * width);
          else
            cpu::gelu_forward(act, pre, kRows * width);
        };
        auto activation_backward = [&](float* d_pre, const float* d_act, const float* pre,
                                       int64_t width) {
          if (llama)
            cpu::swiglu_backward(d_pre, d_pre + width, d_act, pre, pre + width, kRows, width,
                                 2 * width);
          else
            cpu::gelu_backward(d_pre, d_act, pre, kRows * width);
        };
        std::vector<float> pre_ref(kRows * fc_out), act_ref(kRows * kFfn), y_ref(kRows * h);
        std::vector<float> d_act_ref(kRows * kFfn), d_pre_ref(kRows * fc_out), dx_ref(kRows * h);
        reference_forward(fc_ref, pre_ref, x, kRows);
        activation(act_ref.data(), pre_ref.data(), kFfn);
        reference_forward(proj_ref, y_ref, act_ref, kRows);
        reference_backward(proj_ref, d_act_ref, d, act_ref, kRows);
        activation_backward(d_pre_ref.data(), d_act_ref.data(), pre_ref.data(), kFfn);
        reference_backward(fc_ref, dx_ref, d_pre_ref, x, kRows);

        // The split MLP.
        ColumnParallelLinear fc(llama ? "mlp.gate_up" : "mlp.c_fc", h, segments, bias, layout.tp,
                                sp);
        RowParallelLinear proj(llama ? "mlp.down_proj" : "mlp.c_proj", kFfn, h, bias, layout.tp,
                               sp);
        const Tensor fc_b = tensor_of({fc_out}, b_fc), proj_b = tensor_of({h}, b_proj);
        fc.load_full(tensor_of({fc_out, h}, w_fc), bias ? &fc_b : nullptr);
        proj.load_full(tensor_of({h, kFfn}, w_proj), bias ? &proj_b : nullptr);
        const Tensor input = tensor_of({local_rows, h}, row_block(x.data(), h, r0, r1));
        const auto empty = [](Shape shape) { return Tensor::empty(shape, DType::F32, MemCategory::Workspace); };
        const Tensor pre = empty({kRows, local_fc_out}), act = empty({kRows, local_ffn}),
                     y = empty({local_rows, h});
        layout.tp->reset_stats();
        fc.forward(pre, 0, input);
        activation(act.f32(), pre.f32(), local_ffn);
        proj.forward(y, act);
        expect_close("mlp forward", y.to_f32_vector(), row_block(y_ref.data(), h, r0, r1));
        const CommStats forward_stats = layout.tp->stats();

        const Tensor d_out = tensor_of({local_rows, h}, row_block(d.data(), h, r0, r1));
        const Tensor d_act = empty({kRows, local_ffn}), d_pre = empty({kRows, local_fc_out}),
                     dx = empty({local_rows, h});
        layout.tp->reset_stats();
        proj.backward(d_act, false, d_out, act);
        activation_backward(d_pre.f32(), d_act.f32(), pre.f32(), local_ffn);
        fc.backward(dx, false, d_pre, 0, input);
        const CommStats backward_stats = layout.tp->stats();
        all_reduce_sequence_parallel_grads(proj.sequence_parallel_partial_grads(), *layout.tp);

        expect_close("mlp d_input", dx.to_f32_vector(), row_block(dx_ref.data(), h, r0, r1));
        expect_close("mlp fc d_weight", fc.local.weight.grad.f32(),
                     segment_rows(fc_ref.weight.grad.f32(), h, segments, rank, tp));
        expect_close("mlp proj d_weight", proj.local.weight.grad.f32(),
                     segment_columns(proj_ref.weight.grad.f32(), h, {kFfn}, rank, tp));
        if (bias) {
          expect_close("mlp fc d_bias", fc.local.bias.grad.f32(),
                       segment_rows(fc_ref.bias.grad.f32(), 1, segments, rank, tp));
          expect_close("mlp proj d_bias", proj.local.bias.grad.f32(),
                       std::vector<float>(proj_ref.bias.grad.f32(), proj_ref.bias.grad.f32() + h));
        }

        // The communication Megatron's split promises (section 3; with SP, section 4.2.2):
        // one all-reduce each way, or an all-gather and a reduce-scatter in its place (plus
        // backward's second all-gather, re-gathering the column layer's input).
        if (tp == 1) continue;
        EXPECT_EQ(forward_stats.count(CommOp::AllReduce), sp ? 0 : 1);
        EXPECT_EQ(forward_stats.count(CommOp::AllGather), sp ? 1 : 0);
        EXPECT_EQ(forward_stats.count(CommOp::ReduceScatter), sp ? 1 : 0);
        EXPECT_EQ(backward_stats.count(CommOp::AllReduce), sp ? 0 : 1);
        EXPECT_EQ(backward_stats.count(CommOp::AllGather), sp ? 2 : 0);
        EXPECT_EQ(backward_stats.count(CommOp::ReduceScatter), sp ? 1 : 0);
      }
}

}  // namespace
}  // namespace loom::test
