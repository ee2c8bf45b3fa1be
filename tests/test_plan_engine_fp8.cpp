// `loom plan --precision fp8 --profile`: what FP8 training costs loom's CPU engine, which emulates
// it (plan/engine_fp8.hpp). The engine's GEMMs stay f32, so a layer's FP8 time over its f32 time
// is its quantisations at the profile's per-element rates, plus the current recipe's amax
// all-reduces. Expected values are counted by hand from the engine's FP8 linear layers
// (model/transformer_fp8.cpp, model/fp8_linear.cpp).
#include <gtest/gtest.h>

#include "loom/model/fp8_linear.hpp"
#include "loom/plan/engine_fp8.hpp"
#include "loom/plan/machine_profile.hpp"
#include "loom/plan/search.hpp"
#include "loom/plan/time_model.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/trainer.hpp"
#include "model_fixtures.hpp"
#include "test_support.hpp"
#include "trainer_fixture.hpp"

namespace loom::plan {
namespace {

#define EXPECT_THROW_MSG(statement, text) \
  loom::test::expect_contains(loom::test::error_message([&] { (void)(statement); }), {text})

// Rates far apart, so a quantisation charged at the wrong one shows.
constexpr double kTensor = 1e-8, kRowTiles = 2e-8, kColumnTiles = 3e-8, kBlocks = 5e-8;
constexpr double kMemory = 4e10;  // bytes per second (the bias copies)
constexpr double kAllReduceLatency = 2e-5, kAllReduceRate = 2e9;

ProfileEntry entry(int64_t ranks) {
  ProfileEntry e;
  e.ranks = ranks;
  e.peak_flops = 1e11;
  e.gemm = {0.8, 16};
  e.attention_forward = {0.5, 32};
  e.attention_backward = {0.25, 32};
  e.memory_bytes_per_s = kMemory;
  e.fp8 = {kTensor, kRowTiles, kColumnTiles, kBlocks};
  if (ranks > 1) {
    auto comm = std::make_shared<MeasuredComm>();
    comm->p2p = {4e-6, 1e10};
    for (Collective op : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                          Collective::AllToAll})
      comm->collectives.push_back({op, ranks, {kAllReduceLatency, kAllReduceRate}});
    e.comm = comm;
  }
  return e;
}

// GPT-2, d = 32, 4 heads, MLP 128, 16 tokens a sequence (2 a micro-batch below: 32 rows).
ModelConfig gpt2() { return test::tiny_gpt2(); }

TrainingJob job_for(const ProfiledMachine& m, EngineFp8Recipe recipe) {
  TrainingJob job = m.job;
  job.seq_len = 16;
  job.memory.seq_len = 16;
  job.global_batch = 8;
  job.engine_fp8.recipe = recipe;
  return job;
}

// FP8 layer time minus the same layer in f32: what the emulation adds.
LayerTime fp8_extra(const ModelConfig& model, const PlanLayout& layout, EngineFp8Recipe recipe) {
  const ProfiledMachine m = profiled_machine(entry(layout.gpus()), 1e9);
  const LayerTime f32 =
      predict_layer_time(model, layout, m.cluster, job_for(m, EngineFp8Recipe::Off));
  const LayerTime fp8 = predict_layer_time(model, layout, m.cluster, job_for(m, recipe));
  return {fp8.forward_s - f32.forward_s, fp8.backward_s - f32.backward_s};
}

PlanLayout one_rank() {
  PlanLayout l;
  l.micro_batch = 2;
  return l;
}

// One process, 32 rows: c_attn 32 -> 96, attention c_proj 32 -> 32, c_fc 32 -> 128, MLP c_proj
// 128 -> 32. Inputs (rows x in) 1024 + 1024 + 1024 + 4096 = 7168; weights (out x in) 3072 +
// 1024 + 4096 + 4096 = 12,288; output gradients (rows x out) 3072 + 1024 + 4096 + 1024 = 9216.
constexpr double kInputs = 7168, kWeights = 12288, kGrads = 9216;

TEST(PlanEngineFp8, PerTensorRecipesQuantiseEachOperandAtTheTensorRate) {
  // Forward: inputs and weights; backward: the output gradients, the weights again (input
  // gradient) and the inputs again (weight gradient); every GPT-2 linear has a bias, so backward
  // also copies each output gradient (read and write 4 bytes an element).
  for (EngineFp8Recipe recipe : {EngineFp8Recipe::Delayed, EngineFp8Recipe::Current}) {
    const LayerTime extra = fp8_extra(gpt2(), one_rank(), recipe);
    EXPECT_NEAR(extra.forward_s, kTensor * (kInputs + kWeights), 1e-15);
    EXPECT_NEAR(extra.backward_s, kTensor * (kGrads + kWeights + kInputs) + 8 * kGrads / kMemory,
                1e-15);
  }
}

TEST(PlanEngineFp8, BlockwiseQuantisesTilesBlocksAndTransposedTiles) {
  // Forward: inputs in 1 x 128 tiles, weights in 128 x 128 blocks; backward: output gradients in
  // 1 x 128 tiles and the weights' blocks again (input gradient), then output gradients and
  // inputs in 128 x 1 tiles (weight gradient).
  const LayerTime extra = fp8_extra(gpt2(), one_rank(), EngineFp8Recipe::Blockwise);
  EXPECT_NEAR(extra.forward_s, kRowTiles * kInputs + kBlocks * kWeights, 1e-15);
  EXPECT_NEAR(extra.backward_s,
              kRowTiles * kGrads + kBlocks * kWeights + kColumnTiles * (kGrads + kInputs) +
                  8 * kGrads / kMemory,
              1e-15);
}

TEST(PlanEngineFp8, FullRecomputationQuantisesTheForwardAgain) {
  PlanLayout l = one_rank();
  l.recompute = Recompute::Full;
  const LayerTime extra = fp8_extra(gpt2(), l, EngineFp8Recipe::Delayed);
  const double forward = kTensor * (kInputs + kWeights);
  EXPECT_NEAR(extra.forward_s, forward, 1e-15);
  EXPECT_NEAR(extra.backward_s,
              forward + kTensor * (kGrads + kWeights + kInputs) + 8 * kGrads / kMemory, 1e-15);
}

TEST(PlanEngineFp8, TensorParallelShardsAndTheCurrentRecipesAmaxReductions) {
  // tp 2 with sequence parallelism, 32 gathered rows on each rank. Column-parallel c_attn
  // 32 -> 48 and c_fc 32 -> 64 run their backward as two halves (the input-gradient all-reduce
  // between them), the weight half taking the output gradient the input half quantised;
  // row-parallel c_proj 16 -> 32 and 64 -> 32 one call, whose bias gradient is summed apart
  // (no copy).
  //   inputs  1024 + 512 + 1024 + 2048 = 4608      weights 1536 + 512 + 2048 + 2048 = 6144
  //   output gradients 1536 + 1024 + 2048 + 1024 = 5632; copies 1536 + 2048 = 3584
  // The current recipe all-reduces every quantisation's amax over the stage's 2 ranks: 2 a
  // layer forward (8), and 3 backward (12), each 4 bytes at the profile's all-reduce,
  // 20 us + 4 B / 2 GB/s.
  PlanLayout l = one_rank();
  l.tp = 2;
  l.sequence_parallel = true;
  const double reduce = kAllReduceLatency + 4 / kAllReduceRate;
  const double forward = kTensor * (4608 + 6144),
               backward = kTensor * (5632 + 6144 + 4608) + 8 * 3584 / kMemory;
  const LayerTime delayed = fp8_extra(gpt2(), l, EngineFp8Recipe::Delayed);
  EXPECT_NEAR(delayed.forward_s, forward, 1e-15);
  EXPECT_NEAR(delayed.backward_s, backward, 1e-15);
  const LayerTime current = fp8_extra(gpt2(), l, EngineFp8Recipe::Current);
  EXPECT_NEAR(current.forward_s, forward + 8 * reduce, 1e-15);
  EXPECT_NEAR(current.backward_s, backward + 12 * reduce, 1e-15);
}

TEST(PlanEngineFp8, ExpertsQuantiseTheirOwnRowsInTheirOwnAmaxGroup) {
  // Llama, d = 32, 4 heads of 8 (2 kv heads: k and v 16 wide), every layer 4 experts of 24 with
  // k = 2 and one shared expert; ep 2 inside dp 2, so each rank holds 2 experts, each seeing
  // 32 rows x k x ep / E = 32 rows. No dense MLP: attention's q 32 -> 32, k and v 32 -> 16,
  // o 32 -> 32; each expert's gate and up 32 -> 24 and down 24 -> 32; the shared expert the
  // same on the rank's 32 rows.
  //   attention: inputs 4 x 1024 = 4096; weights 1024 + 512 + 512 + 1024 = 3072;
  //              output gradients 1024 + 512 + 512 + 1024 = 3072
  //   one expert (or the shared one): inputs 1024 + 1024 + 768 = 2816; weights 3 x 768 = 2304;
  //              output gradients 768 + 768 + 1024 = 2560
  // Per tensor: every element twice but the output gradients once (no biases in Llama).
  ModelConfig m = test::tiny_llama();  // d = 32, 4 heads of 8, 2 kv heads
  m.n_experts = 4;
  m.experts_per_token = 2;
  m.moe_ffn_hidden = 24;
  m.n_shared_experts = 1;
  PlanLayout l = one_rank();
  l.dp = 2;
  l.ep = 2;
  const ProfiledMachine machine = profiled_machine(entry(2), 1e9);
  const EngineFp8Cost c =
      engine_fp8_layer_cost(m, l, machine.cluster, job_for(machine, EngineFp8Recipe::Current));
  const double attention = 2 * 4096 + 2 * 3072 + 3072, expert = 2 * 2816 + 2 * 2304 + 2560;
  EXPECT_DOUBLE_EQ(c.tensor_elements, attention + 3 * expert);  // 2 local experts + the shared
  EXPECT_DOUBLE_EQ(c.bias_copy_elements, 0);
  // The dense group (the stage's dp 2) reduces every quantisation of attention and the shared
  // expert: 7 linears, 2 forward and 3 backward each; the experts' group (dp x tp / ep = 1 rank)
  // reduces nothing.
  EXPECT_DOUBLE_EQ(c.forward_reductions, 7 * 2);
  EXPECT_DOUBLE_EQ(c.backward_reductions, 7 * 3);
  EXPECT_NEAR(c.forward_reduce_s, 14 * (kAllReduceLatency + 4 / kAllReduceRate), 1e-15);
  // Blockwise reduces nothing and charges each tile kind its rate.
  const EngineFp8Cost b =
      engine_fp8_layer_cost(m, l, machine.cluster, job_for(machine, EngineFp8Recipe::Blockwise));
  EXPECT_DOUBLE_EQ(b.forward_reductions + b.backward_reductions, 0);
  EXPECT_DOUBLE_EQ(b.row_tile_elements, 4096 + 3072 + 3 * (2816 + 2560));
  EXPECT_DOUBLE_EQ(b.column_tile_elements, 4096 + 3072 + 3 * (2816 + 2560));
  EXPECT_DOUBLE_EQ(b.block_elements, 2 * 3072 + 3 * 2 * 2304);
}

TEST(PlanEngineFp8, BlockwiseLayoutsTheTrainerRefusesAreMarked) {
  // The trainer refuses blockwise where a tp slice cuts a 128-wide tile (GPT-2 d = 32 at tp 2:
  // 16-wide query slices) or a cp chunk a 128-token tile (seq 16 at cp 2: chunks of 4); the
  // plan marks those layouts rather than predicting a run that cannot start.
  const ProfiledMachine m = profiled_machine(entry(2), 1e9);
  const TrainingJob blockwise = job_for(m, EngineFp8Recipe::Blockwise);
  PlanLayout tp2 = one_rank(), cp2 = one_rank();
  tp2.tp = 2;
  cp2.cp = 2;
  for (const PlanLayout& l : {tp2, cp2})
    EXPECT_NE(engine_note_on(m.cluster.gpu, l, gpt2(), 16, blockwise)
                  .find("engine: not yet supported: blockwise FP8 on this layout"),
              std::string::npos)
        << l.describe();
  EXPECT_NE(
      engine_note_on(m.cluster.gpu, tp2, gpt2(), 16, blockwise).find("is not a multiple of 128"),
      std::string::npos);
  // Widths of 128 x tp and chunks of 128 tokens keep the tiles whole; other recipes any shape.
  ModelConfig wide = gpt2();
  wide.n_embd = 256, wide.n_head = 2, wide.n_kv_head = 2, wide.ffn_hidden = 1024,
  wide.max_seq_len = 512;
  EXPECT_EQ(engine_note_on(m.cluster.gpu, tp2, wide, 512, blockwise), "");
  EXPECT_EQ(engine_note_on(m.cluster.gpu, cp2, wide, 512, blockwise), "");
  EXPECT_EQ(engine_note_on(m.cluster.gpu, tp2, gpt2(), 16, job_for(m, EngineFp8Recipe::Current)),
            "");
}

TEST(PlanEngineFp8, RefusesWithoutRatesAndForHybrids) {
  ProfileEntry e = entry(1);
  e.fp8 = {};
  const ProfiledMachine m = profiled_machine(e, 1e9);
  EXPECT_THROW_MSG(
      engine_fp8_layer_cost(gpt2(), one_rank(), m.cluster, job_for(m, EngineFp8Recipe::Delayed)),
      "needs the profile's FP8 quantisation rates");
  // Off costs nothing, rates or not.
  EXPECT_EQ(engine_fp8_layer_cost(gpt2(), one_rank(), m.cluster, job_for(m, EngineFp8Recipe::Off))
                .forward_s,
            0);
}

TEST(PlanEngineFp8, ProfileCarriesTheRates) {
  MachineProfile profile;
  profile.machine = "test CPU (2 cores)";
  merge_profile_entry(profile, entry(1));
  ProfileEntry older = entry(2);
  older.fp8 = {};  // a file written before calibrate measured FP8
  merge_profile_entry(profile, older);
  const std::string path = ::testing::TempDir() + "loom_fp8_profile.json";
  write_machine_profile(profile, path);
  const MachineProfile read = read_machine_profile(path);
  EXPECT_EQ(read.entry(1).fp8.tensor_s, kTensor);
  EXPECT_EQ(read.entry(1).fp8.row_tiles_s, kRowTiles);
  EXPECT_EQ(read.entry(1).fp8.column_tiles_s, kColumnTiles);
  EXPECT_EQ(read.entry(1).fp8.blocks_s, kBlocks);
  EXPECT_FALSE(read.entry(2).fp8.measured());
  EXPECT_EQ(profiled_machine(read, 1, 1e9).job.engine_fp8.rates.blocks_s, kBlocks);
  EXPECT_EQ(profiled_machine(read, 1, 1e9).job.engine_fp8.recipe, EngineFp8Recipe::Off);
}

// The planner's counts are the engine's own: one step of the tiny GPT-2 and of a Llama mixture of
// experts (4 experts of 24, k = 2, a shared expert) quantises exactly n_layer x micro-batches x
// the mean layer's elements of each kind (Fp8QuantizeTally counts what Fp8Linear::quantize did).
class EngineFp8Counts : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(EngineFp8Counts, AreTheEnginesQuantisations) {
  const auto& [arch, recipe] = GetParam();
  test::TinyRun run("plan_fp8_counts_" + arch + "_" + recipe);
  std::vector<std::string> overrides = {
      "train.precision=\"fp8\"", "train.fp8_recipe=\"" + recipe + "\"",
      "data.val=\"\"",           "checkpoint.dir=\"\"",
      "optim.warmup_steps=0",    "log.dir=\"" + run.dir + "/log\""};
  if (arch == "llama")
    for (const char* key : {"model.n_experts=4", "model.experts_per_token=2",
                            "model.n_shared_experts=1", "model.moe_ffn_hidden=24"})
      overrides.push_back(key);
  ConfigReader reader = ConfigReader::from_string(run.config(arch, 1), "test.toml");
  reader.apply_overrides(overrides);
  Trainer trainer(parse_train_config(reader));
  fp8_quantize_tally().reset();
  (void)trainer.run();
  const Fp8QuantizeTally& tally = fp8_quantize_tally();

