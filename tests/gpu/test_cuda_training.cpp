// The one trainer on CUDA (train.device = "cuda": the same Trainer, model and AdamW, on device
// tensors) against the same trainer on the CPU, the reference (as llm.c checks train_gpt2.cu
// against train_gpt2.c): a tiny GPT-2 (tied embeddings) and a tiny Llama (GQA, untied), same
// seed, same data, same schedule. The model alone, op for op, is tests/gpu/test_cuda_model.cpp.
//   - f32 training, 10 steps, with and without recomputation: every step's loss to 1e-4
//     relative, final weights to 1e-4 of each tensor's largest weight (floored at the 0.02 init
//     scale). As in tests/dist, optim.eps is 1e-5: Adam divides a gradient by its own size, so
//     an element whose true gradient is ~0 (GPT-2's key bias) would otherwise move by +-lr per
//     step in a direction set by rounding.
//   - bf16 training (bf16 activations, activation gradients and working weights on the GPU; f32
//     gradients with bf16-rounded activations on the CPU), 30 steps on learnable data (the CPU
//     run must learn): losses to 2e-2 relative. The GPU's masters start from the bf16 working
//     copies, the CPU's from the f32 initialisation: one rounding, 2^-9, inside that band.
//   - Checkpoints: a GPU checkpoint loads on the CPU with the GPU's weights bit for bit, and a
//     run stopped on one device resumes on the other.
//   - What the engine cannot train on CUDA yet is refused before any device is touched (runs
//     everywhere).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "../trainer_fixture.hpp"
#include "gpu_test_support.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/trainer.hpp"

namespace loom::test {
namespace {

constexpr int64_t kSteps = 10;
constexpr double kF32Tolerance = 1e-4;
constexpr double kBf16LossTolerance = 2e-2;

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

// Overrides that make a CPU and a GPU run comparable (see the file comment), logging to
// `run.dir`/`name`.
std::vector<std::string> comparable(const TinyRun& run, const std::string& name,
                                    const std::string& precision, bool checkpoints = false,
                                    const std::string& device = "cpu") {
  std::vector<std::string> o = {
      "optim.eps=1e-5", "optim.lr=1e-3", "train.device=\"" + device + "\"",
      "train.precision=\"" + precision + "\"", "log.dir=\"" + run.dir + "/" + name + "\""};
  o.push_back(checkpoints ? "checkpoint.dir=\"" + run.dir + "/" + name + "_ckpt\""
                          : "checkpoint.dir=\"\"");
  return o;
}

void expect_weights_close(const ParameterList& want, const ParameterList& got, double tolerance,
                          const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(
        relative_weight_difference(want[i]->value.to_f32_vector(), got[i]->value.to_f32_vector()),
        tolerance)
        << what << ": " << want[i]->name;
}

class CudaTraining : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda::device_info().count == 0) GTEST_SKIP() << "no CUDA device: not run";
  }
};

TEST_P(CudaTraining, F32TrainingFollowsTheCpuTrainer) {
  for (const std::string recompute : {"none", "full"}) {
    SCOPED_TRACE("model.recompute = " + recompute);
    TinyRun run("cuda_f32_" + recompute + "_" + GetParam());
    const std::string base = run.config(GetParam(), kSteps);
    auto with_recompute = [&](std::vector<std::string> o) {
      o.push_back("model.recompute=\"" + recompute + "\"");
      return parse(base, o);
    };
    Trainer on_cpu(with_recompute(comparable(run, "cpu", "f32")));
    const TrainSummary cpu_summary = on_cpu.run();
    Trainer on_gpu(with_recompute(comparable(run, "gpu", "f32", false, "cuda")));
    EXPECT_EQ(on_gpu.model().device(), Device::CUDA);
    const TrainSummary gpu_summary = on_gpu.run();

    const std::vector<double> want = losses_of(run.dir + "/cpu/metrics.jsonl");
    const std::vector<double> got = losses_of(run.dir + "/gpu/metrics.jsonl");
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(got[s], want[s], kF32Tolerance * want[s]) << "step " << s + 1;
    ASSERT_TRUE(cpu_summary.last_val_loss && gpu_summary.last_val_loss);
    EXPECT_NEAR(*gpu_summary.last_val_loss, *cpu_summary.last_val_loss,
                kF32Tolerance * *cpu_summary.last_val_loss);
    expect_weights_close(on_cpu.model().parameters(), on_gpu.model().parameters(), kF32Tolerance,
                         "final weights");
  }
}

