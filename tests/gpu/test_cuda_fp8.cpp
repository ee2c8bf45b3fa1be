// FP8 on CUDA against the CPU's emulation (kernels/cpu/fp8, model/fp8_linear), which is itself
// checked against a brute-force code table and a PyTorch reference (tests/test_fp8_*.cpp):
//   - quantisation: the device's codes equal cpu::fp8_encode of the same f32 products, code for
//     code (ties, subnormals, saturation, both formats, bf16 and f32 inputs, transposed too), its
//     amax and scale pair those of cpu::abs_max and cpu::fp8_scale, bit for bit;
//   - the GEMM: cuBLASLt's FP8 product equals the product of the dequantised values in double,
//     within the FP8 tensor cores' accumulation (2^-12 of the sum of |a b|: they keep about 14
//     bits between promotions to f32) and, for a bf16 result, one rounding (2^-8);
//   - a Linear on CUDA (bf16 values) against the same Linear on the CPU (f32 holding the same
//     values) over two steps of each per-tensor recipe: the same amax histories bit for bit, and
//     outputs and gradients within those bounds;
//   - training: FP8 against bf16 on the GPU on learnable data, losses within 1% after warm-up.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../trainer_fixture.hpp"
#include "fp8_test_support.hpp"
#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/fp8.hpp"
#include "loom/kernels/cuda/fp8.hpp"
#include "loom/kernels/cuda/gemm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/trainer.hpp"

namespace loom::cuda::test {
namespace {

using cpu::Fp8Format;

class CudaFp8Test : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    const DeviceInfo info = device_info();
    if (info.devices[0].compute_major * 10 + info.devices[0].compute_minor < 89)
      GTEST_SKIP() << "no FP8 tensor cores (compute capability below 8.9): not run";
  }
};

// Values that exercise the conversion: ties at both formats' grids, subnormals, values past the
// largest finite one, signed zeros, then random ones over several binades.
std::vector<float> conversion_inputs(size_t n, uint32_t seed) {
  std::vector<float> x = {0.0f,       -0.0f,       1.0f,   1.0625f, 1.125f,       1.1875f,
                          3.0f / 512, 1.0f / 1024, 448.0f, 464.0f,  500.0f,       -700.0f,
                          57344.0f,   61440.0f,    1e-8f,  -2.5f,   0.0009765625f};
  const auto more = random_vector(n - x.size(), seed, -1.0f, 1.0f);
  for (size_t i = 0; i < more.size(); ++i)
    x.push_back(more[i] * std::ldexp(1.0f, static_cast<int>(i % 24) - 12));
  return x;
}

