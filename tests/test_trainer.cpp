// The training loop end to end on tiny models: loss goes down, metrics and plots are written,
// and an interrupted run resumed from its checkpoint ends with bitwise the same weights.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <tuple>

#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/ckpt/safetensors.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/train/trainer.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

std::vector<std::vector<float>> weights_of(Trainer& trainer) {
  std::vector<std::vector<float>> out;
  for (const Parameter* p : trainer.model().parameters()) out.push_back(p->value.to_f32_vector());
  return out;
}

class TrainerArch : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerArch, ExactResumeGivesBitwiseIdenticalWeights) {
  TinyRun straight_run("straight"), resumed_run("resumed");
  Trainer straight(parse(straight_run.config(GetParam(), 20)));
  const TrainSummary s = straight.run();
  EXPECT_EQ(s.steps_done, 20);

  // Stop after 10 steps with the 20-step schedule (as a job killed at step 10 would), then
  // let a fresh trainer resume from the step-10 checkpoint.
  TrainConfig half = parse(resumed_run.config(GetParam(), 20));
  half.steps = 10;  // schedule.total_steps stays 20
  Trainer first(half);
  EXPECT_EQ(first.run().steps_done, 10);
  Trainer second(parse(resumed_run.config(GetParam(), 20)));
  const TrainSummary r = second.run();
  EXPECT_EQ(r.first_step, 10);
  EXPECT_EQ(r.steps_done, 20);
  EXPECT_EQ(weights_of(straight), weights_of(second));  // bitwise
  EXPECT_EQ(s.last_val_loss, r.last_val_loss);
}

INSTANTIATE_TEST_SUITE_P(Archs, TrainerArch, ::testing::Values("gpt2", "llama"));

