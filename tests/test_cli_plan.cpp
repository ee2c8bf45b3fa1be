// `loom plan` as a user meets it for what a layout costs beyond the engine's own: LoRA's frozen
// base, activations offloaded to host memory, and --validate's refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using ::testing::HasSubstr;

// LoRA fine-tuning (--finetune lora, or training.finetune): the base keeps its 16-bit weights
// only, so 70B on 8 H100s at tp 2, pp 4 drops from 189 GiB (does not fit) to what its weights and
// activations take; the step loses its weight-gradient GEMMs (about a third of the compute).
TEST(Cli, PlanFineTunesWithLoraOnAFrozenBase) {
  const std::string layout =
      "plan --model llama-70b --seq 4096 --global-batch 32 --layout tp=2,pp=4,dp=1,zero=0 --json";
  CommandResult r = run_loom(layout);
  EXPECT_EQ(r.exit_code, 1) << r.output;  // every weight training does not fit
  const nlohmann::json full = nlohmann::json::parse(r.output);
  r = run_loom(layout + " --finetune lora");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json lora = nlohmann::json::parse(r.output);
  EXPECT_EQ(lora["finetune"], "lora");
  EXPECT_FALSE(lora["engine_supported"].get<bool>());  // loom's trainer trains every weight
  EXPECT_THAT(lora["engine_note"].get<std::string>(), HasSubstr("LoRA fine-tuning"));
  EXPECT_TRUE(lora["fits"].get<bool>());
  EXPECT_EQ(lora["memory_bytes"]["gradients"].get<double>(), 0);
  EXPECT_EQ(lora["memory_bytes"]["optimizer_state"].get<double>(), 0);
  EXPECT_EQ(lora["memory_bytes"]["parameters"], full["memory_bytes"]["parameters"]);
  EXPECT_EQ(lora["memory_bytes"]["activations"], full["memory_bytes"]["activations"]);
  const double ratio =
      lora["time"]["compute_s"].get<double>() / full["time"]["compute_s"].get<double>();
  EXPECT_GT(ratio, 0.6);
  EXPECT_LT(ratio, 0.8);
  r = run_loom(layout + " --finetune qlora");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--finetune"));
  TempDir dir("cli_plan_lora");
  write_text_file(dir.file("lora.toml"),
                  "[training]\nfinetune = \"lora\"\nseq_len = 4096\nglobal_batch = 32\n");
  r = run_loom("plan --model llama-70b --layout tp=2,pp=4,dp=1,zero=0 --json --config " +
               dir.file("lora.toml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["finetune"], "lora");
  write_text_file(dir.file("bad.toml"), "[training]\nfinetune = \"adapters\"\n");
  r = run_loom("plan --model llama-70b --config " + dir.file("bad.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("training.finetune = 'adapters'; expected full or lora"));
}

// --offload-layers (Megatron-Core's cpu_offloading_num_layers): Llama 3 70B under FSDP on 64
// GB200s with no recomputation does not fit; with 60 of its 80 layers' activations in the Grace
// CPU's memory it does. At pp 1 the activations fall by k stashes, so 60 offloaded layers save
// twice what 30 do. Loom's trainer keeps activations on the device: the layout is marked.
// Offloading stands in for recomputation at one pipeline stage, for fewer layers than the model
// has, as Megatron-Core requires; a search and --validate are not offered it.
TEST(Cli, PlanOffloadsActivationsToHostMemory) {
  const std::string layout =
      "plan --model llama-70b --gpu gb200 --gpus-per-node 72 --seq 8192 --global-batch 128 "
      "--precision fp8 --layout tp=1,pp=1,dp=64,zero=3,mbs=2,recompute=none --json";
  CommandResult r = run_loom(layout);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const double kept = nlohmann::json::parse(r.output)["memory_bytes"]["activations"].get<double>();
  r = run_loom(layout + " --offload-layers 60");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json sixty = nlohmann::json::parse(r.output);
  EXPECT_TRUE(sixty["fits"].get<bool>());
  EXPECT_FALSE(sixty["engine_supported"].get<bool>());
  EXPECT_THAT(sixty["engine_note"].get<std::string>(), HasSubstr("activation offloading"));
  EXPECT_TRUE(sixty["time"].contains("offload_s"));
  r = run_loom(layout + " --offload-layers 30");
  ASSERT_LE(r.exit_code, 1) << r.output;
  const double thirty =
      nlohmann::json::parse(r.output)["memory_bytes"]["activations"].get<double>();
  EXPECT_NEAR((kept - sixty["memory_bytes"]["activations"].get<double>()) / (kept - thirty), 2.0,
              1e-9);
  r = run_loom(
      "plan --model llama-70b --gpu gb200 --seq 8192 --global-batch 128 "
      "--layout tp=1,pp=2,dp=32,zero=3,mbs=2 --offload-layers 10");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--offload-layers needs pp=1 and recompute=none"));
  r = run_loom(layout + " --offload-layers 80");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--offload-layers 80 must be fewer than the model's 80 layers"));
  r = run_loom("plan --model llama-70b --gpu gb200 --gpus 64 --offload-layers 10");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("give --layout"));
  r = run_loom("plan --validate " + std::string(LOOM_SOURCE_DIR) +
               "/published/public_runs.json --offload-layers 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("drop --offload-layers"));
  // What leaves the GPU lands in its share of the host's memory: a GB200's Grace has 480 GB of
  // LPDDR5X for two GPUs. Each offloaded layer frees its stash on the GPU and takes it on the
  // host, so the host holds exactly what the GPU saved; 70 layers' stashes outgrow 240 GB
  // (60 held 218 GB above), and the layout does not fit although the GPU has room.
  r = run_loom(layout + " --offload-layers 70");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const nlohmann::json seventy = nlohmann::json::parse(r.output);
  EXPECT_FALSE(seventy["fits"].get<bool>());
  EXPECT_EQ(seventy["host_memory_bytes"].get<double>(), 240e9);
  const double host = seventy["host_offload_bytes"].get<double>();
  EXPECT_GT(host, 240e9);
  EXPECT_NEAR(host, kept - seventy["memory_bytes"]["activations"].get<double>(), 1.0);
  EXPECT_LT(seventy["memory_bytes"]["total"].get<double>(),
            seventy["hbm_bytes"].get<double>() * 0.9);
  EXPECT_NEAR(sixty["host_offload_bytes"].get<double>() / host, 60.0 / 70.0, 1e-12);
  EXPECT_LT(sixty["host_offload_bytes"].get<double>(), 240e9);
}

// --validate takes each run's model, cluster, layout and training from its record: an option
// that would shape them is refused by name, not silently ignored.
TEST(Cli, PlanValidateRefusesOptionsItWouldIgnore) {
  const std::string runs = std::string(LOOM_SOURCE_DIR) + "/published/public_runs.json";
  CommandResult r = run_loom("plan --validate " + runs + " --finetune lora --gpu b200");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("drop --finetune, --gpu (only --json goes with it)"));
  r = run_loom("plan --validate " + runs + " --seq 2048");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("drop --seq"));
}

// Which precisions loom's engine trains: FP8 under any layout (tp and pp, experts and ep
// included); MXFP8 and NVFP4 are other recipes.
TEST(Cli, PlanSaysWhichPrecisionsLoomsEngineTrains) {
  const std::string dense =
      "plan --model llama-8b --seq 4096 --global-batch 64 --layout tp=2,pp=2,dp=2,zero=1,mbs=1 "
      "--json";
  CommandResult r = run_loom(dense + " --gpu h100-sxm --precision fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(nlohmann::json::parse(r.output)["engine_supported"].get<bool>()) << r.output;
  r = run_loom(
      "plan --model mixtral-8x7b --gpu h100-sxm --seq 4096 --global-batch 64 "
      "--layout tp=1,pp=1,dp=64,ep=8,zero=3,mbs=1 --json --precision fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(nlohmann::json::parse(r.output)["engine_supported"].get<bool>()) << r.output;
  for (const char* precision : {"mxfp8", "nvfp4"}) {
    r = run_loom(std::string(dense) + " --gpu b200 --precision " + precision);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json plan = nlohmann::json::parse(r.output);
    EXPECT_FALSE(plan["engine_supported"].get<bool>()) << precision;
    EXPECT_THAT(plan["engine_note"].get<std::string>(),
                HasSubstr(precision == std::string("mxfp8") ? "MXFP8" : "NVFP4"));
  }
}

// A GPU preset's plan splits uneven pipeline stages as a tuned run does: DeepSeek-V3's 61 layers
// and its MTP depth on 16 stages as Megatron-Bridge's layout (recipes/deepseek/deepseek_v3.py,
// "Et*4|(t*4|)*14tmL": 15 stages of 4 and a last of one layer, the depth and the loss), said in
// the table and given in the JSON; the engine's first-stages-one-more split would leave the last
// stage 3 layers, the depth and two head passes, pacing the pipeline. loom's engine does not
// train the depth and says so (and refuses a [model] table's mtp_layers by name).
TEST(Cli, PlanBalancesUnevenStagesAgainstTheHeadAndMtp) {
  const std::string layout =
      "plan --model deepseek-v3 --gpu b200 --gpus-per-node 8 --seq 4096 --global-batch 4096 "
      "--precision fp8 --layout tp=1,pp=16,dp=16,ep=8,zero=1,mbs=1,recompute=none";
  CommandResult r = run_loom(layout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("balanced against the last one's head and MTP"));
  EXPECT_THAT(r.output, HasSubstr("15 of 4, the last 1"));
  EXPECT_THAT(r.output,
              HasSubstr("trains 1 multi-token-prediction depth on the last pipeline stage"));
  EXPECT_THAT(r.output,
              HasSubstr("model.mtp_layers = 1: the engine trains next-token prediction only"));
  r = run_loom(layout + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int64_t> expected(15, 4);
  expected.push_back(1);
  // The preset's notes go to stderr, before the JSON on stdout.
  const nlohmann::json plan = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(plan["stage_layers"].get<std::vector<int64_t>>(), expected);
  // The preset without the depth: no MTP, and the head alone on the last stage (1.5 layers'
  // work) leaves it two layers, the others 4 but the first, 3.
  r = run_loom(
      "plan --model deepseek-v3-gqa --gpu b200 --gpus-per-node 8 --seq 4096 --global-batch 4096 "
      "--precision fp8 --layout tp=1,pp=16,dp=16,ep=8,zero=1,mbs=1,recompute=none --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expected.assign(1, 3);
  expected.insert(expected.end(), 14, 4);
  expected.push_back(2);
  EXPECT_EQ(nlohmann::json::parse(r.output)["stage_layers"].get<std::vector<int64_t>>(), expected);
  EXPECT_LT(nlohmann::json::parse(r.output)["time"]["step_s"].get<double>(),
            plan["time"]["step_s"].get<double>());
  // model.mtp_layers in a [model] table: planned, and the trainer refuses it by name before any
  // work.
  TempDir dir("cli_plan_mtp");
  const std::string model =
      "[model]\narch = \"llama\"\nvocab_size = 2048\nmax_seq_len = 128\nn_layer = 5\n"
      "n_embd = 64\nn_head = 4\nffn_hidden = 128\n";
  write_text_file(dir.file("plain.toml"), model);
  write_text_file(dir.file("mtp.toml"), model + "mtp_layers = 1\n");
  const std::string small = " --gpu h100-sxm --seq 128 --global-batch 8 --layout pp=2,mbs=1 --json";
  r = run_loom("plan --model " + dir.file("mtp.toml") + small);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json with = nlohmann::json::parse(r.output);
  r = run_loom("plan --model " + dir.file("plain.toml") + small);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json without = nlohmann::json::parse(r.output);
  EXPECT_GT(with["time"]["step_s"].get<double>(), without["time"]["step_s"].get<double>());
  EXPECT_THAT(with["engine_note"].get<std::string>(), HasSubstr("multi-token prediction"));
  write_text_file(dir.file("train.toml"),
                  model + "mtp_layers = 1\n[data]\ntrain = \"" + dir.file("none_*.bin") +
                      "\"\n[train]\nsteps = 1\nbatch_size = 1\nseq_len = 128\n");
  r = run_loom("train " + dir.file("train.toml"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("model.mtp_layers = 1: the engine trains next-token prediction only"));
}

}  // namespace
}  // namespace loom::test