TEST_F(CudaFp8Test, QuantisationGivesTheCpuCodesAmaxAndScale) {
  constexpr int64_t rows = 24, cols = 40;
  for (const Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    for (const bool bf16_input : {false, true}) {
      SCOPED_TRACE(std::string(cpu::fp8_format_name(format)) + (bf16_input ? " bf16" : " f32"));
      auto x = conversion_inputs(rows * cols, 5);
      if (bf16_input) x = rounded_to_bf16(x);
      for (const int margin : {0, 2}) {
        DeviceBuffer<float> amax(std::vector<float>{0.0f}), pair(2);
        DeviceBuffer<uint8_t> codes(rows * cols), codes_t(rows * cols);
        DeviceBuffer<float> x32(x);
        DeviceBuffer<bf16> x16(to_bf16(x));
        if (bf16_input)
          fp8_amax(amax.get(), x16.get(), rows, cols, cols);
        else
          fp8_amax(amax.get(), x32.get(), rows, cols, cols);
        fp8_scale_from_amax(pair.get(), amax.get(), format, margin);
        if (bf16_input)
          fp8_quantize(codes.get(), codes_t.get(), x16.get(), rows, cols, cols, pair.get(), format);
        else
          fp8_quantize(codes.get(), codes_t.get(), x32.get(), rows, cols, cols, pair.get(), format);

        // A fixed scale as a delayed recipe's can be: x * 64 saturates the largest values.
        DeviceBuffer<float> fixed(std::vector<float>{1.0f / 64, 64.0f});  // {inverse, scale}
        DeviceBuffer<uint8_t> saturated(rows * cols);
        if (bf16_input)
          fp8_quantize(saturated.get(), nullptr, x16.get(), rows, cols, cols, fixed.get(), format);
        else
          fp8_quantize(saturated.get(), nullptr, x32.get(), rows, cols, cols, fixed.get(), format);
        const auto got_saturated = saturated.download();
        for (int64_t i = 0; i < rows * cols; ++i)
          ASSERT_EQ(got_saturated[i], cpu::fp8_encode(x[i] * 64.0f, format)) << "x = " << x[i];

        const float want_amax = cpu::abs_max(x.data(), rows * cols);
        const float scale = cpu::fp8_scale(want_amax, format, margin);
        EXPECT_EQ(amax.download()[0], want_amax);
        EXPECT_EQ(pair.download(), (std::vector<float>{1.0f / scale, scale}));
        const auto got = codes.download(), got_t = codes_t.download();
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const uint8_t want = cpu::fp8_encode(x[r * cols + c] * scale, format);
            ASSERT_EQ(got[r * cols + c], want) << "x = " << x[r * cols + c] << " scale " << scale;
            ASSERT_EQ(got_t[c * rows + r], want);
          }
      }
    }
  }
}

// Both amax kernels (16-byte groups where columns, stride and pointer allow, else one element
// per thread) and the amax the codes pass takes on the way (the delayed recipe's) give
// cpu::abs_max of the block bit for bit, NaN included; both codes kernels (4 columns a thread
// where the block allows, else one) give the same codes and transposed codes. Shapes: aligned,
// odd, strided blocks at aligned and unaligned columns (one with rows not a multiple of 4, so
// only its transposed pass takes the one-element kernel), a misaligned pointer with aligned
// columns and stride, more rows than either grid has blocks, and several 64 x 64 tiles with
// partial ones at both edges.
TEST_F(CudaFp8Test, AmaxFromEitherKernelAndFromTheCodesPassIsTheCpus) {
  struct Case {
    int64_t rows, cols, stride, col;
  };
  for (const Case k : {Case{24, 40, 40, 0}, Case{7, 13, 13, 0}, Case{33, 64, 72, 8},
                       Case{5, 24, 30, 3}, Case{3000, 16, 16, 0}, Case{100, 136, 140, 4},
                       // aligned shape, pointer 4 (bf16) or 8 (f32) bytes off: the narrow kernels
                       Case{33, 64, 72, 2},
                       // more row tiles than gridDim.y's 65535: the codes kernels' grid-stride
                       // loops (and their barriers) go round twice
                       Case{65535 * 64 + 100, 4, 4, 0}, Case{65535 * 32 + 7, 3, 3, 0}}) {
    for (const bool with_nan : {false, true}) {
      auto x = rounded_to_bf16(conversion_inputs(k.rows * k.stride, 9));
      if (with_nan) x[(k.rows / 2) * k.stride + k.col + k.cols / 2] = std::nanf("");
      std::vector<float> block;
      for (int64_t r = 0; r < k.rows; ++r)
        for (int64_t c = 0; c < k.cols; ++c) block.push_back(x[r * k.stride + k.col + c]);
      const float want = cpu::abs_max(block.data(), static_cast<int64_t>(block.size()));
      for (const bool bf16_input : {false, true}) {
        SCOPED_TRACE(std::to_string(k.rows) + " x " + std::to_string(k.cols) + " stride " +
                     std::to_string(k.stride) + " at " + std::to_string(k.col) +
                     (bf16_input ? " bf16" : " f32") + (with_nan ? " NaN" : ""));
        DeviceBuffer<float> x32(x);
        DeviceBuffer<bf16> x16(to_bf16(x));
        DeviceBuffer<float> amax(std::vector<float>{0.0f}), fused(std::vector<float>{0.0f});
        DeviceBuffer<float> pair(std::vector<float>{1.0f / 8, 8.0f});
        const int64_t n = k.rows * k.cols;
        DeviceBuffer<uint8_t> plain(n), with_amax(n), with_amax_t(n);
        if (bf16_input) {
          fp8_amax(amax.get(), x16.get() + k.col, k.rows, k.cols, k.stride);
          fp8_quantize(plain.get(), nullptr, x16.get() + k.col, k.rows, k.cols, k.stride,
                       pair.get(), Fp8Format::E4M3);
          fp8_quantize(with_amax.get(), with_amax_t.get(), x16.get() + k.col, k.rows, k.cols,
                       k.stride, pair.get(), Fp8Format::E4M3, fused.get());
        } else {
          fp8_amax(amax.get(), x32.get() + k.col, k.rows, k.cols, k.stride);
          fp8_quantize(plain.get(), nullptr, x32.get() + k.col, k.rows, k.cols, k.stride,
                       pair.get(), Fp8Format::E4M3);
          fp8_quantize(with_amax.get(), with_amax_t.get(), x32.get() + k.col, k.rows, k.cols,
                       k.stride, pair.get(), Fp8Format::E4M3, fused.get());
        }
        const float got = amax.download()[0], got_fused = fused.download()[0];
        if (with_nan) {
          EXPECT_TRUE(std::isnan(got));
          EXPECT_TRUE(std::isnan(got_fused));
        } else {
          EXPECT_EQ(got, want);
          EXPECT_EQ(got_fused, want);
        }
        const auto codes = plain.download(), transposed = with_amax_t.download();
        EXPECT_EQ(with_amax.download(), codes);
        for (int64_t r = 0; r < k.rows; ++r)
          for (int64_t c = 0; c < k.cols; ++c) {
            const float v = x[r * k.stride + k.col + c];
            if (!std::isnan(v)) {
              ASSERT_EQ(codes[r * k.cols + c], cpu::fp8_encode(v * 8.0f, Fp8Format::E4M3)) << v;
            }
            ASSERT_EQ(transposed[c * k.rows + r], codes[r * k.cols + c]);
          }
      }
    }
  }
}