TEST(Trainer, LearnsAndWritesMetricsAndPlot) {
  TinyRun run("learns");
  // A repeating pattern is learnable: the loss must fall far below log(vocab).
  std::vector<int32_t> pattern;
  for (int i = 0; i < 6000; ++i) pattern.push_back((i * 7) % 64);
  write_token_shard(run.dir + "/data/tiny_train_000000.bin", pattern);
  write_token_shard(run.dir + "/data/tiny_train_000001.bin", pattern);
  Trainer trainer(parse(run.config("gpt2", 60), {"checkpoint.dir=\"\"", "optim.lr=1e-2"}));
  const TrainSummary s = trainer.run();
  EXPECT_LT(s.last_train_loss, 0.5);  // log(64) = 4.16 at the start
  const auto records = MetricsLog::read_all(run.dir + "/run/metrics.jsonl");
  int train_lines = 0, val_lines = 0;
  for (const auto& r : records) (r["kind"] == "train" ? train_lines : val_lines)++;
  EXPECT_EQ(train_lines, 60);
  EXPECT_EQ(val_lines, 12);
  std::ifstream svg(run.dir + "/run/loss.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
}

// bf16 mixed precision against f32, both trained on a stream with something to learn
// (markov_tokens: ln 64 = 4.16 nats per token at initialisation, ln 2 = 0.69 once the successor
// table is learnt); kLearnableSteps = 30 steps at lr 1e-2 take f32 to about 1.2-1.4 nats.
//
// Tolerance, from bf16's precision. bf16 keeps 8 significant bits, so rounding to nearest moves a
// value by at most 2^-8 relative (bottom of a binade) and 2^-9 at the top; over a binade the
// RMS is 0.42 * 2^-8, about 2^-9. From token to loss the bf16 model rounds K = 5 + 14 n_layer
// values in series (33 here): the embedding output and the final norm output, 8 activations per
// block (norm, q|k|v, attention output, residual, norm, MLP pre-activation, activation,
// residual) and the weights met on the way (embedding, final norm, head, and 6 per block: two
// norms, q|k|v, the attention projection and the MLP's two layers). Independent roundings add
// as a random walk, so the logits carry a relative error rho = sqrt(K) * 2^-9 = 1.1e-2. At step
// s that costs the forward about rho * L_s (cross-entropy is of the order of the logits'
// spread), and every update, computed from gradients off by ~rho, travels its share of the drop
// L_0 - L_s off by ~rho: |L_bf16(s) - L_f32(s)| <= rho * (L_s + (L_0 - L_s)) = rho * ln V, 0.047
// nats at every step. The worst case, K * 2^-8 * ln V = 0.54 nats, would let through a run
// that learnt a fifth less. Measured: at most 0.002 nats over the 30 steps (GPT-2 and Llama),
// while f32 at 0.9x the learning rate leaves the band from step 7 on and ends 0.14 nats away;
// the test checks that control too, so the band can fail.
double bf16_loss_band(const ModelConfig& model) {
  const double roundings_in_series = 5.0 + 14.0 * static_cast<double>(model.n_layer);
  const double rho = std::sqrt(roundings_in_series) * std::ldexp(1.0, -9);
  return rho * std::log(static_cast<double>(model.vocab_size));
}

// The first step whose loss leaves `band` around `want`'s, or 0 when none does.
int64_t first_step_outside(const std::vector<double>& want, const std::vector<double>& got,
                           double band) {
  for (size_t s = 0; s < want.size() && s < got.size(); ++s)
    if (std::fabs(got[s] - want[s]) > band) return static_cast<int64_t>(s) + 1;
  return 0;
}

class TrainerBf16 : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerBf16, LearnsTracksF32AndKeepsFp32MasterWeights) {
  TinyRun run("bf16_" + GetParam());
  run.write_learnable_shards();
  const std::string base = run.config(GetParam(), kLearnableSteps);
  auto trained = [&](const std::string& name, std::vector<std::string> overrides) {
    overrides.push_back("log.dir=\"" + run.dir + "/" + name + "\"");
    auto trainer = std::make_unique<Trainer>(parse(base, overrides));
    const TrainSummary summary = trainer->run();
    return std::make_tuple(std::move(trainer), summary,
                           losses_of(run.dir + "/" + name + "/metrics.jsonl"));
  };
  const auto [f32, f32_summary, f32_losses] = trained("f32", {"checkpoint.dir=\"\"", kLearnableLr});
  const auto [bf16, bf16_summary, bf16_losses] =
      trained("bf16", {kLearnableLr, "train.precision=\"bf16\"",
                       "checkpoint.every=" + std::to_string(kLearnableSteps)});
  const auto [slower, slower_summary, slower_losses] =
      trained("f32_slower", {"checkpoint.dir=\"\"", "optim.lr=9e-3"});  // 0.9 x kLearnableLr
  ASSERT_EQ(f32_losses.size(), static_cast<size_t>(kLearnableSteps));
  ASSERT_EQ(bf16_losses.size(), f32_losses.size());
  ASSERT_EQ(slower_losses.size(), f32_losses.size());

  // (a) bf16 learns: from ln V = 4.16 to well under half of it (f32 and bf16 reach ~1.2-1.4).
  const double initial_loss = std::log(static_cast<double>(f32->model().config().vocab_size));
  EXPECT_NEAR(bf16_losses.front(), initial_loss, 0.05 * initial_loss);
  EXPECT_LT(bf16_summary.last_train_loss, 0.45 * initial_loss);

  // (b) bf16 tracks f32 at every step and on the validation set, inside the precision band; a
  // 10% slower f32 run does not, so the band is narrow enough to see a real difference.
  const double band = bf16_loss_band(f32->model().config());
  EXPECT_EQ(first_step_outside(f32_losses, bf16_losses, band), 0) << "band " << band << " nats";
  ASSERT_TRUE(f32_summary.last_val_loss && bf16_summary.last_val_loss);
  EXPECT_NEAR(*bf16_summary.last_val_loss, *f32_summary.last_val_loss, band);
  EXPECT_GT(first_step_outside(f32_losses, slower_losses, band), 0) << "band " << band << " nats";