  const ModelConfig& model = trainer.model().config();
  PlanLayout layout;
  layout.micro_batch = 4;  // the tiny config: 4 sequences of 16, 2 micro-batches a step
  const ProfiledMachine m = profiled_machine(entry(1), 1e9);
  TrainingJob job = job_for(m, recipe == "current"     ? EngineFp8Recipe::Current
                               : recipe == "blockwise" ? EngineFp8Recipe::Blockwise
                                                       : EngineFp8Recipe::Delayed);
  const EngineFp8Cost c = engine_fp8_layer_cost(model, layout, m.cluster, job);
  const double per_step = static_cast<double>(model.n_layer) * 2;
  EXPECT_EQ(static_cast<double>(tally.tensor), per_step * c.tensor_elements);
  EXPECT_EQ(static_cast<double>(tally.row_tiles), per_step * c.row_tile_elements);
  EXPECT_EQ(static_cast<double>(tally.column_tiles), per_step * c.column_tile_elements);
  EXPECT_EQ(static_cast<double>(tally.blocks), per_step * c.block_elements);
  EXPECT_GT(tally.tensor + tally.row_tiles, 0);
}

INSTANTIATE_TEST_SUITE_P(Recipes, EngineFp8Counts,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Values("delayed", "current", "blockwise")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace loom::plan
