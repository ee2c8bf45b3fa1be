// ZB-V through the trainer on 2 ranks, beyond the parity matrix of test_pipeline_training:
// `--print-schedule` draws every F, B and W of both chunks with ZB-V's textbook bubble (and
// DualPipeV's, whose ranks run different counts of actions); a
// checkpoint written by the V's stages (rank 0 holding the first and last) reads back in one
// process bit for bit; evaluation walks the V and gives one process's loss.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "dist_fixture.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom::test {
namespace {

// Four layers, one per stage of the V over 2 ranks; 4 micro-batches (= 2p).
TrainConfig zbv_config(const TinyRun& run, const std::string& arch, int64_t steps, int pp,
                       std::vector<std::string> extra) {
  std::vector<std::string> o = {
      "data.val=\"\"",        "optim.eps=1e-5",         "optim.lr=1e-3",
      "optim.grad_clip=0.05", "model.n_layer=4",        "train.grad_accum=4",
      "checkpoint.every=0",   "checkpoint.keep_last=0", "optim.warmup_steps=0"};
  if (pp > 1)
    o.insert(o.end(), {"parallel.pp=" + std::to_string(pp), "parallel.pp_chunks=2",
                       "parallel.pp_schedule=\"zbv\""});
  o.insert(o.end(), extra.begin(), extra.end());
  return parse(run.config(arch, steps), o);
}

// ZB-V runs one F, B and W per (micro-batch, chunk); DualPipeV whole backwards but for the
// split ones of its lists (p = 2, m = 4: I0c1, I2c0, I3c0 on rank 0, I3c1, I3c0 on rank 1), so
// its ranks time different counts of actions.
TEST(PipelineZbvPrint, DrawsEveryFBAndWOfBothChunks) {
  const auto world_group = world();
  if (world_group->size() != 2) GTEST_SKIP() << "the V of 4 one-layer stages over 2 ranks";
  for (const auto& [schedule, weights] :
       {std::pair<std::string, int64_t>{"zbv", 16}, {"dualpipev", 5}}) {
    SCOPED_TRACE(schedule);
    TinyRun run("pp_" + schedule + "_print");
    TrainConfig config = zbv_config(run, "gpt2", 2, 2,
                                    {"parallel.pp_schedule=\"" + schedule + "\"",
                                     "checkpoint.dir=\"\"", "log.dir=\"" + run.dir + "/log\""});
    config.print_schedule = true;
    Trainer trainer(config, world_group);
    trainer.run();
    if (world_group->rank() != 0) continue;
    std::ifstream in(run.dir + "/log/pipeline.svg");
    ASSERT_TRUE(in.good()) << "no pipeline.svg";
    const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto count = [&](const std::string& needle) {
      int64_t n = 0;
      for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1))
        ++n;
      return n;
    };
    // 2 ranks x 2 chunks x 4 micro-batches; textbook (p - 1) / 6m = 1 / 24 = 4.2%.
    EXPECT_EQ(count("class=\"span forward\""), 16);
    EXPECT_EQ(count("class=\"span backward\""), 16);
    EXPECT_EQ(count("class=\"span weight\""), weights);
    expect_contains(svg, {"textbook 4.2", "rank 1"});
  }
}

// Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2; whoever owns a tensor writes it once,
// and one process reads the whole model back to the bit.
TEST(PipelineZbvCheckpoint, StagesOfTheVLoadInOneProcess) {
  const auto world_group = world();
  if (world_group->size() != 2) GTEST_SKIP() << "the V of 4 one-layer stages over 2 ranks";
  const std::string root = shared_path("pp_zbv_ckpt");
  TinyRun run("pp_zbv_ckpt");
  for (const std::string arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    Trainer trainer(zbv_config(run, arch, 2, 2,
                               {"checkpoint.dir=\"" + root + "/" + arch + "\"",
                                "log.dir=\"" + run.dir + "/" + arch + "\""}),
                    world_group);
    trainer.run();
    world_group->barrier();
    Transformer whole(trainer.model().config());
    restore_weights(root + "/" + arch, whole);
    std::map<std::string, const Parameter*> whole_by_name;
    for (const Parameter* p : whole.parameters()) whole_by_name[p->name] = p;
    for (const Parameter* p : trainer.model().parameters()) {
      ASSERT_TRUE(whole_by_name.count(p->name)) << p->name;
      EXPECT_EQ(
          std::memcmp(whole_by_name.at(p->name)->value.f32(), p->value.f32(), p->value.nbytes()), 0)
          << p->name << " on rank " << world_group->rank();
    }
    world_group->barrier();
  }
  if (world_group->rank() == 0) std::filesystem::remove_all(root);
}

