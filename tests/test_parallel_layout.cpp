// One layout description for the planner and the engine (parallel/parallel_layout): what
// `loom plan` prints reads back, as --layout and in the [parallel] table, and the planner and
// the trainer give the same answer on what the engine runs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/dist/device_mesh.hpp"
#include "loom/parallel/parallel_layout.hpp"
#include "loom/train/train_config.hpp"
#include "test_support.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

void expect_same(const ParallelLayout& a, const ParallelLayout& b) {
  EXPECT_EQ(a.tp, b.tp);
  EXPECT_EQ(a.pp, b.pp);
  EXPECT_EQ(a.vp, b.vp);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.cp, b.cp);
  EXPECT_EQ(a.ep, b.ep);
  EXPECT_EQ(a.zero_stage, b.zero_stage);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.recompute, b.recompute);
  EXPECT_EQ(a.sequence_parallel, b.sequence_parallel);
  EXPECT_EQ(a.schedule, b.schedule);
}

TEST(ParallelLayout, WhatDescribePrintsParsesBackToTheSameLayout) {
  std::vector<ParallelLayout> layouts(4);
  layouts[1] = {.tp = 2, .pp = 4, .vp = 2, .dp = 8, .cp = 2, .ep = 2, .zero_stage = 1, .micro_batch = 2,
                .recompute = Recompute::Selective, .sequence_parallel = true, .schedule = PipelineSchedule::Interleaved};
  layouts[2] = {.pp = 2, .dp = 3, .zero_stage = 3, .recompute = Recompute::Full,
                .schedule = PipelineSchedule::AllForwardAllBackward};
  layouts[3] = {.tp = 8, .dp = 3, .zero_stage = 2, .micro_batch = 16, .sequence_parallel = true};
  for (const ParallelLayout& l : layouts) {
    SCOPED_TRACE(l.describe());
    const ParallelLayout back = parse_layout(l.describe());
    expect_same(back, l);
    EXPECT_EQ(back.describe(), l.describe());
  }
}

TEST(ParallelLayout, CommaAndSpaceSeparatedFormsReadTheSame) {
  const ParallelLayout comma =
      parse_layout("tp=2,pp=4,v=2,dp=8,zero=1,mbs=2,recompute=selective,sp=1,schedule=interleaved");
  const ParallelLayout spaced = parse_layout("tp=2 pp=4 v=2 dp=8 zero=1 mbs=2 recompute=selective sp interleaved");
  const ParallelLayout mixed = parse_layout("  sp, interleaved recompute = selective,mbs=2 zero=1  dp=8, vp=2 pp=4 tp=2 ");
  expect_same(comma, spaced);
  expect_same(comma, mixed);
  // v > 1 without a schedule means interleaved; a schedule that is given stays, and is checked.
  EXPECT_EQ(parse_layout("pp=2 v=2").schedule, PipelineSchedule::Interleaved);
  const ParallelLayout one_f_one_b = parse_layout("pp=2 v=2 1f1b");
  EXPECT_EQ(one_f_one_b.schedule, PipelineSchedule::OneFOneB);
  ModelConfig model = model_preset("llama-8b");
  expect_contains(error_message([&] { check_layout(one_f_one_b, model, 4096); }), {"v=2", "only interleaved"});
  std::vector<std::string> given;
  (void)parse_layout("tp=2 sp afab", &given);
  EXPECT_EQ(given, (std::vector<std::string>{"tp", "sp", "schedule"}));
}

TEST(ParallelLayout, BadTextIsAnErrorNamingTheKeyAndValue) {
  auto error_of = [](const std::string& text) { return error_message([&] { (void)parse_layout(text); }); };
  expect_contains(error_of("tp=2 tensor=4"), {"unknown key 'tensor'", "tp, pp, v, dp"});
  expect_contains(error_of("tp=2 gpipe"), {"unknown word 'gpipe'", "sp, afab, 1f1b, interleaved"});
  expect_contains(error_of("tp=x"), {"tp=x", "integer >= 1"});
  expect_contains(error_of("dp=0"), {"dp=0", "integer >= 1"});
  expect_contains(error_of("zero=-1"), {"zero=-1", "integer >= 0"});
  expect_contains(error_of("sp=maybe"), {"sp=maybe"});
  expect_contains(error_of("schedule=zb"), {"schedule=zb", "afab, 1f1b, interleaved"});
  expect_contains(error_of("recompute=some"), {"'some'", "none, selective, full"});
  expect_contains(error_of("tp=2 tp=4"), {"tp is given twice"});
  expect_contains(error_of("tp=,pp=2"), {"'tp=' is not key=value"});
}