TEST_F(CudaFp8Test, NaNPropagatesThroughAmaxAndZeroGivesScaleOne) {
  std::vector<float> x(64, 1.0f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer<float> gx(x), amax(std::vector<float>{0.0f}), pair(2);
  fp8_amax(amax.get(), gx.get(), 8, 8, 8);
  EXPECT_TRUE(std::isnan(amax.download()[0]));
  fp8_scale_from_amax(pair.get(), amax.get(), Fp8Format::E4M3, 0);
  EXPECT_EQ(pair.download(), (std::vector<float>{1.0f, 1.0f}));  // a bad amax: scale 1
  DeviceBuffer<float> zeros(std::vector<float>(64, 0.0f)), zero_amax(std::vector<float>{0.0f});
  fp8_amax(zero_amax.get(), zeros.get(), 8, 8, 8);
  fp8_scale_from_amax(pair.get(), zero_amax.get(), Fp8Format::E5M2, 0);
  EXPECT_EQ(pair.download(), (std::vector<float>{1.0f, 1.0f}));
}

// Quantises host values to device codes with their own current scale; returns the dequantised
// values the CPU would multiply.
struct Quantised {
  std::unique_ptr<DeviceBuffer<uint8_t>> codes;
  std::unique_ptr<DeviceBuffer<float>> pair;
  std::vector<float> dequantised;
  Fp8Format format;
};
Quantised quantise(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format format) {
  Quantised q;
  q.format = format;
  DeviceBuffer<float> gx(x), amax(std::vector<float>{0.0f});
  q.codes = std::make_unique<DeviceBuffer<uint8_t>>(rows * cols);
  q.pair = std::make_unique<DeviceBuffer<float>>(2);
  fp8_amax(amax.get(), gx.get(), rows, cols, cols);
  fp8_scale_from_amax(q.pair->get(), amax.get(), format, 0);
  fp8_quantize(q.codes->get(), nullptr, gx.get(), rows, cols, cols, q.pair->get(), format);
  const float scale = cpu::fp8_scale(cpu::abs_max(x.data(), rows * cols), format, 0);
  q.dequantised.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    q.dequantised[i] = cpu::round_to_fp8(x[i] * scale, format) * (1.0f / scale);
  return q;
}

TEST_F(CudaFp8Test, GemmEqualsTheDequantisedProduct) {
  constexpr int64_t m = 32, n = 48, k = 256;
  const auto a = random_vector(m * k, 11, -3.0f, 3.0f), b = random_vector(n * k, 12, -0.1f, 0.1f);
  for (const auto& [fa, fb] :
       {std::pair{Fp8Format::E4M3, Fp8Format::E4M3}, std::pair{Fp8Format::E5M2, Fp8Format::E4M3},
        std::pair{Fp8Format::E4M3, Fp8Format::E5M2}}) {
    SCOPED_TRACE(std::string(cpu::fp8_format_name(fa)) + " x " + cpu::fp8_format_name(fb));
    const Quantised qa = quantise(a, m, k, fa), qb = quantise(b, n, k, fb);
    const std::vector<float> start = random_vector(m * n, 13);
    // beta = 1 below
    const auto [want, magnitude] = exact_product(qa.dequantised, qb.dequantised, start, m, n, k);
    const Fp8Operand oa{qa.codes->get(), fa, qa.pair->get()};
    const Fp8Operand ob{qb.codes->get(), fb, qb.pair->get()};
    DeviceBuffer<float> c32(start);
    fp8_gemm(c32.get(), n, 1.0f, oa, ob, m, n, k);
    DeviceBuffer<bf16> c16(m * n);
    fp8_gemm(c16.get(), n, 0.0f, oa, ob, m, n, k);
    const auto got32 = c32.download(), got16 = from_bf16(c16.download());
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(got32[i], want[i], kFp8Accumulation * magnitude[i]) << "f32 element " << i;
      const double without_start = want[i] - start[i];
      ASSERT_NEAR(got16[i], without_start,
                  kBf16Rounding * std::fabs(without_start) + kFp8Accumulation * magnitude[i])
          << "bf16 element " << i;
    }
  }
  const Quantised e5 = quantise(a, m, k, Fp8Format::E5M2), e4 = quantise(a, m, k, Fp8Format::E4M3);
  DeviceBuffer<float> c(m * m);
  const Fp8Operand o5{e5.codes->get(), Fp8Format::E5M2, e5.pair->get()};
  const Fp8Operand o4{e4.codes->get(), Fp8Format::E4M3, e4.pair->get()};
  EXPECT_THROW(fp8_gemm(c.get(), m, 0.0f, o5, o5, m, m, k), Error);      // two E5M2: no kernel
  EXPECT_THROW(fp8_gemm(c.get(), m, 0.0f, o4, o4, m, m, k - 8), Error);  // k not a multiple of 16
}