// On the learnable shards (TinyRun::write_learnable_shards) for long enough to learn: on uniform
// random tokens the loss stays at ln V whatever the arithmetic does, and a relative tolerance
// on it cannot fail.
TEST_P(CudaTraining, Bf16TrainingFollowsTheCpuTrainer) {
  TinyRun run("cuda_bf16_" + GetParam());
  run.write_learnable_shards();
  const std::string base = run.config(GetParam(), kLearnableSteps);
  auto learning = [&](const std::string& name) {
    std::vector<std::string> o =
        comparable(run, name, "bf16", false, name == "gpu" ? "cuda" : "cpu");
    o.push_back(kLearnableLr);
    return parse(base, o);
  };
  Trainer on_cpu(learning("cpu"));
  const TrainSummary cpu_summary = on_cpu.run();
  Trainer on_gpu(learning("gpu"));
  on_gpu.run();

  const std::vector<double> want = losses_of(run.dir + "/cpu/metrics.jsonl");
  const std::vector<double> got = losses_of(run.dir + "/gpu/metrics.jsonl");
  ASSERT_EQ(want.size(), static_cast<size_t>(kLearnableSteps));
  ASSERT_EQ(got.size(), want.size());
  // The reference learnt (from ln 64 = 4.16), so the comparison covers a real trajectory.
  EXPECT_LT(cpu_summary.last_train_loss, 0.45 * std::log(64.0));
  for (size_t s = 0; s < want.size(); ++s)
    EXPECT_NEAR(got[s], want[s], kBf16LossTolerance * want[s]) << "step " << s + 1;
  // The GPU model computes with bf16 working copies; the CPU model's values are bf16-rounded f32.
  for (const Parameter* p : on_gpu.model().parameters())
    ASSERT_EQ(p->value.dtype(), DType::BF16) << p->name;
  for (const Parameter* p : on_cpu.model().parameters())
    for (float v : p->value.to_f32_vector()) ASSERT_EQ(v, round_to_bf16(v)) << p->name;
}

TEST_P(CudaTraining, CheckpointLoadsOnTheCpuBitForBit) {
  TinyRun run("cuda_ckpt_" + GetParam());
  const TrainConfig config =
      parse(run.config(GetParam(), kSteps), comparable(run, "gpu", "f32", true, "cuda"));
  Trainer on_gpu(config);
  const TrainSummary summary = on_gpu.run();
  ASSERT_FALSE(summary.last_checkpoint.empty());
  Transformer on_cpu(config.model);
  restore_weights(config.checkpoint_dir, on_cpu);  // the root: its latest, step 10
  const ParameterList& want = on_gpu.model().parameters();
  ASSERT_EQ(want.size(), on_cpu.parameters().size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(want[i]->value.to_f32_vector(), on_cpu.parameters()[i]->value.to_f32_vector())
        << want[i]->name;
}

// Half the steps on one device, the rest on the other from its checkpoint (weights, moments,
// step count, data position), against one uninterrupted CPU run.
TEST_P(CudaTraining, RunsResumeAcrossDevices) {
  TinyRun straight_run("cuda_straight_" + GetParam());
  Trainer straight(
      parse(straight_run.config(GetParam(), kSteps), comparable(straight_run, "run", "f32")));
  straight.run();
  for (const bool gpu_first : {true, false}) {
    TinyRun run(std::string("cuda_resume_") + (gpu_first ? "gpu_cpu_" : "cpu_gpu_") + GetParam());
    const std::string base = run.config(GetParam(), kSteps);
    TrainConfig half = parse(base, comparable(run, "run", "f32", true, gpu_first ? "cuda" : "cpu"));
    half.steps = kSteps / 2;  // schedule.total_steps stays kSteps, as for a job killed half way
    TrainSummary resumed;
    if (gpu_first) {
      Trainer(half).run();
      Trainer second(parse(base, comparable(run, "run", "f32", true)));
      resumed = second.run();
      expect_weights_close(straight.model().parameters(), second.model().parameters(),
                           kF32Tolerance, "GPU, then CPU");
    } else {
      Trainer(half).run();
      Trainer second(parse(base, comparable(run, "run", "f32", true, "cuda")));
      resumed = second.run();
      expect_weights_close(straight.model().parameters(), second.model().parameters(),
                           kF32Tolerance, "CPU, then GPU");
    }
    EXPECT_EQ(resumed.first_step, kSteps / 2);
    EXPECT_EQ(resumed.steps_done, kSteps);
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaTraining, ::testing::Values("gpt2", "llama"));

// Runs without a GPU: every refusal comes before the trainer looks for a device.
TEST(CudaTrainingConfig, RefusesWhatTheEngineCannotTrainOnCudaBeforeTouchingADevice) {
  TinyRun run("cuda_refusals");
  const std::string base = run.config("gpt2", kSteps);
  const std::string cuda = "train.device=\"cuda\"";
  expect_contains(error_message([&] {
                    parse(base, {cuda, "model.n_embd=256", "model.n_head=1"});
                  }),
                  {"head_dim", "256", "128"});
  expect_contains(error_message([&] { parse(base, {"train.device=\"tpu\""}); }),
                  {"train.device", "tpu", "cpu or cuda"});
  // Recomputation and every layout run on CUDA now: the same model, plans and optimizers.
  EXPECT_EQ(parse(base, {cuda, "model.recompute=\"full\""}).recompute, Recompute::Full);
  EXPECT_EQ(parse(base, {cuda, "parallel.zero_stage=3"}).zero_stage, 3);
  // The trainer checks whatever config it is handed again.
  TrainConfig wide = parse(base, {"model.n_embd=256", "model.n_head=1"});
  wide.device = Device::CUDA;
  expect_contains(error_message([&] { Trainer trainer(wide); }), {"head_dim", "256"});
  // Where no device is visible, a config the GPU could train is refused for that reason, and
  // clearly.
  if (cuda::device_info().count == 0)
    expect_contains(error_message([&] { Trainer trainer(parse(base, {cuda})); }),
                    {"no CUDA device is visible"});
}

}  // namespace
}  // namespace loom::test