  // The fp32 masters (the checkpoint's optimizer state) exist, hold more than bf16 can (their
  // low 16 bits are not all zero), and rounding each to bf16 gives the model's value exactly.
  ASSERT_FALSE(bf16_summary.last_checkpoint.empty());
  const SafetensorsFile state =
      read_safetensors(bf16_summary.last_checkpoint + "/" + ckpt_files::kOptimizerFile);
  int64_t elements = 0, beyond_bf16 = 0;
  for (const Parameter* p : bf16->model().parameters()) {
    const std::vector<float> master =
        tensor_from_entry(state.at(p->name + ".master"), MemCategory::Workspace).to_f32_vector();
    const std::vector<float> model = p->value.to_f32_vector();
    ASSERT_EQ(master.size(), model.size()) << p->name;
    for (size_t k = 0; k < model.size(); ++k) {
      ASSERT_EQ(model[k], round_to_bf16(model[k]))
          << p->name << "[" << k << "] is not a bf16 value";
      ASSERT_EQ(round_to_bf16(master[k]), model[k])
          << p->name << "[" << k << "]: master " << master[k];
      beyond_bf16 += master[k] != round_to_bf16(master[k]);
    }
    elements += static_cast<int64_t>(model.size());
  }
  // An f32 master (random init, then updates) lands on a bf16 value by chance only, 1 in 2^16
  // per element; bf16-valued masters would be 100% here.
  EXPECT_GT(beyond_bf16, elements - elements / 100)
      << beyond_bf16 << " of " << elements << " masters";
}

INSTANTIATE_TEST_SUITE_P(Archs, TrainerBf16, ::testing::Values("gpt2", "llama"));

// Bad tensor-parallel layouts are refused when the config is read, before any work, with the
// values that would work.
// Packed documents through the config: documents of the repeating pattern separated by an end
// token train with data.document_mask (the loss falls well below ln 64), the trainer's model
// has the mask, and a missing end token or the GPU are refused before any work.
TEST(Trainer, PackedDocumentsTrainWithTheDocumentMask) {
  TinyRun run("packed");
  std::vector<int32_t> documents;
  for (int i = 0; i < 6000; ++i) documents.push_back(i % 13 == 12 ? 63 : (i * 7) % 61);  // 13 tokens each
  write_token_shard(run.dir + "/data/tiny_train_000000.bin", documents);
  write_token_shard(run.dir + "/data/tiny_train_000001.bin", documents);
  write_token_shard(run.dir + "/data/tiny_val_000000.bin", documents);
  const std::string base = run.config("llama", 60);  // seq_len 16
  Trainer trainer(parse(base, {"checkpoint.dir=\"\"", "optim.lr=1e-2", "data.document_mask=true",
                               "data.eot_token=63"}));
  EXPECT_EQ(trainer.model().document_mask_token(), 63);
  EXPECT_LT(trainer.run().last_train_loss, 1.0);
  // A document longer than the sequence is refused before any work, with where it is and what
  // works: here the second shard's 20-token document starting at token 26.
  std::vector<int32_t> long_document = documents;
  for (int i = 26; i < 46; ++i) long_document[static_cast<size_t>(i)] = i == 45 ? 63 : (i * 7) % 61;
  write_token_shard(run.dir + "/data/tiny_train_000001.bin", long_document);
  const std::vector<std::string> masked = {"checkpoint.dir=\"\"", "data.document_mask=true", "data.eot_token=63"};
  expect_contains(error_message([&] { Trainer refused(parse(base, masked)); }),
                  {"data.train", "tiny_train_000001.bin", "20 tokens", "from token 26", "data.seq_len = 16",
                   "at least 20", "data.split_long_documents = true"});
  std::vector<std::string> split = masked;
  split.push_back("data.split_long_documents=true");
  Trainer pieces(parse(base, split));
  EXPECT_TRUE(std::isfinite(pieces.run().last_train_loss));
  // The last document of a shard needs no end token, and the check reads the validation shards.
  write_token_shard(run.dir + "/data/tiny_train_000001.bin", documents);
  std::vector<int32_t> open_end = documents;
  open_end.resize(5990);
  for (int i = 0; i < 17; ++i) open_end.push_back(1);
  write_token_shard(run.dir + "/data/tiny_val_000000.bin", open_end);
  expect_contains(error_message([&] { Trainer refused(parse(base, masked)); }),
                  {"data.val", "tiny_val_000000.bin", "27 tokens", "from token 5980"});
  expect_contains(error_message([&] { (void)parse(base, {"data.split_long_documents=true"}); }),
                  {"data.split_long_documents", "without data.document_mask"});
  expect_contains(error_message([&] { (void)parse(base, {"data.document_mask=true"}); }),
                  {"data.eot_token", "50256", "[0, 64)"});
  EXPECT_EQ(parse(base, {"data.eot_token=70"}).document_mask, false);  // unused without the mask
  expect_contains(error_message([&] { (void)parse(base, {"data.document_positions=true"}); }),
                  {"data.document_positions", "without data.document_mask"});
  EXPECT_TRUE(parse(base, {"data.document_mask=true", "data.eot_token=63", "data.document_positions=true"})
                  .document_positions);
  // Packed documents run on CUDA as well (the ranged attention kernels): the config is accepted.
  EXPECT_TRUE(parse(base, {"data.document_mask=true", "data.eot_token=63", "train.device=\"cuda\""})
                  .document_mask);
}

