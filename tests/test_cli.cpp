// The `loom` binary as a user meets it: bad input gives exit code 2 and a message naming the
// problem, before any work starts, and never damages an existing checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "loom/ckpt/checkpoint.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/plan/machine_profile.hpp"
#include "loom/plan/time_model.hpp"
#include "test_support.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

using ::testing::HasSubstr;

TEST(Cli, BadConfigsAreRejectedWithTheKeyNamed) {
  TinyRun run("cli_config");
  const std::string good = run.config();
  struct Case {
    std::string text, expected;
  };
  const std::vector<Case> cases = {
      {good + "[train]\n", "train"},  // duplicate table: a TOML syntax error
      {std::string(good).replace(good.find("steps = 20"), 10, "steps = \"many\""), "train.steps"},
      {std::string(good).replace(good.find("steps = 20"), 10, "steps = -3"), "train.steps"},
      {std::string(good).replace(good.find("n_head = 4"), 10, "n_head = 5"), "n_head"},
      {std::string(good).replace(good.find("[eval]"), 6, "[eval]\nevry = 3"), "eval.evry"},
      {std::string(good).replace(good.find("train = "), 8, "trian = "), "data.train"},
      {std::string(good).replace(good.find("lr = 3e-3"), 9, "lr = 0.0"), "optim.lr"},
      {std::string(good).replace(good.find("arch = \"gpt2\""), 13, "arch = \"bert\""), "model.arch"},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_loom("train " + run.write_config(c.text));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.expected));
    EXPECT_FALSE(std::filesystem::exists(run.dir + "/run")) << "work started despite a bad config";
  }
  const CommandResult ok = run_loom("train --check " + run.write_config(good));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const CommandResult bad_override = run_loom("train " + run.write_config(good) + " --train.batch_size=zero");
  EXPECT_EQ(bad_override.exit_code, 2);
  EXPECT_THAT(bad_override.output, HasSubstr("train.batch_size"));
}

