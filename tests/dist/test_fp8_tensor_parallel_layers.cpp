// FP8 column- and row-parallel layers against one process's FP8 Linear layers on the same
// weights, inputs and output gradients, for each recipe, with and without sequence parallelism,
// over two steps (the delayed recipe's second step scales from its history).
//
// Each layer is fed given tensors, never another GEMM's output, so every rank's operands are
// exactly slices of one process's: where the rank quantises them as one process does (the same
// per-tensor scale, reduced over tp; the same 128-wide tiles), its dequantised operands are the
// same numbers and the results differ from one process's only by f32 sums taken in another
// order (kTolerance, 1e-5 of the largest value). A rank that scaled a slice by the slice's own
// amax, or cut a tile, changes most of the quantised values of that operand by up to a grid step
// (2^-4 relative for E4M3), far beyond it: without the tp reduction of the amaxes the per-tensor
// recipes fail here, and so does blockwise with 64-wide slices of the tiles (both checked by
// mutation). The amax histories are maxima of the same numbers, so they agree exactly.
#include <gtest/gtest.h>

#include "loom/dist/tensor_comm.hpp"
#include "loom/model/fp8_linear.hpp"
#include "loom/model/tensor_shard.hpp"
#include "tensor_parallel_fixture.hpp"

namespace loom::test {
namespace {

struct Fp8LayerCase {
  Fp8Recipe recipe;
  bool sequence_parallel;
};

std::string case_name(const Fp8LayerCase& c) {
  return std::string(fp8_recipe_name(c.recipe)) + (c.sequence_parallel ? "_sp" : "");
}

double relative_difference(const std::vector<float>& want, const std::vector<float>& got) {
  EXPECT_EQ(want.size(), got.size());
  double largest = 0, worst = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(want[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(want[i]) - got[i]));
  }
  return largest > 0 ? worst / largest : worst;
}

std::vector<float> values_of(const Tensor& t) { return t.to_f32_vector(); }
Tensor empty_f32(const Shape& shape) {
  return Tensor::empty(shape, DType::F32, MemCategory::Workspace);
}

class Fp8TensorParallelLayers : public ::testing::TestWithParam<Fp8LayerCase> {};

TEST_P(Fp8TensorParallelLayers, FollowOneProcessFp8Layers) {
  const auto world_group = std::make_shared<MpiProcessGroup>(
      MPI_COMM_WORLD, "world", MpiProcessGroup::CommOwnership::Borrowed);
  const std::shared_ptr<ProcessGroup> tp = layouts(world_group).front().tp;
  const int n = tp->size(), rank = tp->rank();
  if (n == 1) GTEST_SKIP() << "one rank: nothing split";
  const Fp8LayerCase c = GetParam();
  // Slices of 256 columns a rank (two tiles); 256 rows, two 128-row tiles along the tokens.
  const int64_t rows = 256, in = 256, hidden = 256 * n, out = 256;
  const int64_t local_rows = c.sequence_parallel ? rows / n : rows;
  Fp8Config config;
  config.recipe = c.recipe;

  auto ref_context = std::make_shared<Fp8Context>();
  ref_context->config = config;
  Linear fc("fc", in, hidden, true, false), proj("proj", hidden, out, true, false);
  for (auto [p, stream] :
       {std::pair{&fc.weight, 1}, {&fc.bias, 2}, {&proj.weight, 3}, {&proj.bias, 4}}) {
    const std::vector<float> v = random_values(p->value.numel(), stream, 0.05);
    std::copy(v.begin(), v.end(), p->value.f32());
  }
  Fp8Training reference(ref_context, {fc.enable_fp8(ref_context), proj.enable_fp8(ref_context)});

  auto tp_context = std::make_shared<Fp8Context>();
  tp_context->config = config;
  tp_context->reduce_max = [tp](std::span<float> values) {
    comm::all_reduce(*tp, values.data(), static_cast<int64_t>(values.size()), ReduceOp::Max)
        ->wait();
  };
  ColumnParallelLinear fc_tp("fc", in, hidden, true, tp, c.sequence_parallel);
  RowParallelLinear proj_tp("proj", hidden, out, true, tp, c.sequence_parallel);
  fc_tp.load_full(fc.weight.value, &fc.bias.value);
  proj_tp.load_full(proj.weight.value, &proj.bias.value);
  Fp8Training parallel(tp_context,
                       {fc_tp.local.enable_fp8(tp_context), proj_tp.local.enable_fp8(tp_context)});

  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    const std::vector<float> x = random_values(rows * in, 10 + step),
                             h = random_values(rows * hidden, 20 + step),
                             d_fc = random_values(rows * hidden, 30 + step, 1e-3),
                             d_proj = random_values(rows * out, 40 + step, 1e-3);
    reference.begin_step();
    parallel.begin_step();
    // One process.
    const Tensor y_fc = empty_f32({rows, hidden}), dx = empty_f32({rows, in});
    fc.forward(y_fc, 0, tensor_of({rows, in}, x));
    fc.backward(dx, false, tensor_of({rows, hidden}, d_fc), 0, tensor_of({rows, in}, x));
    const Tensor y_proj = empty_f32({rows, out}), dh = empty_f32({rows, hidden});
    proj.forward(y_proj, 0, tensor_of({rows, hidden}, h));
    proj.backward(dh, false, tensor_of({rows, out}, d_proj), 0, tensor_of({rows, hidden}, h));
    // This rank: its rows of the stream under sequence parallelism, its columns of the hidden.
    const int64_t r0 = c.sequence_parallel ? rank * local_rows : 0;
    const Tensor x_in = tensor_of({local_rows, in}, row_block(x.data(), in, r0, r0 + local_rows));
    const Tensor y_fc_tp = empty_f32({rows, hidden / n}), dx_tp = empty_f32({local_rows, in});
    fc_tp.forward(y_fc_tp, 0, x_in);
    fc_tp.backward(
        dx_tp, false,
        tensor_of({rows, hidden / n}, segment_columns(d_fc.data(), rows, {hidden}, rank, n)), 0,
        x_in);
    const Tensor h_in =
        tensor_of({rows, hidden / n}, segment_columns(h.data(), rows, {hidden}, rank, n));
    const Tensor y_proj_tp = empty_f32({local_rows, out}), dh_tp = empty_f32({rows, hidden / n});
    proj_tp.forward(y_proj_tp, h_in);
    proj_tp.backward(
        dh_tp, false,
        tensor_of({local_rows, out}, row_block(d_proj.data(), out, r0, r0 + local_rows)), h_in);
    reference.finish_step(true);
    parallel.finish_step(true);

    const std::vector<float> want_y_fc = values_of(y_fc), want_dx = values_of(dx),
                             want_y_proj = values_of(y_proj), want_dh = values_of(dh);
    EXPECT_LE(relative_difference(segment_columns(want_y_fc.data(), rows, {hidden}, rank, n),
                                  values_of(y_fc_tp)),
              kTolerance)
        << "column-parallel output";
    EXPECT_LE(
        relative_difference(row_block(want_dx.data(), in, r0, r0 + local_rows), values_of(dx_tp)),
        kTolerance)
        << "column-parallel input gradient";
    EXPECT_LE(relative_difference(row_block(want_y_proj.data(), out, r0, r0 + local_rows),
                                  values_of(y_proj_tp)),
              kTolerance)
        << "row-parallel output";
    EXPECT_LE(relative_difference(segment_columns(want_dh.data(), rows, {hidden}, rank, n),
                                  values_of(dh_tp)),
              kTolerance)
        << "row-parallel input gradient";
    // Maxima of the same numbers: the same histories, bit for bit.
    EXPECT_EQ(parallel.amax_history(), reference.amax_history());
  }
  // Weight and bias gradients of both steps; a row-parallel bias under sequence parallelism
  // holds this rank's rows' part (the model sums it over tp once a step).
  if (c.sequence_parallel) comm::all_reduce(*tp, proj_tp.local.bias.grad, ReduceOp::Sum)->wait();
  for (auto [whole, shard, what] : {std::tuple{&fc.weight, &fc_tp.local.weight, "fc weight"},
                                    {&fc.bias, &fc_tp.local.bias, "fc bias"},
                                    {&proj.weight, &proj_tp.local.weight, "proj weight"},
                                    {&proj.bias, &proj_tp.local.bias, "proj bias"}})
    EXPECT_LE(relative_difference(values_of(take_shard(whole->grad, shard->placement)),
                                  values_of(shard->grad)),
              kTolerance)
        << what << " gradient";
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8TensorParallelLayers,
                         ::testing::Values(Fp8LayerCase{Fp8Recipe::Delayed, false},
                                           Fp8LayerCase{Fp8Recipe::Delayed, true},
                                           Fp8LayerCase{Fp8Recipe::Current, false},
                                           Fp8LayerCase{Fp8Recipe::Current, true},
                                           Fp8LayerCase{Fp8Recipe::Blockwise, false},
                                           Fp8LayerCase{Fp8Recipe::Blockwise, true}),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace loom::test