// A mixture-of-experts Llama through the config: it learns the markov stream (well under
// ln 64 = 4.16; kLearnableSteps take a dense model to about 1.2-1.4 nats), logs its experts'
// metrics, and the sigmoid router's selection bias moves with the loads; GPT-2-style experts,
// and a bias rate for the softmax router are refused before any work.
TEST(Trainer, MixtureOfExpertsLearnsLogsAndBalances) {
  TinyRun run("moe");
  run.write_learnable_shards();
  const std::string base = run.config("llama", kLearnableSteps);
  const std::vector<std::string> moe = {"checkpoint.dir=\"\"", kLearnableLr, "model.n_experts=4",
                                        "model.experts_per_token=2", "model.moe_z_loss_coef=0.001"};
  auto with_moe = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), moe.begin(), moe.end());
    return extra;
  };
  Trainer trainer(parse(base, moe));
  EXPECT_LT(trainer.run().last_train_loss, 2.0);
  const auto records = MetricsLog::read_all(run.dir + "/run/metrics.jsonl");
  int moe_lines = 0;
  for (const auto& r : records) {
    if (r["kind"] != "train") continue;
    ++moe_lines;
    // Balanced routing gives aux = k = 2 (every f_i = k / E, P_i = 1 / E); any routing gives >= 0.
    EXPECT_GT(r["moe_aux_loss"].get<double>(), 0.0);
    EXPECT_GE(r["moe_load_max_over_mean"].get<double>(), 1.0);
    EXPECT_EQ(r["moe_dropped_fraction"].get<double>(), 0.0);  // dropless
  }
  EXPECT_EQ(moe_lines, kLearnableSteps);

  std::vector<std::string> sigmoid = moe;
  sigmoid.insert(sigmoid.end(), {"model.moe_router=\"sigmoid\"", "model.moe_bias_rate=0.01", "train.steps=3",
                                 "log.dir=\"" + run.dir + "/sigmoid\""});
  Trainer balanced(parse(base, sigmoid));
  balanced.run();
  // Each step moves every bias by -0.01, 0 or +0.01: after 3 steps a multiple of 0.01 in
  // [-0.03, 0.03], and some expert was off the mean load.
  double moved = 0;
  for (const auto& block : balanced.model().blocks)
    for (float b : block->moe->bias()) {
      EXPECT_LE(std::fabs(b), 0.03f + 1e-6f);
      EXPECT_NEAR(b * 100.0f, std::round(b * 100.0f), 1e-4);
      moved = std::max(moved, static_cast<double>(std::fabs(b)));
    }
  EXPECT_GT(moved, 0.0);

  // The biases are checkpointed: a run resumed at step 2 ends step 4 with the biases of the run
  // that went through.
  std::vector<std::string> saved = sigmoid;
  saved.erase(std::remove(saved.begin(), saved.end(), std::string("checkpoint.dir=\"\"")), saved.end());
  saved.insert(saved.end(), {"train.steps=4", "checkpoint.every=2", "checkpoint.dir=\"" + run.dir + "/moe_ckpt\"",
                             "log.dir=\"" + run.dir + "/through\""});
  Trainer through(parse(base, saved));
  through.run();
  std::filesystem::create_directories(run.dir + "/moe_half");
  for (const auto& dir : ckpt_files::list_step_dirs(run.dir + "/moe_ckpt"))
    if (dir.step == 2)
      std::filesystem::copy(dir.path, run.dir + "/moe_half/" + dir.path.filename().string(),
                            std::filesystem::copy_options::recursive);
  saved.insert(saved.end(), {"checkpoint.dir=\"" + run.dir + "/moe_half\"", "checkpoint.resume=true",
                             "log.dir=\"" + run.dir + "/resumed\""});
  Trainer resumed(parse(base, saved));
  resumed.run();
  EXPECT_EQ(resumed.model().moe_biases(), through.model().moe_biases());
  EXPECT_NE(resumed.model().moe_biases(), std::vector<float>(resumed.model().moe_biases().size(), 0.0f));

  expect_contains(error_message([&] { (void)parse(run.config("gpt2", 4), {"model.n_experts=4", "model.experts_per_token=2"}); }),
                  {"model.n_experts = 4", "Llama-style"});
  expect_contains(error_message([&] { (void)parse(base, with_moe({"model.moe_bias_rate=0.01"})); }),
                  {"model.moe_bias_rate", "sigmoid router"});
  // MoE layers run on CUDA (routing on the host, rows on the device), with ep too.
  EXPECT_EQ(parse(base, with_moe({"train.device=\"cuda\""})).model.n_experts, 4);
  EXPECT_EQ(parse(base, with_moe({"train.device=\"cuda\"", "parallel.ep=2"})).ep, 2);
  expect_contains(error_message([&] { (void)parse(base, with_moe({"model.moe_router=\"topk\""})); }),
                  {"model.moe_router", "'topk'", "softmax", "sigmoid"});
  expect_contains(error_message([&] { (void)parse(base, with_moe({"model.experts_per_token=5"})); }),
                  {"model.experts_per_token: got 5", "1 to model.n_experts = 4"});
  expect_contains(error_message([&] { (void)parse(base, with_moe({"model.moe_capacity_factor=-1"})); }),
                  {"model.moe_capacity_factor: got -1", "0 (dropless"});
  // Expert parallelism: before any rank is launched or anything built.
  expect_contains(error_message([&] { (void)parse(base, with_moe({"parallel.ep=3"})); }),
                  {"parallel.ep", "4 experts do not split over ep=3"});
  expect_contains(error_message([&] { (void)parse(base, with_moe({"parallel.ep=2", "parallel.dp=3"})); }),
                  {"parallel.ep", "ep=2 does not divide dp x cp = 3"});
  // ZeRO-3 with ep, and ep over context-parallel ranks (ep dividing dp x cp but not dp), parse
  // (their training is checked under mpirun, tests/dist/test_moe_training.cpp).
  EXPECT_EQ(
      parse(base, with_moe({"parallel.ep=2", "parallel.dp=2", "parallel.zero_stage=3"})).zero_stage,
      3);
  EXPECT_EQ(parse(base, with_moe({"parallel.ep=2", "parallel.cp=2", "parallel.dp=1"})).ep, 2);
  expect_contains(error_message([&] { (void)parse(base, {"parallel.ep=2"}); }),
                  {"parallel.ep", "needs a mixture-of-experts model"});
  expect_contains(error_message([&] { Trainer one(parse(base, with_moe({"parallel.ep=2"}))); }),
                  {"parallel.ep = 2", "mpirun -np 2"});
}

