// Tensor- and sequence-parallel layers against their unsharded twins (the shape of nanotron's
// and torchtitan's TP tests). Every rank builds the same seeded full weights, inputs and output
// gradients, runs the plain layer on them locally, and runs the parallel layer on its shards;
// its outputs and gradients must equal the matching slices of the plain layer's. Layouts: tp =
// world size, and at 4 ranks also dp = 2 x tp = 2; each with and without sequence parallelism,
// GPT-2 style (biases) and Llama style (none).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "loom/core/rng.hpp"
#include "loom/dist/device_mesh.hpp"
#include "loom/dist/mpi_process_group.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cpu/embedding.hpp"
#include "loom/model/linear.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_linear.hpp"
#include "loom/parallel/vocab_parallel.hpp"

namespace loom::test {
namespace {

// Largest difference over the largest reference value. f32 sums taken in another order (a
// GEMM over a shard, then a reduction over ranks) differ from one process by a few ulp of
// the sum, ~1e-7 here; a wrong slice or a missing or doubled term is off by O(1).
constexpr double kTolerance = 1e-5;
constexpr double kCommTimeoutSeconds = 20.0;  // a rank stuck after a failure ends the job soon
constexpr uint64_t kSeed = 1234;

// Small enough for seconds at 4 ranks; every split dimension divides by 4, and rows = 2 x 4
// (batch x sequence).
constexpr int64_t kRows = 8, kIn = 12, kOut = 16, kFfn = 16, kVocab = 16, kEmbDim = 8;

struct Layout {
  std::string label;
  std::shared_ptr<ProcessGroup> tp;
};

// tp = world, and dp=2 x tp=2 at 4 ranks. Mesh groups are collective to make: every rank
// calls this at the same point of every test.
std::vector<Layout> layouts(std::shared_ptr<ProcessGroup> world) {
  const int n = world->size();
  std::vector<MeshShape> shapes = {MeshShape{.tp = n}};
  if (n == 4) shapes.push_back(MeshShape{.dp = 2, .tp = 2});
  std::vector<Layout> out;
  for (const MeshShape& shape : shapes) {
    DeviceMesh mesh(world, shape);
    out.push_back({shape.to_string(), mesh.group({"tp"})});
  }
  return out;
}

std::vector<float> random_values(int64_t count, uint64_t stream, double scale = 1.0) {
  const CounterRng rng(kSeed, stream);
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>(scale * rng.normal(i));
  return v;
}

Tensor tensor_of(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

// Rows [r0, r1) of a row-major matrix with `cols` columns.
std::vector<float> row_block(const float* m, int64_t cols, int64_t r0, int64_t r1) {
  return std::vector<float>(m + r0 * cols, m + r1 * cols);
}

// For each row, rank `rank`'s columns of every segment, side by side. Written out here
// rather than through the library's shard helpers, so a wrong slice there cannot hide.
std::vector<float> segment_columns(const float* m, int64_t rows,
                                   const std::vector<int64_t>& segments, int rank, int ranks) {
  const int64_t cols = std::accumulate(segments.begin(), segments.end(), int64_t{0});
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0;
    for (int64_t seg : segments) {
      const int64_t share = seg / ranks, begin = offset + rank * share;
      for (int64_t c = begin; c < begin + share; ++c) out.push_back(m[r * cols + c]);
      offset += seg;
    }
  }
  return out;
}

// Rank `rank`'s rows of every segment, concatenated (a [sum(segments), cols] matrix).
std::vector<float> segment_rows(const float* m, int64_t cols, const std::vector<int64_t>& segments,
                                int rank, int ranks) {
  std::vector<float> out;
  int64_t offset = 0;
  for (int64_t seg : segments) {
    const int64_t share = seg / ranks;
    const std::vector<float> block =
        row_block(m, cols, offset + rank * share, offset + (rank + 1) * share);
    out.insert(out.end(), block.begin(), block.end());
    offset += seg;
  }
  return out;
}

std::vector<float> scaled(std::vector<float> v, float factor) {
  for (float& x : v) x *= factor;
  return v;
}

class TensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD, "world",
                                               MpiProcessGroup::CommOwnership::Borrowed);
    world_->set_timeout_seconds(kCommTimeoutSeconds);
  }
  // With LOOM_TP_REPORT set, rank 0 prints each check's worst relative difference over all
  // ranks and layouts.
  // The maximum over ranks is a collective, hence only on request.
  void TearDown() override {
    if (std::getenv("LOOM_TP_REPORT") == nullptr) return;
    std::vector<double> values;
    for (const auto& entry : worst_) values.push_back(entry.second);
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX,
                  MPI_COMM_WORLD);
    if (world_->rank() != 0) return;
    size_t i = 0;
    for (const auto& entry : worst_)
      std::printf("  worst relative difference over ranks: %-36s %.3g\n", entry.first.c_str(),
                  values[i++]);
  }

  // Fails unless max|got - expected| <= kTolerance * max|expected|.
  void expect_close(const std::string& what, const float* got, const std::vector<float>& expected) {
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - expected[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(expected[i])));
    }
    EXPECT_GT(max_ref, 0.0) << what << ": an all-zero reference proves nothing";
    const double relative = max_diff / std::max(max_ref, 1e-30);
    EXPECT_LE(relative, kTolerance) << what << " on rank " << world_->rank();
    double& w = worst_[what];
    w = std::max(w, relative);
  }
  void expect_close(const std::string& what, const std::vector<float>& got,
                    const std::vector<float>& expected) {
    ASSERT_EQ(got.size(), expected.size()) << what;
    expect_close(what, got.data(), expected);
  }

  std::shared_ptr<ProcessGroup> world_;
  std::map<std::string, double> worst_;
};

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
  expect_contains(error_message([&] { VocabParallelEmbedding("wte", odd, 8, tp, false); }),
                  {"VocabParallelEmbedding 'wte'", "vocab = " + std::to_string(odd), tp_text});

  // Rows that do not split under sequence parallelism: thrown before any collective.
  ColumnParallelLinear fc("fc", 4, 2 * n, false, tp, true);
  std::vector<float> buffer(static_cast<size_t>(64 * n), 0.0f);
  expect_contains(error_message([&] { fc.forward(buffer.data(), 2, buffer.data(), odd); }),
                  {"ColumnParallelLinear 'fc' (sequence parallel)",
                   "rows (batch x sequence) = " + std::to_string(odd), tp_text});
  RowParallelLinear proj("proj", 2 * n, 4, true, tp, true);
  expect_contains(error_message([&] { proj.forward(buffer.data(), buffer.data(), odd); }),
                  {"RowParallelLinear 'proj' (sequence parallel)", tp_text});
  VocabParallelCrossEntropyArgs ce;
  ce.rows = 2;
  ce.dim = 4;
  ce.vocab = odd;
  expect_contains(error_message([&] { (void)vocab_parallel_cross_entropy(ce, *tp); }),
                  {"vocab_parallel_cross_entropy", "vocab = " + std::to_string(odd), tp_text});
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
    layer.forward(y.data(), kOut, x.data(), kRows);
    layer.backward(dx.data(), false, d.data(), kOut, x.data(), kRows);
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
          const std::vector<float> input = row_block(x.data(), kIn, r0, r1);

          // Output into a column block of a wider buffer: the padding column must survive.
          constexpr float kSentinel = 7.0f;
          const int64_t ld = local_out + 1;
          std::vector<float> out(kRows * ld, kSentinel);
          layer.forward(out.data(), ld, input.data(), kRows);
          std::vector<float> got;
          for (int64_t r = 0; r < kRows; ++r) {
            got.insert(got.end(), out.begin() + r * ld, out.begin() + r * ld + local_out);
            EXPECT_EQ(out[r * ld + local_out], kSentinel) << "row " << r;
          }
          expect_close("column forward", got,
                       segment_columns(y_ref.data(), kRows, segments, rank, tp));

          // Backward twice: written, then accumulated (gradient accumulation).
          const std::vector<float> d_local = segment_columns(d.data(), kRows, segments, rank, tp);
          std::vector<float> d_out(kRows * ld, kSentinel);
          for (int64_t r = 0; r < kRows; ++r)
            std::copy_n(d_local.begin() + r * local_out, local_out, d_out.begin() + r * ld);
          const std::vector<float> dx_expected = row_block(dx_ref.data(), kIn, r0, r1);
          const std::vector<float> dw_expected =
              segment_rows(ref.layer.weight.grad.f32(), kIn, segments, rank, tp);
          const std::vector<float> db_expected =
              bias ? segment_rows(ref.layer.bias.grad.f32(), 1, segments, rank, tp)
                   : std::vector<float>{};
          std::vector<float> dx(local_rows * kIn, -100.0f);
          for (int pass = 1; pass <= 2; ++pass) {
            layer.backward(dx.data(), pass == 2, d_out.data(), ld, input.data(), kRows);
            const auto factor = static_cast<float>(pass);
            expect_close("column d_input", dx, scaled(dx_expected, factor));
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
        const std::vector<float> input = segment_columns(x.data(), kRows, {kIn}, rank, tp);

        std::vector<float> out(local_rows * kOut, -100.0f);
        layer.forward(out.data(), input.data(), kRows);
        expect_close("row forward", out, row_block(y_ref.data(), kOut, r0, r1));

        const std::vector<float> d_out = row_block(d.data(), kOut, r0, r1);
        const std::vector<float> dx_expected =
            segment_columns(dx_ref.data(), kRows, {kIn}, rank, tp);
        const std::vector<float> dw_expected =
            segment_columns(ref.layer.weight.grad.f32(), kOut, {kIn}, rank, tp);
        std::vector<float> dx(kRows * local_in, -100.0f);
        for (int pass = 1; pass <= 2; ++pass) {
          layer.backward(dx.data(), pass == 2, d_out.data(), input.data(), kRows);
          const auto factor = static_cast<float>(pass);
          expect_close("row d_input", dx, scaled(dx_expected, factor));
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
        fc_ref.forward(pre_ref.data(), fc_out, x.data(), kRows);
        activation(act_ref.data(), pre_ref.data(), kFfn);
        proj_ref.forward(y_ref.data(), h, act_ref.data(), kRows);
        proj_ref.backward(d_act_ref.data(), false, d.data(), h, act_ref.data(), kRows);
        activation_backward(d_pre_ref.data(), d_act_ref.data(), pre_ref.data(), kFfn);
        fc_ref.backward(dx_ref.data(), false, d_pre_ref.data(), fc_out, x.data(), kRows);

        // The split MLP.
        ColumnParallelLinear fc(llama ? "mlp.gate_up" : "mlp.c_fc", h, segments, bias, layout.tp,
                                sp);
        RowParallelLinear proj(llama ? "mlp.down_proj" : "mlp.c_proj", kFfn, h, bias, layout.tp,
                               sp);
        const Tensor fc_b = tensor_of({fc_out}, b_fc), proj_b = tensor_of({h}, b_proj);
        fc.load_full(tensor_of({fc_out, h}, w_fc), bias ? &fc_b : nullptr);
        proj.load_full(tensor_of({h, kFfn}, w_proj), bias ? &proj_b : nullptr);
        const std::vector<float> input = row_block(x.data(), h, r0, r1);
        std::vector<float> pre(kRows * local_fc_out), act(kRows * local_ffn), y(local_rows * h);
        layout.tp->reset_stats();
        fc.forward(pre.data(), local_fc_out, input.data(), kRows);
        activation(act.data(), pre.data(), local_ffn);
        proj.forward(y.data(), act.data(), kRows);
        expect_close("mlp forward", y, row_block(y_ref.data(), h, r0, r1));
        const CommStats forward_stats = layout.tp->stats();

        const std::vector<float> d_out = row_block(d.data(), h, r0, r1);
        std::vector<float> d_act(kRows * local_ffn), d_pre(kRows * local_fc_out),
            dx(local_rows * h);
        layout.tp->reset_stats();
        proj.backward(d_act.data(), false, d_out.data(), act.data(), kRows);
        activation_backward(d_pre.data(), d_act.data(), pre.data(), local_ffn);
        fc.backward(dx.data(), false, d_pre.data(), local_fc_out, input.data(), kRows);
        const CommStats backward_stats = layout.tp->stats();
        all_reduce_sequence_parallel_grads(proj.sequence_parallel_partial_grads(), *layout.tp);

        expect_close("mlp d_input", dx, row_block(dx_ref.data(), h, r0, r1));
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

// ---------------------------------------------------------------------------------------------

TEST_F(TensorParallel, VocabParallelEmbeddingMatchesTheFullLookup) {
  const std::vector<float> table = random_values(kVocab * kEmbDim, 31),
                           d = random_values(kRows * kEmbDim, 32);
  // Tokens from every quarter of the vocabulary, one of them twice (rows 0 and 7).
  std::vector<int32_t> tokens(kRows);
  for (int64_t i = 0; i < kRows; ++i) tokens[i] = static_cast<int32_t>((7 * i + 3) % kVocab);
  tokens[kRows - 1] = tokens[0];
  std::vector<float> out_ref(kRows * kEmbDim), d_table_ref(kVocab * kEmbDim, 0.0f);
  cpu::embedding_forward(out_ref.data(), tokens.data(), table.data(), nullptr, 1, kRows, kEmbDim);
  cpu::embedding_backward(d_table_ref.data(), nullptr, d.data(), tokens.data(), 1, kRows, kEmbDim);

  for (const Layout& layout : layouts(world_))
    for (bool sp : {false, true}) {
      SCOPED_TRACE(layout.label + (sp ? " sp" : ""));
      const int tp = layout.tp->size(), rank = layout.tp->rank();
      const int64_t local_rows = sp ? kRows / tp : kRows, shard = kVocab / tp;
      const int64_t r0 = sp ? rank * local_rows : 0, r1 = r0 + local_rows;
      VocabParallelEmbedding embedding("transformer.wte.weight", kVocab, kEmbDim, layout.tp, sp);
      embedding.load_full(tensor_of({kVocab, kEmbDim}, table));
      EXPECT_EQ(embedding.vocab_begin(), rank * shard);
      EXPECT_EQ(embedding.vocab_end(), (rank + 1) * shard);

      std::vector<float> out(local_rows * kEmbDim, -100.0f);
      embedding.forward(out.data(), tokens.data(), kRows);
      expect_close("embedding forward", out, row_block(out_ref.data(), kEmbDim, r0, r1));
      const std::vector<float> d_out = row_block(d.data(), kEmbDim, r0, r1);
      embedding.backward(d_out.data(), tokens.data(), kRows);
      expect_close("embedding d_table", embedding.weight.grad.f32(),
                   row_block(d_table_ref.data(), kEmbDim, rank * shard, (rank + 1) * shard));

      std::vector<int32_t> bad = tokens;
      bad[3] = static_cast<int32_t>(kVocab);
      expect_contains(
          error_message([&] { embedding.forward(out.data(), bad.data(), kRows); }),
          {"VocabParallelEmbedding 'transformer.wte.weight'", "token 16 at row 3", "[0, 16)"});
    }
}

// ---------------------------------------------------------------------------------------------

TEST_F(TensorParallel, VocabParallelCrossEntropyMatchesTheFusedKernel) {
  const int64_t dim = kIn;
  const std::vector<float> hidden = random_values(kRows * dim, 41),
                           weight = random_values(kVocab * dim, 42, 0.5);
  // Targets in every shard; rows 2 and 5 ignored (-1), as the fused kernel allows.
  std::vector<int32_t> targets(kRows);
  for (int64_t i = 0; i < kRows; ++i) targets[i] = static_cast<int32_t>((5 * i + 2) % kVocab);
  targets[2] = targets[5] = -1;
  const float grad_scale = 1.0f / static_cast<float>(kRows - 2);  // mean over counted rows

  std::vector<float> d_hidden_ref(kRows * dim), d_weight_ref(kVocab * dim, 0.0f), losses_ref(kRows);
  cpu::CrossEntropyArgs ref{};
  ref.hidden = hidden.data();
  ref.weight = weight.data();
  ref.targets = targets.data();
  ref.rows = kRows;
  ref.dim = dim;
  ref.vocab = kVocab;
  ref.vocab_chunk = 5;
  ref.grad_scale = grad_scale;
  ref.d_hidden = d_hidden_ref.data();
  ref.d_weight = d_weight_ref.data();
  ref.row_losses = losses_ref.data();
  const double loss_ref = cpu::lm_head_cross_entropy(ref);
  ASSERT_GT(loss_ref, 0.0);

  for (const Layout& layout : layouts(world_))
    for (bool sp : {false, true})
      for (int64_t chunk : {int64_t{3}, kVocab}) {  // chunks that split the shard unevenly, or one
        SCOPED_TRACE(layout.label + (sp ? " sp" : "") + " chunk=" + std::to_string(chunk));
        const int tp = layout.tp->size(), rank = layout.tp->rank();
        const int64_t local_rows = sp ? kRows / tp : kRows, shard = kVocab / tp;
        const int64_t r0 = sp ? rank * local_rows : 0, r1 = r0 + local_rows;
        const std::vector<float> weight_shard =
            row_block(weight.data(), dim, rank * shard, (rank + 1) * shard);
        const std::vector<float> hidden_in = row_block(hidden.data(), dim, r0, r1);
        std::vector<float> d_hidden(local_rows * dim, -100.0f), d_weight(shard * dim, 0.0f),
            losses(kRows, -1.0f);

        VocabParallelCrossEntropyArgs args;
        args.hidden = hidden_in.data();
        args.weight = weight_shard.data();
        args.targets = targets.data();
        args.rows = kRows;
        args.dim = dim;
        args.vocab = kVocab;
        args.vocab_chunk = chunk;
        args.grad_scale = grad_scale;
        args.d_hidden = d_hidden.data();
        args.d_weight = d_weight.data();
        args.row_losses = losses.data();
        args.sequence_parallel = sp;
        layout.tp->reset_stats();
        const double loss = vocab_parallel_cross_entropy(args, *layout.tp);

        const double loss_diff = std::fabs(loss - loss_ref) / loss_ref;
        EXPECT_LE(loss_diff, kTolerance) << loss << " vs " << loss_ref;
        worst_["cross-entropy loss sum"] = std::max(worst_["cross-entropy loss sum"], loss_diff);
        expect_close("cross-entropy row losses", losses, losses_ref);
        EXPECT_EQ(losses[2], 0.0f);
        expect_close("cross-entropy d_hidden", d_hidden,
                     row_block(d_hidden_ref.data(), dim, r0, r1));
        expect_close("cross-entropy d_weight", d_weight,
                     row_block(d_weight_ref.data(), dim, rank * shard, (rank + 1) * shard));

        // Only per-row scalars and d_hidden cross ranks, never [rows, vocab] logits: two
        // all-reduces of rows and 2*rows floats, then d_hidden's reduction.
        if (tp == 1) continue;
        const CommStats& stats = layout.tp->stats();
        EXPECT_EQ(stats.count(CommOp::AllReduce), sp ? 2 : 3);
        EXPECT_EQ(stats.count(CommOp::AllGather), sp ? 1 : 0);
        EXPECT_EQ(stats.count(CommOp::ReduceScatter), sp ? 1 : 0);
        const int64_t scalar_bytes = ring_all_reduce_wire_bytes(4 * kRows, tp).sent +
                                     ring_all_reduce_wire_bytes(8 * kRows, tp).sent;
        const int64_t d_hidden_bytes =
            sp ? ring_reduce_scatter_wire_bytes(4 * local_rows * dim, tp).sent
               : ring_all_reduce_wire_bytes(4 * kRows * dim, tp).sent;
        const int64_t hidden_bytes =
            sp ? ring_all_gather_wire_bytes(4 * local_rows * dim, tp).sent : 0;
        EXPECT_EQ(stats.sent(CommOp::AllReduce) + stats.sent(CommOp::ReduceScatter) +
                      stats.sent(CommOp::AllGather),
                  scalar_bytes + d_hidden_bytes + hidden_bytes);
      }
}

}  // namespace
}  // namespace loom::test
