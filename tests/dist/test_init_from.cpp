// train.init_from on other layouts: a Hugging Face model directory written once, loaded by
// tp x pp, ZeRO-3 and dp x tp runs, which then train on the losses of one process that loaded
// the same directory (first step 1e-6, every step 1e-5). GPT-2's tied embedding has a copy on
// the last pipeline stage, which must be loaded too.
#include <gtest/gtest.h>

#include <sstream>

#include "dist_fixture.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/hf_weights.hpp"
#include "loom/ckpt/safetensors.hpp"

namespace loom::test {
namespace {

struct Layout {
  std::string arch, keys;
  int64_t dp;  // data-parallel replicas at 4 ranks: each takes kGlobalBatch / dp sequences
};

class InitFromLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(InitFromLayouts, TrainOnTheLossesOfOneProcess) {
  const auto world_group = world();
  if (world_group->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int rank = world_group->rank();
  const Layout& layout = GetParam();
  TinyRun run("init_from_dist");
  const std::string hf_dir = shared_path("init_from_hf");
  const std::vector<std::string> shared = {"data.val=\"\"", "checkpoint.dir=\"\"", "model.n_layer=4",
                                           "train.grad_accum=4", "optim.lr=1e-3", "train.init_from=\"" + hf_dir + "\""};
  run.write_learnable_shards();
  if (rank == 0) {
    // A "pretrained" model: trained on the learnable shards (ln 64 = 4.16 -> about 1.3 nats).
    Trainer pretraining(parse(run.config(layout.arch, kLearnableSteps),
                              {"model.n_layer=4", kLearnableLr, "checkpoint.dir=\"\"", "data.val=\"\"",
                               "log.dir=\"" + run.dir + "/pretraining\""}));
    pretraining.run();
    const Transformer& source = pretraining.model();
    std::filesystem::create_directories(hf_dir);
    write_safetensors(hf_dir + "/model.safetensors", export_hf_weights(source.parameters(), DType::F32), {{"format", "pt"}});
    write_text_file(hf_dir + "/config.json", hf_config_json(source.config()).dump());
  }
  world_group->barrier();
  std::vector<std::string> parallel = plus(
      {"log.dir=\"" + run.dir + "/parallel\"", "train.batch_size=" + std::to_string(kGlobalBatch / layout.dp)}, shared);
  std::stringstream keys(layout.keys);
  for (std::string key; keys >> key;) parallel.push_back(key);
  Trainer parallel_run(parse(run.config(layout.arch, kSteps), parallel), world_group);
  parallel_run.run();
  const std::string reference_dir = run.dir + "/reference" + std::to_string(rank);
  Trainer reference(parse(run.config(layout.arch, kSteps),
                          plus({"log.dir=\"" + reference_dir + "\"", "train.batch_size=" + std::to_string(kGlobalBatch)}, shared)));
  reference.run();
  if (rank == 0) {
    expect_losses_follow(reference_dir + "/metrics.jsonl", run.dir + "/parallel/metrics.jsonl");
    EXPECT_LT(losses_of(run.dir + "/parallel/metrics.jsonl").front(), 2.5) << "started from the pretrained weights";
  }
  world_group->barrier();
  if (rank == 0) std::filesystem::remove_all(hf_dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, InitFromLayouts,
                         ::testing::Values(Layout{"gpt2", "parallel.tp=2 parallel.pp=2", 1},
                                           Layout{"gpt2", "parallel.zero_stage=3", 4},
                                           Layout{"llama", "parallel.tp=2 parallel.zero_stage=1", 2},
                                           Layout{"llama", "parallel.pp=2 parallel.tp=2 parallel.sequence_parallel=true", 1}));

}  // namespace
}  // namespace loom::test