TEST(TrainConfigTensorParallel, BadLayoutsAreRejectedWithWhatWorks) {
  TinyRun run("tp_config");
  const std::string llama = run.config("llama", 4);  // 4 heads, 2 kv heads, ffn 48
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.tp=4"}); }),
                  {"parallel.tp", "4", "model.n_kv_head = 2", "tp values that work: 1, 2"});
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.tp=0"}); }), {"parallel.tp", "expected >= 1"});
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.sequence_parallel=true"}); }),
                  {"parallel.sequence_parallel", "needs tp > 1"});
  // A micro-batch of 3 x 15 = 45 rows does not split over 2 sequence-parallel ranks.
  expect_contains(error_message([&] {
                    (void)parse(llama, {"parallel.tp=2", "parallel.sequence_parallel=true", "train.batch_size=3",
                                        "train.seq_len=15"});
                  }),
                  {"parallel.sequence_parallel", "= 45 rows", "parallel.tp = 2"});
  const TrainConfig ok = parse(llama, {"parallel.tp=2", "parallel.sequence_parallel=true"});
  EXPECT_EQ(ok.tp, 2);
  EXPECT_TRUE(ok.sequence_parallel);
  // One process cannot be two tp ranks: the trainer says how to launch.
  expect_contains(error_message([&] { Trainer trainer(ok); }), {"parallel.tp = 2", "mpirun -np 2"});
}