// Two steps of one Linear (bias, output read from column 16 of a wider gradient) on each device.
TEST_F(CudaFp8Test, LinearOnCudaFollowsTheCpuEmulation) {
  constexpr int64_t rows = 64, in = 96, out = 80, wide = 112, col = 16;
  for (const Fp8Recipe recipe : {Fp8Recipe::Delayed, Fp8Recipe::Current}) {
    SCOPED_TRACE(fp8_recipe_name(recipe));
    Fp8LinearPair pair(in, out, recipe);
    for (int step = 1; step <= 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const float spread = step == 1 ? 1.0f : 1.5f;  // a delayed scale then saturates some
      const auto x = rounded_to_bf16(random_vector(rows * in, 20 + step, -spread, spread));
      const auto w =
          rounded_to_bf16(random_vector(out * in, 30 + step, -0.05f * spread, 0.05f * spread));
      const auto g = rounded_to_bf16(random_vector(rows * wide, 40 + step, -1e-3f, 1e-3f));
      const Fp8LinearPair::Step s = pair.step(x, w, g, rows, wide, col);

      EXPECT_EQ(pair.gpu_training->amax_history(), pair.cpu_training->amax_history());
      // Bounds: the same codes on both sides, so only the sums (the GPU's FP8 accumulation,
      // kFp8Accumulation, and the CPU's f32 one, each of the sum of |terms|, bounded here by
      // k max|x| max|w| with 20% slack) and the GPU's bf16 roundings (2^-8): d_input's, and
      // out's two, the product's before the bias is added (2^-8 |want - bias|) and the sum's.
      const auto& want_out = s.want_out;
      const auto& got_out = s.got_out;
      const auto bias_values = pair.bias.to_f32_vector();
      const double out_terms = 1.5 * 0.075 * in * 1.2;  // |x| |w| k with the scales' slack
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < wide; ++j) {
          const size_t i = static_cast<size_t>(r * wide + j);
          const double product = j >= col && j < col + out
                                     ? want_out[i] - bias_values[static_cast<size_t>(j - col)]
                                     : 0.0;
          ASSERT_NEAR(got_out[i], want_out[i],
                      kBf16Rounding * (std::fabs(want_out[i]) + std::fabs(product)) +
                          (kFp8Accumulation + accumulation(in)) * out_terms)
              << "out " << i;
        }
      const auto &want_dx = s.want_dx, &got_dx = s.got_dx;
      const double dx_terms = 1e-3 * 0.075 * out * 1.2;
      for (size_t i = 0; i < want_dx.size(); ++i)
        ASSERT_NEAR(got_dx[i], want_dx[i],
                    kBf16Rounding * std::fabs(want_dx[i]) +
                        (kFp8Accumulation + accumulation(out)) * dx_terms)
            << "d_input " << i;
      const auto &want_dw = s.want_dw, &got_dw = s.got_dw;
      const double dw_terms = 1e-3 * 1.5 * rows * 1.2;
      for (size_t i = 0; i < want_dw.size(); ++i)
        ASSERT_NEAR(got_dw[i], want_dw[i], (kFp8Accumulation + accumulation(rows)) * dw_terms)
            << "d_weight " << i;
      expect_close(s.got_db, s.want_db, 0.0, 2 * accumulation(rows) * 1e-3 * rows, "d_bias");
    }
  }
}