// The two levels: what no engine could run, and what this one does not run yet.
TEST(ParallelLayout, ChecksSayWhetherTheLayoutIsValidAndWhetherTheEngineRunsIt) {
  TinyRun run("layout_levels");
  const ModelConfig llama = parse(run.config("llama", 4), {}).model;  // 4 heads, 2 KV heads, 2 layers
  auto valid = [&](const std::string& text) { return error_message([&] { check_layout(parse_layout(text), llama, 16); }); };
  auto engine = [&](const std::string& text) {
    return error_message([&] { check_layout(parse_layout(text), llama, 16, LayoutRules::Engine); });
  };
  auto note = [&](const std::string& text) { return engine_support_note(parse_layout(text), llama, 16); };
  // KV heads replicated over tp: valid (Megatron-LM does it), not in this engine.
  EXPECT_NO_THROW(check_layout(parse_layout("tp=4"), llama, 16));
  expect_contains(engine("tp=4"), {"layout tp=4 pp=1", "replicates model.n_kv_head = 2 KV heads", "tp values that work: 1, 2"});
  EXPECT_EQ(note("tp=4"), "engine: not yet supported: KV-head replication");
  // ZeRO-2/3 under a pipeline: valid, not in this engine.
  EXPECT_NO_THROW(check_layout(parse_layout("pp=2 zero=3"), llama, 16));
  expect_contains(engine("pp=2 zero=3"), {"zero=3 with pp=2", "use zero_stage 0 or 1"});
  EXPECT_EQ(note("pp=2 zero=2 cp=2"), "engine: not yet supported: ZeRO-2 with pp");
  EXPECT_EQ(note("dp=2 cp=4"), "");  // context parallelism runs
  // Uneven stages: the engine gives the first stages the extra layers (stage_layer_counts).
  ModelConfig three = llama;
  three.n_layer = 3;
  EXPECT_NO_THROW(check_layout(parse_layout("pp=2"), three, 16, LayoutRules::Engine));
  EXPECT_EQ(engine_support_note(parse_layout("pp=2"), three, 16), "");
  // Invalid at both levels.
  expect_contains(valid("tp=3"), {"model.n_head = 4 attention heads do not split over tp=3", "tp values that work: 1, 2, 4"});
  expect_contains(valid("pp=3"), {"pp x v = 3 stages", "model.n_layer = 2", "use pp x v <= 2"});
  expect_contains(valid("v=2"), {"needs pipeline parallelism"});
  expect_contains(valid("pp=2 interleaved"), {"schedule interleaved with v=1"});
  expect_contains(valid("sp"), {"sequence parallelism needs tp > 1"});
  expect_contains(valid("dp=2 ep=2"), {"mixture-of-experts"});
  expect_contains(valid("cp=3"), {"sequence 16 does not split into 2 x cp = 6", "multiple of 6 (12 or 18)"});
  EXPECT_EQ(layout_problems(parse_layout("tp=2 sp"), llama, 16).size(), 0u);
}

// The cases where the planner's and the trainer's rules used to disagree, and two more: the
// planner's note and the [parallel] table's error come from the same rule, with the same text.
TEST(ParallelLayout, PlannerAndParallelTableAgreeOnWhatTheEngineRuns) {
  TinyRun run("layout_agree");
  const std::string llama = run.config("llama", 4);  // batch_size 4, seq_len 16, grad_accum 2
  struct Case {
    std::string layout;
    std::vector<std::string> overrides;
    bool engine_runs;
  };
  const Case cases[] = {
      {"tp=4 pp=1 dp=1 zero=0 mbs=4 recompute=none", {}, false},                            // KV-head replication
      {"tp=1 pp=2 dp=1 zero=2 mbs=4 recompute=none 1f1b", {}, false},                       // ZeRO-2 with pp
      {"tp=1 pp=2 dp=1 zero=1 mbs=4 recompute=none 1f1b", {"model.n_layer=3"}, true},       // uneven stages
      {"tp=2 pp=2 dp=1 zero=1 mbs=4 recompute=selective sp 1f1b", {}, true},
      {"tp=1 pp=1 dp=2 cp=2 zero=1 mbs=4 recompute=none", {}, true},                        // context parallelism
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.layout);
    const ModelConfig model = parse(llama, c.overrides).model;
    const ParallelLayout layout = parse_layout(c.layout);
    EXPECT_EQ(engine_support_note(layout, model, 16).empty(), c.engine_runs);
    std::vector<std::string> with_layout = c.overrides;
    with_layout.push_back("parallel.layout=\"" + c.layout + "\"");
    if (c.engine_runs) {
      const TrainConfig config = parse(llama, with_layout);
      EXPECT_EQ(config.layout().describe(), layout.describe());
      continue;
    }
    const std::string planner = error_message([&] { check_layout(layout, model, 16, LayoutRules::Engine); });
    const std::string why = planner.substr(planner.find(": ") + 2);  // after "layout <describe>: "
    expect_contains(error_message([&] { (void)parse(llama, with_layout); }), {"parallel.layout", why});
  }
  // The same rules through the table's own keys, named by the key.
  const std::string planner = error_message([&] {
    check_layout(parse_layout("tp=4"), parse(llama, {}).model, 16, LayoutRules::Engine);
  });
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.tp=4"}); }),
                  {"config key 'parallel.tp' has value 4", planner.substr(planner.find(": ") + 2)});
}