// parallel.cp: sequences that do not split into 2 x cp chunks, Ulysses with heads that do not
// go round, an unknown cp_comm, cp on CUDA, and cp without a launcher are refused before any
// work, saying what would work.
TEST(TrainConfigContextParallel, BadLayoutsAreRejectedWithWhatWorks) {
  TinyRun run("cp_config");
  const std::string llama = run.config("llama", 4);  // seq_len 16, 4 heads, 2 kv heads
  const TrainConfig ok = parse(llama, {"parallel.cp=4", "parallel.cp_comm=\"allgather\""});
  EXPECT_EQ(ok.cp, 4);
  EXPECT_EQ(ok.cp_comm, CpComm::AllGather);
  EXPECT_EQ(parse(llama, {"parallel.cp=2"}).cp_comm, CpComm::P2P);  // ring attention by default
  EXPECT_EQ(parse(llama, {"parallel.layout=\"cp=2 mbs=4\""}).cp, 2);
  // 16 tokens do not cut into 2 x 3 = 6 equal chunks; 12 or 18 would.
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.cp=3"}); }),
                  {"config key 'parallel.cp' has value 3", "sequence 16 does not split into 2 x cp = 6",
                   "multiple of 6 (12 or 18)"});
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.cp=0"}); }), {"parallel.cp", "expected >= 1"});
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.cp_comm=\"ring\""}); }),
                  {"parallel.cp_comm", "'ring'", "p2p", "allgather", "a2a"});
  EXPECT_EQ(parse(llama, {"parallel.cp=2", "parallel.cp_comm=\"a2a\""}).cp_comm, CpComm::AllToAll);
  // Ulysses splits each rank's heads over cp: 2 kv heads do not split over 4.
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.cp=4", "parallel.cp_comm=\"a2a\""}); }),
                  {"config key 'parallel.cp_comm' has value a2a", "each tp rank's 4 attention heads and 2 kv heads",
                   "do not split over cp=4", "use cp_comm=p2p or allgather, or a cp in 2"});
  // The same rule through the layout key, which names cp_comm too (the planner's rule).
  const TrainConfig ulysses = parse(llama, {"parallel.layout=\"cp=2 cp_comm=a2a mbs=4\""});
  EXPECT_EQ(ulysses.cp_comm, CpComm::AllToAll);
  EXPECT_EQ(ulysses.layout().describe(), "tp=1 pp=1 dp=1 cp=2 cp_comm=a2a zero=0 mbs=4 recompute=none");
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.layout=\"cp=4 cp_comm=a2a\""}); }),
                  {"config key 'parallel.layout' sets cp_comm = a2a", "do not split over cp=4"});
  expect_contains(error_message([&] {
                    (void)parse(llama, {"parallel.layout=\"cp=2 cp_comm=a2a\"", "parallel.cp_comm=\"p2p\""});
                  }),
                  {"sets cp_comm = a2a but config key 'parallel.cp_comm' is p2p"});
  // With sequence parallelism a cp rank's rows split over tp: 1 x 12 / 2 = 6 rows over tp 4 do not.
  expect_contains(error_message([&] {
                    (void)parse(run.config("gpt2", 4), {"parallel.cp=2", "parallel.tp=4", "parallel.sequence_parallel=true",
                                                        "train.batch_size=1", "train.seq_len=12"});
                  }),
                  {"parallel.sequence_parallel", "/ parallel.cp = 6 rows", "parallel.tp = 4"});
  // Every way of attending over the split sequence runs on CUDA too: the configs are accepted.
  for (const char* comm : {"p2p", "allgather", "a2a"})
    EXPECT_EQ(parse(llama, {"parallel.cp=2", std::string("parallel.cp_comm=\"") + comm + "\"",
                            "train.device=\"cuda\""})
                  .cp,
              2)
        << comm;
  // One process cannot be two cp ranks.
  expect_contains(error_message([&] { Trainer trainer(parse(llama, {"parallel.cp=2"})); }),
                  {"parallel.tp = 1, parallel.pp = 1 and parallel.cp = 2 need 2 ranks", "mpirun -np 2"});
}