// Sampling feeds the FP8 layers one more row at a time: row counts cuBLASLt's FP8 kernels do
// not take run in bf16 outside a step (the same bits as a plain bf16 Linear), and are an error
// inside one.
TEST_F(CudaFp8Test, RowCountsOffSixteenRunInBf16OutsideAStep) {
  constexpr int64_t rows = 5, in = 32, out = 48;
  Linear fp8_linear("l", in, out, true, false), plain("l", in, out, true, false);
  auto context = std::make_shared<Fp8Context>();
  Fp8Training training(context, {fp8_linear.enable_fp8(context)});
  const Tensor w =
      host_tensor(rounded_to_bf16(random_vector(out * in, 50, -0.1f, 0.1f)), {out, in});
  const Tensor b = host_tensor(rounded_to_bf16(random_vector(out, 51, -0.1f, 0.1f)), {out});
  for (Linear* l : {&fp8_linear, &plain}) {
    l->weight.value = on_gpu_bf16(w);
    l->bias.value = on_gpu_bf16(b);
  }
  const Tensor x =
      on_gpu_bf16(host_tensor(rounded_to_bf16(random_vector(rows * in, 52)), {rows, in}));
  Tensor got = Tensor::zeros({rows, out}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  Tensor want = Tensor::zeros({rows, out}, DType::BF16, MemCategory::Workspace, Device::CUDA);
  fp8_linear.forward(got, 0, x);
  plain.forward(want, 0, x);
  EXPECT_EQ(got.to_f32_vector(), want.to_f32_vector());
  training.begin_step();
  EXPECT_THROW(fp8_linear.forward(got, 0, x), Error);
}

}  // namespace
}  // namespace loom::cuda::test