TEST(Cli, ShardWithWrongHeaderOrVocabularyIsAClearError) {
  TinyRun run("cli_shard");
  {
    std::fstream f(run.dir + "/data/tiny_train_000001.bin", std::ios::in | std::ios::out | std::ios::binary);
    const int32_t bad_magic = 12345;
    f.write(reinterpret_cast<const char*>(&bad_magic), sizeof bad_magic);
  }
  CommandResult r = run_loom("train " + run.write_config(run.config()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("tiny_train_000001.bin"));
  EXPECT_THAT(r.output, HasSubstr("magic"));

  TinyRun big_vocab("cli_vocab", 200);  // tokens up to 199, model vocab 64
  r = run_loom("train " + big_vocab.write_config(big_vocab.config()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("vocab"));
}

TEST(Cli, ExportWritesTheCheckpointWeightsInHuggingFaceLayout) {
  TinyRun run("cli_export");
  const std::string config = run.write_config(run.config("gpt2", 5));
  CommandResult r = run_loom("train " + config);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom("export --checkpoint " + run.dir + "/ckpt --out " + run.dir + "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // A single-process checkpoint already holds HF-layout F32 weights: the export is those bytes.
  EXPECT_EQ(read_text_file(run.dir + "/hf/model.safetensors"),
            read_text_file(run.dir + "/ckpt/step_00000005/model.safetensors"));
  EXPECT_EQ(read_text_file(run.dir + "/hf/config.json"), read_text_file(run.dir + "/ckpt/step_00000005/config.json"));
  r = run_loom("export --checkpoint " + run.dir + "/ckpt --out " + run.dir + "/hf16 --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_safetensors(run.dir + "/hf16/model.safetensors").entries.front().dtype, "BF16");
  r = run_loom("export --checkpoint " + run.dir + "/nowhere --out " + run.dir + "/x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("nowhere"));
}

TEST(Cli, CalibrateWritesAProfileThatPlanPredictsTheEngineFrom) {
  TinyRun run("cli_calibrate");
  const std::string profile = run.dir + "/profile.json";
  CommandResult r = run_loom("calibrate --quick --out " + profile);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1 rank x 1 thread: GEMM peak"));
  EXPECT_THAT(r.output, HasSubstr("FP8 emulation: "));
  EXPECT_THAT(r.output, HasSubstr("entries for 1 ranks"));
  std::ofstream(run.dir + "/model.toml") << "[model]\narch = \"gpt2\"\nvocab_size = 256\nmax_seq_len = 64\n"
                                             "n_layer = 2\nn_embd = 64\nn_head = 4\n";
  const std::string plan = "plan --model " + run.dir + "/model.toml --seq 64 --global-batch 8 --profile " + profile;
  r = run_loom(plan + " --layout mbs=4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json one = nlohmann::json::parse(r.output);
  EXPECT_GT(one["time"]["step_s"].get<double>(), 0);
  EXPECT_EQ(one["memory_bytes"]["workspace"].get<double>(), 0);  // the CPU engine has no GPU workspace
  EXPECT_THAT(one["gpu"].get<std::string>(), HasSubstr("ranks of"));
  // Rank counts the profile lacks, a precision it did not measure, and flags it replaces.
  r = run_loom(plan + " --layout dp=2,mbs=4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("no entry for 2 ranks (it has 1); run `mpirun -np 2 loom calibrate"));
  r = run_loom(plan + " --layout mbs=4 --precision bf16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("drop --precision bf16"));
  // FP8 is the engine's emulation on top of its f32 work: the same layout, slower by its
  // quantisations, whose rates calibrate measured.
  EXPECT_THAT(r.output, HasSubstr("its FP8 emulation: --precision fp8"));
  for (const char* recipe : {"delayed", "current", "blockwise"}) {
    r = run_loom(plan + " --layout mbs=4 --json --precision fp8 --fp8-recipe " + recipe);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_GT(nlohmann::json::parse(r.output)["time"]["step_s"].get<double>(),
              one["time"]["step_s"].get<double>())
        << recipe;
  }
  r = run_loom(plan + " --layout mbs=4 --fp8-recipe current");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output,
              HasSubstr("--fp8-recipe (training.fp8_recipe) is the recipe of loom's own engine"));
  r = run_loom("plan --model gpt2-124m --gpus 8 --precision fp8 --fp8-recipe blockwise");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output,
              HasSubstr("--fp8-recipe (training.fp8_recipe) is the recipe of loom's own engine"));
  {
    // A profile written before calibrate measured FP8: it plans f32, and names the fix for fp8.
    nlohmann::json older = nlohmann::json::parse(std::ifstream(profile));
    for (nlohmann::json& e : older["entries"]) e.erase("fp8_quantize_s_per_element");
    std::ofstream(run.dir + "/older.json") << older.dump();
    const std::string old_plan = "plan --model " + run.dir +
                                 "/model.toml --seq 64 --global-batch 8 --layout mbs=4 --profile " +
                                 run.dir + "/older.json";
    EXPECT_EQ(run_loom(old_plan).exit_code, 0);
    r = run_loom(old_plan + " --precision fp8");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.output, HasSubstr("the profile has no FP8 quantisation rates"));
    EXPECT_THAT(r.output, HasSubstr("run loom calibrate again"));
  }
  r = run_loom("calibrate --quick --out " + run.dir + "/nowhere/profile.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("does not exist"));
  std::ofstream(run.dir + "/other.json") << "{\"format\": \"loom-machine-profile/1\", \"machine\": \"x\", \"entries\": []}";
  r = run_loom("calibrate --quick --out " + run.dir + "/other.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("entries: expected a non-empty array"));
}

TEST(Cli, CalibrateOnCudaIsRefusedWhereItCannotRunNamingWhy) {
  TinyRun run("cli_calibrate_cuda");
  const std::string profile = run.dir + "/gpu.json";
  CommandResult r = run_loom("calibrate --device tpu --out " + profile);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--device"));
  if (device_memory::built_with(Device::CUDA) && device_memory::cuda_device_count() > 0)
    GTEST_SKIP()
        << "a GPU is visible: the CUDA calibration itself is tests/gpu/test_cuda_calibration.cpp's";
  r = run_loom("calibrate --device cuda --quick --out " + profile);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr(device_memory::built_with(Device::CUDA)
                            ? "calibrate --device cuda: no CUDA device is visible to this process"
                            : "calibrate --device cuda: this loom was built without CUDA"));
  EXPECT_FALSE(std::filesystem::exists(profile)) << "work started despite the refusal";
}

TEST(Cli, PlanPredictsTheCudaEngineFromAGpuProfile) {
  // A GPU profile as `loom calibrate --device cuda` writes it (figures of an H100's order).
  TinyRun run("cli_gpu_profile");
  plan::MachineProfile profile;
  profile.machine = "NVIDIA H100 80GB HBM3 (1 GPU)";
  profile.device = Device::CUDA;
  profile.cores = 1;
  profile.gpu_memory_bytes = 85'520'809'984;
  plan::ProfileEntry entry;
  entry.peak_flops = 6e14;
  entry.gemm = {0.9, 200};
  entry.gemm_timings = {{1024, 512, 512, 2e-5}, {16384, 8192, 8192, 4e-3}};
  entry.attention_forward = {0.5, 100};
  entry.attention_backward = {0.3, 100};
  entry.attention_forward_timings = {{16384, 128.5, 64, 1e-5}, {16384, 512.5, 64, 3e-5}};
  entry.attention_backward_timings = {{16384, 128.5, 64, 3e-5}, {16384, 512.5, 64, 9e-5}};
  entry.memory_bytes_per_s = 2.5e12;
  plan::merge_profile_entry(profile, entry);
  const std::string path = run.dir + "/gpu.json";
  plan::write_machine_profile(profile, path);
  const std::string plan = "plan --model gpt2-124m --seq 1024 --global-batch 16 --profile " + path;
  CommandResult r = run_loom(plan + " --layout mbs=16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json one = nlohmann::json::parse(r.output);
  EXPECT_GT(one["time"]["step_s"].get<double>(), 0);
  EXPECT_EQ(one["memory_model"].get<std::string>(),
            "gpu");  // the CUDA engine's bytes, not the CPU's
  EXPECT_GT(one["memory_bytes"]["workspace"].get<double>(), 0);
  EXPECT_EQ(one["hbm_bytes"].get<double>(), 85'520'809'984.0);
  EXPECT_THAT(one["gpu"].get<std::string>(), HasSubstr("profiled NVIDIA H100"));
  // A precision it did not measure, and rank counts it lacks, named with the flag to add them.
  r = run_loom(plan + " --layout mbs=16 --precision f32");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(
      r.output,
      HasSubstr("loom's CUDA engine, which the profile measured in bf16; drop --precision f32"));
  // FP8 on the CUDA engine is not in its profile (calibrate measures bf16 there).
  r = run_loom(plan + " --layout mbs=16 --precision fp8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("measured in bf16; drop --precision fp8"));
  r = run_loom(plan + " --layout dp=2,mbs=8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("run `mpirun -np 2 loom calibrate --device cuda --out FILE`"));
  // A CPU calibration never adds its entry to a GPU profile.
  r = run_loom("calibrate --quick --out " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("profiles loom's cuda engine"));
}

// The JSON a command printed after what it said on stderr (a published model's approximation):
// from the first line that opens an object.
std::string json_part(const std::string& output) {
  return output.rfind('{', 0) == 0 ? output : output.substr(output.find("\n{") + 1);
}

TEST(Cli, PlanReportsMemoryPerGpuAndWhetherTheLayoutFits) {
  CommandResult r = run_loom("plan --model llama-8b --gpu h100-sxm --layout tp=8,dp=8,zero=1,recompute=selective,sp=1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json plan = nlohmann::json::parse(r.output);
  const nlohmann::json& mem = plan["memory_bytes"];
  EXPECT_TRUE(plan["fits"].get<bool>());
  EXPECT_EQ(plan["micro_batches"].get<int64_t>(), 512 / 8);
  EXPECT_NEAR(mem["total"].get<double>(),
              mem["parameters"].get<double>() + mem["gradients"].get<double>() + mem["optimizer_state"].get<double>() +
                  mem["activations"].get<double>() + mem["comm_buffers"].get<double>() + mem["workspace"].get<double>(),
              1.0);
  // Each dimension's communication before overlap: tp and dp here, no pipeline, cp or ep; the
  // tp collectives are not overlapped, so exposed communication holds at least them.
  const nlohmann::json& comm = plan["time"]["comm_s"];
  EXPECT_GT(comm["tp"].get<double>(), 0);
  EXPECT_GT(comm["dp"].get<double>(), 0);
  EXPECT_EQ(comm["pp"].get<double>(), 0);
  EXPECT_EQ(comm["cp"].get<double>(), 0);
  EXPECT_EQ(comm["ep"].get<double>(), 0);
  EXPECT_GE(plan["time"]["exposed_comm_s"].get<double>(), 0.99 * comm["tp"].get<double>());
  // 70B parameters replicated on every GPU need about 16 bytes each: no 80 GB GPU holds that.
  r = run_loom("plan --model llama-70b --layout dp=64");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("does NOT fit"));
  r = run_loom("plan --model llama-8b --layout tp=3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("32 attention heads do not split over tp=3"));
  r = run_loom("plan --model llama-8b --layout dp=8 --global-batch 12");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("not a multiple of dp x mbs = 8"));
  // Without --layout: the search, fastest first, with its three steps' counts.
  r = run_loom("plan --model llama-8b --gpus 64 --top 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json search = nlohmann::json::parse(r.output);
  ASSERT_EQ(search["top"].size(), 3u);
  EXPECT_GE(search["valid"].get<int64_t>(), search["fitting"].get<int64_t>());
  EXPECT_GE(search["top"][0]["time"]["tokens_per_s"].get<double>(), search["top"][2]["time"]["tokens_per_s"].get<double>());
  // A published model by name: Qwen3 30B-A3B (heads of 128 on a 2048 stream, 128 experts).
  r = run_loom(
      "plan --model \"Qwen3 30B-A3B\" --gpu h100-sxm --layout "
      "dp=8,ep=8,zero=1,mbs=1,recompute=full "
      "--seq 4096 --global-batch 64 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(nlohmann::json::parse(r.output)["time"]["tokens_per_s"].get<double>(), 0);
  // A hybrid Mamba-2 stack by name: Nemotron-H 8B, 24 Mamba-2, 4 attention and 24 MLP blocks.
  // Its approximation is said on stderr, ahead of the JSON.
  r = run_loom("plan --model \"Nemotron-H 8B\" --gpus 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Mamba-2 scans"));
  const nlohmann::json best = nlohmann::json::parse(json_part(r.output))["top"][0];
  EXPECT_GT(best["time"]["tokens_per_s"].get<double>(), 0);
  EXPECT_FALSE(best["engine_supported"].get<bool>());  // planned, not trained by loom's engine
  // Nemotron 3 Super in NVFP4 on 64 GB200s: 512 latent experts on 40 of 88 blocks, and MTP. Its
  // 120,000 listed parameters are tallied once per (tp, ep), not once per layout and rank (the
  // search took over ten minutes before).
  r = run_loom(
      "plan --model \"Nemotron 3 Super\" --gpu gb200 --gpus 64 --seq 8192 --global-batch 512 "
      "--precision nvfp4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(
      nlohmann::json::parse(json_part(r.output))["top"][0]["time"]["tokens_per_s"].get<double>(),
      0);
  r = run_loom("plan --model llama-405b --gpus 8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("the smallest count of h100-sxm that fits is"));
  // --precision fp8: the Linear GEMMs at the FP8 peak (twice BF16's on an H100) and their saved
  // inputs in 1 byte: faster, but less than 2x (attention, norms and communication stay), and
  // fewer activation bytes; a GPU without FP8 tensor cores is refused before any work.
  const std::string eight = "plan --model llama-8b --gpu h100-sxm --layout dp=8,zero=1,mbs=1,recompute=none --seq 8192 "
                            "--global-batch 128 --json";
  const nlohmann::json bf16 = nlohmann::json::parse(run_loom(eight).output);
  r = run_loom(eight + " --precision fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json fp8 = nlohmann::json::parse(r.output);
  const double speedup = fp8["time"]["tokens_per_s"].get<double>() / bf16["time"]["tokens_per_s"].get<double>();
  EXPECT_GT(speedup, 1.0);
  EXPECT_LT(speedup, 2.0);
  EXPECT_LT(fp8["memory_bytes"]["activations"].get<double>(), bf16["memory_bytes"]["activations"].get<double>());
  // --precision nvfp4 on a GB200 (FP4 10 PF dense, twice its FP8): faster than fp8 there, by
  // less than 2x; an H100 has no FP4 tensor cores and is refused.
  const std::string gb200 = "plan --model llama-8b --gpu gb200 --layout dp=8,zero=1,mbs=1,recompute=none --seq 8192 "
                            "--global-batch 128 --json";
  r = run_loom(gb200 + " --precision fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double fp8_tokens = nlohmann::json::parse(r.output)["time"]["tokens_per_s"].get<double>();
  r = run_loom(gb200 + " --precision nvfp4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double fp4_speedup = nlohmann::json::parse(r.output)["time"]["tokens_per_s"].get<double>() / fp8_tokens;
  EXPECT_GT(fp4_speedup, 1.0);
  EXPECT_LT(fp4_speedup, 2.0);
  // --precision mxfp8: per-tensor FP8's plan with the GEMMs at the block-scaled kernels' rate
  // (7.161 / 6.812 of the time, Transformer Engine's B300 figures): slower than fp8 by less than
  // that, as attention and the rest keep their time; refused where no block-scaled cores exist.
  r = run_loom(gb200 + " --precision mxfp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double mx_ratio =
      nlohmann::json::parse(r.output)["time"]["tokens_per_s"].get<double>() / fp8_tokens;
  EXPECT_LT(mx_ratio, 1.0);
  EXPECT_GT(mx_ratio, 6.812 / 7.161);
  r = run_loom("plan --model llama-8b --gpu h100-sxm --layout dp=8 --precision mxfp8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(
      r.output,
      HasSubstr("--precision mxfp8 on h100-sxm, which has no block-scaled (MX) tensor cores"));
  // An AMD part is planned (its datasheet, the Hopper family's efficiencies at its measured
  // share of its peak), but loom's GPU engine is CUDA: every layout on it is marked.
  r = run_loom(
      "plan --model llama-8b --gpu mi300x --layout dp=8,zero=1,mbs=1,recompute=none --seq 8192 "
      "--global-batch 128 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json amd = nlohmann::json::parse(r.output);
  EXPECT_FALSE(amd["engine_supported"].get<bool>());
  EXPECT_THAT(amd["engine_note"].get<std::string>(),
              HasSubstr("AMD GPUs (loom's GPU engine is CUDA)"));
  EXPECT_TRUE(nlohmann::json::parse(run_loom(eight).output)["engine_supported"].get<bool>());
  r = run_loom("plan --model llama-8b --gpu h100-sxm --layout dp=8 --precision nvfp4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--precision nvfp4 on h100-sxm, which has no FP4 tensor cores"));
  r = run_loom("plan --model llama-8b --gpu a100-80gb --layout dp=8 --precision fp8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--precision fp8 on a100-80gb, which has no FP8 tensor cores"));
  r = run_loom("plan --model llama-8b --layout dp=8 --gpu v100");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("h100-sxm"));  // the error lists the presets
}

TEST(Cli, PlanValidateComparesPublishedRunsAndCalibratesFromGemmTimings) {
  const std::string published = std::string(LOOM_SOURCE_DIR) + "/published/public_runs.json";
  CommandResult r = run_loom("plan --validate " + published + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json v = nlohmann::json::parse(r.output);
  EXPECT_EQ(v["runs"].size(), 57u);
  EXPECT_EQ(v["total"].get<int64_t>(), 57);
  EXPECT_EQ(v["answered"].get<int64_t>(), 57);  // every one (test_plan_validate.cpp)
  EXPECT_EQ(v["malformed"].get<int64_t>(), 0);
  EXPECT_EQ(v["verdicts"].get<int64_t>(), v["verdicts_right"].get<int64_t>());
  r = run_loom("plan --validate " + published);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("narayanan21_t1_1008.0B"));
  EXPECT_THAT(r.output, HasSubstr("coverage: 57 of 57 runs answered"));
  EXPECT_THAT(r.output, HasSubstr("TFLOP/s through the run's own 27.18 GFLOP per token"));
  EXPECT_THAT(r.output, HasSubstr("median |error|"));
  r = run_loom("plan --layout dp=8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("give --model"));

  // Timings as a GPU twice as slow as the default curve: the plan's throughput halves.
  TempDir dir("cli_gemm");
  std::string csv = "m,n,k,seconds\n";
  const plan::GemmEfficiency slow{0.30, 256};
  for (double m : {512.0, 4096.0, 16384.0})
    for (double n : {256.0, 4096.0}) csv += std::to_string(m) + "," + std::to_string(n) + ",4096," +
                                            std::to_string(2 * m * n * 4096 / (989.5e12 * slow.efficiency(m, n, 4096))) + "\n";
  write_text_file(dir.file("gemm.csv"), csv);
  const std::string layout = "plan --model llama-8b --layout tp=8,dp=8,zero=1,recompute=selective,sp=1 --json";
  r = run_loom(layout);
  const double default_rate = nlohmann::json::parse(r.output)["time"]["tokens_per_s"].get<double>();
  r = run_loom(layout + " --gemm-timings " + dir.file("gemm.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double slow_rate = nlohmann::json::parse(r.output)["time"]["tokens_per_s"].get<double>();
  EXPECT_LT(slow_rate, 0.65 * default_rate);
  // --svg writes both charts of the evaluated layout.
  r = run_loom(layout + " --svg " + dir.file("charts"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(read_text_file(dir.file("charts/memory.svg")).find("usable HBM"), std::string::npos);
  EXPECT_NE(read_text_file(dir.file("charts/timeline.svg")).find("simulated bubble"), std::string::npos);
  EXPECT_GT(slow_rate, 0.40 * default_rate);
}

// What the search prints is a layout --layout reads back; one the engine does not run yet is
// still predicted, and marked with what is missing.
TEST(Cli, PlanLayoutsPasteBackAndAreMarkedWhenTheEngineLacksThem) {
  CommandResult r = run_loom("plan --model llama-8b --gpus 64 --top 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json search = nlohmann::json::parse(r.output);
  for (const nlohmann::json& candidate : search["top"]) {
    const std::string printed = candidate["layout"].get<std::string>();
    r = run_loom("plan --model llama-8b --layout \"" + printed + "\" --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json again = nlohmann::json::parse(r.output);
    EXPECT_EQ(again["layout"], printed);
    EXPECT_EQ(again["engine_supported"], candidate["engine_supported"]);
    EXPECT_NEAR(again["memory_bytes"]["total"].get<double>(), candidate["memory_bytes"]["total"].get<double>(), 1.0);
  }
  r = run_loom("plan --model llama-8b --layout \"tp=8 pp=2 dp=4 zero=3 mbs=1 recompute=selective sp 1f1b\"");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("engine: not yet supported: ZeRO-3 with pp"));
  EXPECT_THAT(r.output, HasSubstr("use zero_stage 0 or 1"));
  r = run_loom("plan --model llama-8b --layout \"tp=8 dp=8 zero=1 mbs=1 recompute=selective sp\" --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(nlohmann::json::parse(r.output)["engine_supported"].get<bool>());
  r = run_loom("plan --model llama-8b --layout \"tp=8 dp=8 tensor=2\"");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown key 'tensor'"));
}

// A plan file says what the flags say; flags given on the command line win; typos are errors.
TEST(Cli, PlanReadsModelClusterAndTrainingFromATomlFile) {
  TempDir dir("cli_plan_file");
  write_text_file(dir.file("plan.toml"), R"([model]
preset = "llama-8b"
n_layer = 16
[cluster]
gpu = "a100-80gb"
gpus = 16
inter_node_gbit_per_gpu = 100
price_per_gpu_hour = 2.0
[training]
seq_len = 2048
global_batch_tokens = 262144
train_tokens = 1e11
[plan]
layout = "tp=8,dp=2,zero=1,recompute=selective,sp=1"
)");
  CommandResult r = run_loom("plan --config " + dir.file("plan.toml") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json plan = nlohmann::json::parse(r.output);
  EXPECT_EQ(plan["gpu"], "a100-80gb");
  EXPECT_EQ(plan["seq_len"].get<int64_t>(), 2048);
  EXPECT_EQ(plan["global_batch"].get<int64_t>(), 128);  // 262144 tokens / 2048
  EXPECT_EQ(plan["micro_batches"].get<int64_t>(), 64);
  EXPECT_LT(plan["parameters"].get<int64_t>(), 5'000'000'000);  // 16 of llama-8b's 32 layers
  // The command line beats the file.
  r = run_loom("plan --config " + dir.file("plan.toml") + " --json --global-batch 32 --gpu h100-sxm");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  plan = nlohmann::json::parse(r.output);
  EXPECT_EQ(plan["gpu"], "h100-sxm");
  EXPECT_EQ(plan["micro_batches"].get<int64_t>(), 16);
  r = run_loom("plan --config " + dir.file("plan.toml"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cost at 2.00 per GPU-hour"));
  write_text_file(dir.file("typo.toml"), "[cluster]\ngpus = 8\nnvlink_gbs = 900\n");
  r = run_loom("plan --model llama-8b --config " + dir.file("typo.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("cluster.nvlink_gbs"));
  // Expert load imbalance from the file (or --moe-imbalance): the busiest ep rank's rows over
  // the mean slow the step; below 1 it is refused before planning.
  const std::string moe = "plan --model mixtral-8x7b --layout \"tp=2 dp=16 ep=8 zero=1\" --seq 4096 --global-batch 64 --json";
  r = run_loom(moe);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double balanced = nlohmann::json::parse(r.output)["time"]["step_s"].get<double>();
  write_text_file(dir.file("moe.toml"), "[training]\nmoe_imbalance = 1.5\n");
  r = run_loom(moe + " --config " + dir.file("moe.toml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(nlohmann::json::parse(r.output)["time"]["step_s"].get<double>(), 1.2 * balanced);
  write_text_file(dir.file("moe_bad.toml"), "[training]\nmoe_imbalance = 0.5\n");
  r = run_loom(moe + " --config " + dir.file("moe_bad.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("training.moe_imbalance = 0.5"));
}

TEST(Cli, CorruptCheckpointIsAnErrorAndTheOlderOneSurvives) {
  TinyRun run("cli_ckpt");
  const std::string config = run.write_config(run.config("gpt2", 10));
  CommandResult r = run_loom("train " + config);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto newest = latest_checkpoint(run.dir + "/ckpt");
  ASSERT_TRUE(newest.has_value());
  EXPECT_THAT(*newest, HasSubstr("step_00000010"));
  const std::string older = run.dir + "/ckpt/step_00000005";
  const std::string older_bytes = read_text_file(older + "/model.safetensors");

  // Flip one byte in the newest checkpoint's weights: loading must say which file is bad.
  {
    std::fstream f(*newest + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  r = run_loom("eval --checkpoint " + run.dir + "/ckpt --data '" + run.dir + "/data/tiny_val_*.bin' --seq-len 16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("model.safetensors"));
  // Resuming from it fails the same way, and touches nothing.
  r = run_loom("train " + config + " --train.steps=15");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(read_text_file(older + "/model.safetensors"), older_bytes);

  // Truncated file.
  std::filesystem::resize_file(*newest + "/model.safetensors", 100);
  r = run_loom("eval --checkpoint " + *newest + " --data '" + run.dir + "/data/tiny_val_*.bin' --seq-len 16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("model.safetensors"));

  // The older checkpoint still evaluates.
  r = run_loom("eval --checkpoint " + older + " --data '" + run.dir + "/data/tiny_val_*.bin' --seq-len 16");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("eval loss"));

  // A checkpoint of another vocabulary cannot be resumed by this config.
  const std::string other_vocab = run.write_config(
      std::string(run.config("gpt2", 10)).replace(run.config().find("vocab_size = 64"), 15, "vocab_size = 80"), "v80.toml");
  std::filesystem::remove_all(*newest);
  r = run_loom("train " + other_vocab + " --train.steps=12");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("vocab_size"));
}

}  // namespace
}  // namespace loom::test