// The load-balanced split, by hand: 16 tokens in 2 x 2 chunks of 4; rank 0 holds chunks 0 and
// 3, rank 1 chunks 1 and 2. Key ranges map to a rank's block rows.
TEST(ContextSplit, EachRankHoldsChunksRAndTwoCMinusOneMinusR) {
  const ContextSplit r0{0, 2}, r1{1, 2};
  std::vector<int64_t> p0, p1;
  for (int64_t t = 0; t < 8; ++t) {
    p0.push_back(r0.global_position(t, 16));
    p1.push_back(r1.global_position(t, 16));
  }
  EXPECT_EQ(p0, (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(p1, (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  // Keys [2, 13) on rank 0's block (positions 0-3, 12-15) are its rows [2, 5); on rank 1's
  // block (4-11), all 8 rows.
  EXPECT_EQ(r0.rows_below(2, 16, 0), 2);
  EXPECT_EQ(r0.rows_below(13, 16, 0), 5);
  EXPECT_EQ(r0.rows_below(2, 16, 1), 0);
  EXPECT_EQ(r0.rows_below(13, 16, 1), 8);
  const std::vector<int32_t> tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<int32_t> mine(8);
  r1.take_local(tokens.data(), mine.data(), 1, 16);
  EXPECT_EQ(mine, (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  expect_contains(error_message([&] { r0.check(10); }), {"sequence length 10", "2 x cp = 4", "8 or 12"});
}

// [[data.sources]] through the config and the trainer: two corpora at weights 3 : 1 (ids below
// 32 and ids from 32 up, so every sequence shows its source). After 6 steps of 4 x 2 rows the
// checkpoint's position holds 48 sequences split 36 : 12 (the rule gives a, a, b, a repeating).
TEST(TrainerDataSources, MixesTheConfiguredSourcesByWeightAndSavesTheirCounts) {
  TinyRun run("data_sources");
  std::vector<int32_t> low(2000), high(2000);
  for (size_t i = 0; i < low.size(); ++i) {
    low[i] = static_cast<int32_t>(i * 7 % 32);
    high[i] = 32 + static_cast<int32_t>(i * 5 % 32);
  }
  write_token_shard(run.dir + "/data/low_000000.bin", low);
  write_token_shard(run.dir + "/data/high_000000.bin", high);
  std::string text = run.config("gpt2", 6);
  const std::string train_line = "train = \"" + run.dir + "/data/tiny_train_*.bin\"\n";
  text.replace(text.find(train_line), train_line.size(), "");
  const std::string sources = "[[data.sources]]\npath = \"" + run.dir + "/data/low_*.bin\"\nweight = 3\n" +
                              "[[data.sources]]\npath = \"" + run.dir + "/data/high_*.bin\"\n";
  auto parse_text = [](const std::string& toml) {
    ConfigReader reader = ConfigReader::from_string(toml, "sources.toml");
    return parse_train_config(reader);
  };
  const TrainConfig config = parse_text(text + sources);
  ASSERT_EQ(config.train_sources.size(), 2u);
  EXPECT_EQ(config.train_sources[0].weight, 3.0);
  EXPECT_EQ(config.train_sources[1].weight, 1.0);
  Trainer trainer(config);
  trainer.run();
  const CheckpointReader latest(run.dir + "/ckpt");
  const nlohmann::json loader = latest.trainer_state().at("loader");
  EXPECT_EQ(loader.at("sequences"), 48) << loader;
  EXPECT_EQ(loader.at("source_sequences"), (nlohmann::json{36, 12})) << loader;

  // Bad source tables are refused by name, before anything runs.
  expect_contains(error_message([&] { parse_text(text + "[[data.sources]]\npath = \"x\"\nweight = \"3\"\n"); }),
                  {"data.sources[0].weight", "expected a number"});
  expect_contains(error_message([&] { parse_text(run.config("gpt2", 6) + sources); }),
                  {"'data.train' and [[data.sources]] are both set"});
  expect_contains(error_message([&] { parse_text(text + "[[data.sources]]\nweight = 2\n"); }),
                  {"data.sources[0].path' is missing"});
  expect_contains(error_message([&] { parse_text(text + sources + "[[data.sources]]\npath = \"x\"\nweight = -1\n"); }),
                  {"data.sources[2].weight", "-1", "positive"});
  expect_contains(error_message([&] { parse_text(text + "[[data.sources]]\npath = \"x\"\nwieght = 2\n"); }),
                  {"unknown key 'wieght' in data.sources[0]", "path, weight"});
  TrainConfig missing = parse_text(text + "[[data.sources]]\npath = \"" + run.dir + "/data/nothing_*.bin\"\n");
  expect_contains(error_message([&] { Trainer{missing}; }), {"data.sources[0]", "nothing_*.bin", "no token shards match"});
}

// train.vocab_chunk = 0 (the default) chooses the lm-head's chunk for the device; the expected
// chunks are worked by hand from the rule in train_config.hpp.
TEST(Trainer, VocabChunkIsChosenForTheDevice) {
  TinyRun run("vocab_chunk");
  TrainConfig c = parse(run.config("gpt2", 4));
  EXPECT_EQ(c.vocab_chunk, 0);
  EXPECT_EQ(resolved_vocab_chunk(c, 0), 64);  // the CPU: min(8192, vocab 64)
  c.model.vocab_size = 50257;
  EXPECT_EQ(resolved_vocab_chunk(c, 0), 8192);
  // GPT-2 124M on an 80 GB GPU, 16 x 1024 tokens in bf16: 16384 x 50257 x 2 bytes = 1.6 GB
  // (bf16 logits, their gradient written over them) is under 80 GB / 16 = 5 GB, so the logits
  // are made once and never recomputed.
  c.device = Device::CUDA;
  c.precision = Precision::BF16;
  c.batch_size = 16, c.seq_len = 1024;
  EXPECT_EQ(resolved_vocab_chunk(c, int64_t{80} << 30), 50257);
  // On 16 GiB: 2^30 / (16384 x 2) = 32768 entries fit, a multiple of 1024.
  EXPECT_EQ(resolved_vocab_chunk(c, int64_t{16} << 30), 32768);
  // On 8 GiB 16384; on 2 GiB only 4096 fit: never below 8192.
  EXPECT_EQ(resolved_vocab_chunk(c, int64_t{8} << 30), 16384);
  EXPECT_EQ(resolved_vocab_chunk(c, int64_t{2} << 30), 8192);
  // Under tp the shard passes keep f32 logits and a bf16 gradient: 6 bytes, 2^30 / (16384 x 6)
  // = 10922 on 16 GiB, down to 10240.
  c.tp = 2;
  EXPECT_EQ(resolved_vocab_chunk(c, int64_t{16} << 30), 10240);
  c.tp = 1;
  // f32 keeps 4 bytes a logit: 16 GiB / 16 / (16384 x 4) = 16384 entries.
  c.precision = Precision::F32;
  EXPECT_EQ(resolved_vocab_chunk(c, int64_t{16} << 30), 16384);
  // A chunk the user sets is kept; a negative one is refused.
  c.vocab_chunk = 300;
  EXPECT_EQ(resolved_vocab_chunk(c, int64_t{80} << 30), 300);
  expect_contains(error_message([&] { (void)parse(run.config("gpt2", 4), {"train.vocab_chunk=-1"}); }),
                  {"train.vocab_chunk", "-1", "0 to choose it for the device"});
}

}  // namespace
}  // namespace loom::test