// Forward-only (evaluation) goes down the ranks and back up: one process's validation loss.
TEST(PipelineZbvEvaluation, ValidationLossEqualsOneProcess) {
  const auto world_group = world();
  if (world_group->size() != 2) GTEST_SKIP() << "the V of 4 one-layer stages over 2 ranks";
  TinyRun run("pp_zbv_eval");
  auto config = [&](int pp, const std::string& log) {
    return zbv_config(
        run, "gpt2", 3, pp,
        {"data.val=\"" + run.dir + "/data/tiny_val_*.bin\"", "eval.every=0", "eval.batches=3",
         "checkpoint.dir=\"\"", "log.dir=\"" + run.dir + "/" + log + "\""});
  };
  Trainer reference(config(1, "ref"));
  const TrainSummary expected = reference.run();
  Trainer pipelined(config(2, "pp"), world_group);
  const TrainSummary got = pipelined.run();
  ASSERT_TRUE(expected.last_val_loss && got.last_val_loss);
  EXPECT_NEAR(*got.last_val_loss, *expected.last_val_loss, 1e-5 * *expected.last_val_loss)
      << "rank " << world_group->rank();
}

// DualPipeV's pairs run as an overlapping executor runs them (parallel.pp_overlap: both inputs,
// the forward, the backward, both outputs) compute what its lists run in sequence compute, to
// the bit: every weight of both ranks after 3 steps, GPT-2 (the tied embedding's both ends on
// rank 0) and Llama with full recomputation. 8 micro-batches make 3 and 4 pairs a step per rank.
TEST(PipelineDualPipeVOverlap, PairsComputeWhatTheListInSequenceDoesBitForBit) {
  const auto world_group = world();
  if (world_group->size() != 2) GTEST_SKIP() << "the V of 4 one-layer stages over 2 ranks";
  for (const auto& [arch, recompute] :
       {std::pair<std::string, std::string>{"gpt2", "none"}, {"llama", "full"}}) {
    SCOPED_TRACE(arch);
    TinyRun run("pp_dualpipev_overlap_" + arch);
    std::map<std::string, std::vector<float>> weights[2];
    for (int overlap = 0; overlap < 2; ++overlap) {
      Trainer trainer(
          zbv_config(run, arch, 3, 2,
                     {"parallel.pp_schedule=\"dualpipev\"", "train.grad_accum=8",
                      "model.recompute=\"" + recompute + "\"",
                      std::string("parallel.pp_overlap=\"") + (overlap ? "on" : "off") + "\"",
                      "checkpoint.dir=\"\"",
                      "log.dir=\"" + run.dir + "/" + std::to_string(overlap) + "\""}),
          world_group);
      trainer.run();
      for (const Parameter* p : trainer.model().parameters())
        weights[overlap][p->name] = p->value.to_f32_vector();
    }
    ASSERT_FALSE(weights[0].empty());
    EXPECT_EQ(weights[0].size(), weights[1].size());
    for (const auto& [name, values] : weights[0]) {
      ASSERT_TRUE(weights[1].count(name)) << name;
      EXPECT_TRUE(values == weights[1].at(name)) << name << " on rank " << world_group->rank();
    }
  }
}

}  // namespace
}  // namespace loom::test
