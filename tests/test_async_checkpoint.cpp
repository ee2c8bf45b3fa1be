// Asynchronous checkpoints (checkpoint.async) through the trainer: the files equal the
// synchronous ones, training goes on while a slow write runs and the next save waits for it,
// partial directories a kill left are ignored and removed, and bad settings are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/trainer.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

namespace fs = std::filesystem;

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

// The metrics records of one kind, by step.
std::map<int64_t, nlohmann::json> records_of(const std::string& run_dir, const std::string& kind) {
  std::map<int64_t, nlohmann::json> out;
  for (const nlohmann::json& r : MetricsLog::read_all(run_dir + "/metrics.jsonl"))
    if (r.value("kind", "") == kind) out[r["step"].get<int64_t>()] = r;
  return out;
}

TEST(AsyncCheckpoint, WritesTheSameFilesAsSynchronousSaves) {
  TinyRun sync_run("ckpt_sync"), async_run("ckpt_async");
  Trainer sync_trainer(parse(sync_run.config("gpt2", 10), {"checkpoint.async=false"}));
  sync_trainer.run();
  Trainer async_trainer(parse(async_run.config("gpt2", 10), {"checkpoint.async=true"}));
  const TrainSummary summary = async_trainer.run();
  EXPECT_EQ(summary.last_checkpoint, async_run.dir + "/ckpt/step_00000010");
  for (const char* step : {"step_00000005", "step_00000010"})
    for (const char* file :
         {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "manifest.json"}) {
      const std::string sync_path = sync_run.dir + "/ckpt/" + step + "/" + file;
      const std::string async_path = async_run.dir + "/ckpt/" + step + "/" + file;
      EXPECT_EQ(read_file_bytes(sync_path), read_file_bytes(async_path)) << async_path;  // bitwise
    }
  EXPECT_EQ(records_of(async_run.dir + "/run", "checkpoint").at(5)["async"], true);
  EXPECT_EQ(records_of(sync_run.dir + "/run", "checkpoint").at(5)["async"], false);
}

// debug.slow_checkpoint_write_ms = 3000 makes every write take at least 3 s. Saves at steps 3
// and 6 of 6. Async: the steps after the step-3 save run while its write sleeps (all three when
// a step takes under 1 s, as it does here even on a loaded machine; at least the first), and
// if the write still runs when step 6 is saved, that save waits for it. Sync: every save
// blocks training for the full 3 s.
TEST(AsyncCheckpoint, TrainingGoesOnDuringASlowWriteAndTheNextSaveWaits) {
  constexpr double kSlowMs = 3000;
  const std::vector<std::string> slow = {
      "checkpoint.every=3", "eval.every=0",
      "debug.slow_checkpoint_write_ms=" + std::to_string(kSlowMs)};
  TinyRun async_run("ckpt_slow_async"), sync_run("ckpt_slow_sync");
  std::vector<std::string> async_keys = slow, sync_keys = slow;
  async_keys.push_back("checkpoint.async=true");
  sync_keys.push_back("checkpoint.async=false");
  Trainer(parse(async_run.config("gpt2", 6), async_keys)).run();
  Trainer(parse(sync_run.config("gpt2", 6), sync_keys)).run();

  const auto saves = records_of(async_run.dir + "/run", "checkpoint");
  const auto written = records_of(async_run.dir + "/run", "checkpoint_written");
  ASSERT_EQ(saves.size(), 2u);
  ASSERT_EQ(written.size(), 2u);
  EXPECT_LT(saves.at(3)["blocked_ms"].get<double>(), kSlowMs / 2);  // a snapshot, not the write
  EXPECT_LT(saves.at(3)["waited_ms"].get<double>(), 50.0);          // no write was in flight
  const int64_t during = written.at(3)["steps_during_write"].get<int64_t>();
  EXPECT_GE(during, 1) << written.at(3);  // training went on during the write
  EXPECT_LE(during, 3);
  EXPECT_GE(written.at(3)["write_ms"].get<double>(), kSlowMs);
  if (during == 3) {  // the write outlasted step 6: its save waited
    EXPECT_GT(saves.at(6)["waited_ms"].get<double>(), 0.0);
  }
  EXPECT_GE(saves.at(6)["blocked_ms"].get<double>(), saves.at(6)["waited_ms"].get<double>());
  EXPECT_GT(written.at(3)["bytes"].get<uint64_t>(), 0u);
  EXPECT_TRUE(
      fs::exists(async_run.dir + "/ckpt/step_00000006/manifest.json"));  // the end committed it

  for (const auto& [step, record] : records_of(sync_run.dir + "/run", "checkpoint"))
    EXPECT_GE(record["blocked_ms"].get<double>(), kSlowMs) << "step " << step;
}

TEST(AsyncCheckpoint, PartialDirectoriesAreIgnoredAndRemovedOnStart) {
  TinyRun run("ckpt_partial");
  Trainer(parse(run.config("gpt2", 5))).run();  // step_00000005 complete
  // What a kill mid-save leaves: a temp directory, and a step directory without a manifest.
  const std::string root = run.dir + "/ckpt";
  fs::create_directories(root + "/step_00000010.tmp-4242");
  write_text_file(root + "/step_00000010.tmp-4242/shard-00000-of-00001.safetensors", "half a file");
  fs::create_directories(root + "/step_00000009");
  write_text_file(root + "/step_00000009/model.safetensors", "no manifest");
  EXPECT_EQ(latest_checkpoint(root), root + "/step_00000005");  // neither is ever loaded

  Trainer resumed(parse(run.config("gpt2", 7)));
  const TrainSummary summary = resumed.run();
  EXPECT_EQ(summary.first_step, 5);
  EXPECT_FALSE(fs::exists(root + "/step_00000010.tmp-4242"));
  EXPECT_FALSE(fs::exists(root + "/step_00000009"));
  EXPECT_TRUE(fs::exists(root + "/step_00000007/manifest.json"));
}

TEST(AsyncCheckpoint, BadSettingsAreRefusedNamingTheKey) {
  TinyRun run("ckpt_bad");
  expect_contains(
      error_message([&] { parse(run.config("gpt2", 10), {"checkpoint.commit_timeout_s=0"}); }),
      {"config key 'checkpoint.commit_timeout_s' has value 0, expected seconds in (0, 1e6]"});
  // Checkpoints are saved at steps 5 and 10 (checkpoint.every = 5): step 7 saves none.
  expect_contains(
      error_message([&] { parse(run.config("gpt2", 10), {"debug.kill_in_checkpoint_write=7"}); }),
      {"config key 'debug.kill_in_checkpoint_write' is 7, a step that saves no checkpoint: "
       "expected a "
       "multiple of checkpoint.every = 5 or train.steps = 10"});
  expect_contains(
      error_message([&] { parse(run.config("gpt2", 10), {"debug.slow_checkpoint_write_ms=-1"}); }),
      {"debug.slow_checkpoint_write_ms"});
}

}  // namespace
}  // namespace loom::test