TEST(ParallelLayout, ParallelTableTakesTheLayoutAsThePlannerPrintsIt) {
  TinyRun run("layout_table");
  const std::string gpt2 = run.config("gpt2", 4);
  const TrainConfig config =
      parse(gpt2, {"parallel.layout=\"tp=2 pp=2 dp=3 zero=1 mbs=4 recompute=selective sp 1f1b\"", "train.grad_accum=2"});
  EXPECT_EQ(config.tp, 2);
  EXPECT_EQ(config.pp, 2);
  EXPECT_EQ(config.dp, 3);
  EXPECT_EQ(config.zero_stage, 1);
  EXPECT_EQ(config.batch_size, 4);
  EXPECT_EQ(config.recompute, Recompute::Selective);
  EXPECT_TRUE(config.sequence_parallel);
  EXPECT_EQ(config.pp_schedule, PipelineSchedule::OneFOneB);
  // A key that agrees is fine; one that does not is an error naming both.
  EXPECT_EQ(parse(gpt2, {"parallel.layout=\"tp=2 mbs=4\"", "parallel.tp=2"}).tp, 2);
  expect_contains(error_message([&] { (void)parse(gpt2, {"parallel.layout=\"tp=2 mbs=4\"", "parallel.tp=4"}); }),
                  {"'parallel.layout' sets tp = 2", "'parallel.tp' is 4"});
  expect_contains(error_message([&] { (void)parse(gpt2, {"parallel.layout=\"tp=1 mbs=2\""}); }),
                  {"'parallel.layout' sets mbs = 2", "'train.batch_size' is 4"});
  expect_contains(error_message([&] { (void)parse(gpt2, {"parallel.layout=\"tp=2 bogus=1\""}); }),
                  {"'parallel.layout'", "unknown key 'bogus'"});
  // Ranks launched must match the layout's dp.
  expect_contains(error_message([&] { (void)parse(gpt2, {"parallel.dp=-1"}); }), {"'parallel.dp' has value -1"});
}

TEST(ParallelLayout, DeviceMeshIsCutFromTheLayoutAndReadsBothForms) {
  EXPECT_EQ(MeshShape::parse("dp=2 tp=2").to_string(), "pp=1,dp=2,cp=1,ep=1,tp=2");
  EXPECT_EQ(MeshShape::parse("pp=2, dp=2 tp = 2").to_string(), "pp=2,dp=2,cp=1,ep=1,tp=2");
  EXPECT_EQ(parse_layout("tp=2 pp=2 dp=4 zero=1").mesh_shape().to_string(), "pp=2,dp=4,cp=1,ep=1,tp=2");
  // Experts shard over data-parallel ranks: the mesh's dp axis is dp / ep.
  EXPECT_EQ(parse_layout("dp=8 ep=4").mesh_shape().to_string(), "pp=1,dp=2,cp=1,ep=4,tp=1");
  EXPECT_EQ(parse_layout("dp=8 ep=4").mesh_shape().product(), parse_layout("dp=8 ep=4").gpus());
  // Where ep divides only dp x cp, the mesh has no ep axis: the trainer cuts the dp x cp
  // replicas into consecutive groups of ep. An ep dividing neither has no mesh.
  EXPECT_TRUE(parse_layout("dp=2 cp=2 ep=4").ep_spans_cp());
  EXPECT_FALSE(parse_layout("dp=8 ep=4").ep_spans_cp());
  EXPECT_EQ(parse_layout("dp=2 cp=2 ep=4").mesh_shape().to_string(), "pp=1,dp=2,cp=2,ep=1,tp=1");
  expect_contains(error_message([] { (void)parse_layout("dp=2 cp=2 ep=3").mesh_shape(); }),
                  {"ep=3 divides neither dp=2 nor dp x cp=4"});
}

// parallel.backend: who carries the collectives (the choice itself needs a launch; its parsing
// and the refusals that need no launch are here).
TEST(ParallelLayout, BackendKeyTakesAutoMpiOrNcclAndRefusesNcclOnTheCpu) {
  TinyRun run("backend");
  const std::string gpt2 = run.config("gpt2", 4);
  EXPECT_EQ(parse(gpt2, {}).backend, CommBackend::Auto);
  EXPECT_EQ(parse(gpt2, {"parallel.backend=\"mpi\""}).backend, CommBackend::Mpi);
  expect_contains(error_message([&] { (void)parse(gpt2, {"parallel.backend=\"gloo\""}); }),
                  {"parallel.backend", "gloo", "auto, mpi or nccl"});
  expect_contains(error_message([&] { (void)parse(gpt2, {"parallel.backend=\"nccl\""}); }),
                  {"parallel.backend", "nccl", "train.device = \"cpu\""});
  // Pipelines run over NCCL too: their transfers travel on one-way channels that match in
  // order (parallel/pipeline_channels).
  EXPECT_EQ(parse(gpt2, {"parallel.backend=\"nccl\"", "train.device=\"cuda\"", "parallel.pp=2"}).backend,
            CommBackend::Nccl);
}

}  // namespace
}  // namespace loom::test