namespace loom::test {
namespace {

TrainConfig parse_config(const std::string& text, const std::vector<std::string>& overrides) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

// The check: FP8 training follows bf16 on a learnable task, losses within 1% after
// warm-up (the tiny model's FP8 emulation on the CPU stays within 0.006 nats of f32).
TEST(CudaFp8Training, FollowsBf16OnLearnableData) {
  const cuda::DeviceInfo info = cuda::device_info();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: not run";
  if (info.devices[0].compute_major * 10 + info.devices[0].compute_minor < 89)
    GTEST_SKIP() << "no FP8 tensor cores: not run";
  for (const std::string arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    TinyRun run("cuda_fp8_" + arch);
    run.write_learnable_shards();
    const std::string base = run.config(arch, kLearnableSteps);
    auto config = [&](const std::string& precision) {
      return parse_config(
          base, {"train.device=\"cuda\"", "train.precision=\"" + precision + "\"", kLearnableLr,
                 "checkpoint.dir=\"\"", "log.dir=\"" + run.dir + "/" + precision + "\""});
    };
    Trainer bf16_run(config("bf16"));
    bf16_run.run();
    Trainer fp8_run(config("fp8"));
    fp8_run.run();
    const std::vector<double> want = losses_of(run.dir + "/bf16/metrics.jsonl");
    const std::vector<double> got = losses_of(run.dir + "/fp8/metrics.jsonl");
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(want.back(), 0.45 * std::log(64.0));  // bf16 learnt: the comparison means something
    for (size_t s = 3; s < want.size(); ++s)        // after the 3 warm-up steps
      EXPECT_NEAR(got[s], want[s], 0.01 * want[s]) << "step " << s + 1;
  }
}

// From the second step on, delayed scaling's scale pairs come from one upload a step
// (Fp8Context::step_scale_pairs) instead of a copy per quantisation: the same scales, so the
// same run bit for bit (LOOM_FP8_SCALE_PER_CALL=1 restores the copies). 8 steps of the tiny Llama.
TEST(CudaFp8Training, StepScalesInOneUploadAreEachCallsScales) {
  const cuda::DeviceInfo info = cuda::device_info();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: not run";
  if (info.devices[0].compute_major * 10 + info.devices[0].compute_minor < 89)
    GTEST_SKIP() << "no FP8 tensor cores: not run";
  TinyRun run("cuda_fp8_scale_upload");
  run.write_learnable_shards();
  const std::string base = run.config("llama", 8);
  auto losses = [&](const std::string& name, bool per_call) {
    if (per_call)
      setenv("LOOM_FP8_SCALE_PER_CALL", "1", 1);
    else
      unsetenv("LOOM_FP8_SCALE_PER_CALL");
    Trainer trainer(
        parse_config(base, {"train.device=\"cuda\"", "train.precision=\"fp8\"", kLearnableLr,
                            "checkpoint.dir=\"\"", "log.dir=\"" + run.dir + "/" + name + "\""}));
    trainer.run();
    unsetenv("LOOM_FP8_SCALE_PER_CALL");
    return losses_of(run.dir + "/" + name + "/metrics.jsonl");
  };
  const std::vector<double> per_call = losses("per_call", true),
                            uploaded = losses("uploaded", false);
  ASSERT_EQ(per_call.size(), 8u);
  EXPECT_EQ(uploaded, per_call);
}

}  // namespace
}  // namespace loom::test
