// Pipeline stages hold their share of the model and of the activations, checkpoints written by
// stages load on another pp x tp layout and in one process, and `--print-schedule` draws what
// ran.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "dist_fixture.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/plan/rank_parameters.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom::test {
namespace {

std::vector<std::string> stage_overrides() {
  return {"data.val=\"\"", "optim.eps=1e-5", "optim.lr=1e-3", "optim.grad_clip=0.05", "model.n_layer=4",
          "train.grad_accum=4", "checkpoint.every=0", "checkpoint.keep_last=0"};
}

TrainConfig pipeline_config(const TinyRun& run, const std::string& arch, int64_t steps, std::vector<std::string> extra) {
  std::vector<std::string> o = stage_overrides();
  o.insert(o.end(), extra.begin(), extra.end());
  return parse(run.config(arch, steps), o);
}

// Saved at tp = 2, pp = 2; read by one process (the same weights bit for bit), resumed at
// tp = 1, pp = 4 and by one process: both continue on the uninterrupted run's losses and end
// at its weights. GPT-2's tied embedding has a copy on the last stage that must not be
// written twice.
TEST(PipelineCheckpoint, LoadsAtAnotherLayoutAndInOneProcess) {
  const auto world_group = world();
  if (world_group->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int rank = world_group->rank();
  const std::string root = shared_path("pp_ckpt_root");
  TinyRun run("pp_ckpt");
  auto config = [&](const std::string& layout, const std::string& ckpt, const std::string& log) {
    std::vector<std::string> extra = {"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "checkpoint.dir=\"" + root + "/" + ckpt + "\"",
                                      "log.dir=\"" + run.dir + "/" + log + "\""};
    std::stringstream keys(layout);
    for (std::string key; keys >> key;) extra.push_back(key);
    return pipeline_config(run, "gpt2", 8, extra);
  };
  // A: tp 2 x pp 2, the first 4 of 8 steps.
  TrainConfig first = config("parallel.tp=2 parallel.pp=2", "a", "a");
  first.steps = 4;
  Trainer a(first, world_group);
  a.run();
  {
    Transformer whole(first.model);
    restore_weights(root + "/a", whole);
    std::map<std::string, const Parameter*> whole_by_name;
    for (const Parameter* p : whole.parameters()) whole_by_name[p->name] = p;
    for (const Parameter* p : a.model().parameters()) {
      const Tensor expected = take_shard(whole_by_name.at(p->name)->value, p->placement);
      EXPECT_EQ(std::memcmp(expected.f32(), p->value.f32(), p->value.nbytes()), 0) << p->name << " on rank " << rank;
    }
  }
  // B: tp 1 x pp 4 resumes A; C: one process resumes A (from its own copy, since B writes its
  // step 8 next to A's step 4); R: one process, never interrupted.
  const std::string a_copy = "a_copy_" + std::to_string(rank);
  std::filesystem::copy(root + "/a", root + "/" + a_copy, std::filesystem::copy_options::recursive);
  world_group->barrier();
  Trainer b(config("parallel.pp=4", "a", "b"), world_group);
  b.run();
  Trainer c(config("", a_copy, "c"));
  c.run();
  Trainer r(config("", "r" + std::to_string(rank), "r"));
  r.run();
  const auto r_losses = losses_of(run.dir + "/r/metrics.jsonl");
  ASSERT_EQ(r_losses.size(), 8u);
  for (const std::string log : {"b", "c"}) {
    if (log == "b" && rank != 0) continue;  // world rank 0 logs the pipeline run
    const auto losses = losses_of(run.dir + "/" + log + "/metrics.jsonl");
    ASSERT_EQ(losses.size(), 4u) << log << " resumes at step 5";
    for (size_t s = 0; s < 4; ++s)
      EXPECT_NEAR(losses[s], r_losses[s + 4], 1e-5 * r_losses[s + 4]) << log << ", step " << s + 5;
  }
  std::map<std::string, const Parameter*> reference;
  for (const Parameter* p : r.model().parameters()) reference[p->name] = p;
  for (Trainer* t : {&b, &c})
    for (const Parameter* p : t->model().parameters())
      EXPECT_LE(relative_weight_difference(reference.at(p->name)->value.to_f32_vector(), p->value.to_f32_vector()), 1e-5)
          << p->name << " on rank " << rank;
  world_group->barrier();
  if (rank == 0) std::filesystem::remove_all(root);
}

// Each stage holds exactly its layers' parameters (the planner's parameter list, by name), the
// stages together hold the model once (plus the last stage's tied copy), and a schedule's
// activation memory is the micro-batches it keeps in flight: every micro-batch under AFAB,
// p - rank under 1F1B, as the planner's replay of the same action lists predicts.
TEST(PipelineMemory, StagesHoldTheirShareAndTheScheduleDecidesActivations) {
  const auto world_group = world();
  const int p = world_group->size();
  if (p < 2 || p > 4) GTEST_SKIP() << "one stage per rank of 4 layers: needs 2 to 4 ranks";
  TinyRun run("pp_memory");
  const int64_t m = 4;
  std::map<std::string, int64_t> activation_bytes;
  for (const std::string schedule : {"afab", "1f1b"}) {
    const TrainConfig config = pipeline_config(run, "gpt2", 1,
                                               {"train.batch_size=2", "optim.warmup_steps=0", "parallel.pp=" + std::to_string(p),
                                                "parallel.pp_schedule=\"" + schedule + "\"", "checkpoint.dir=\"\"",
                                                "log.dir=\"" + run.dir + "/" + schedule + "\""});
    auto live = [](MemCategory category) {
      return HostAllocator::instance().stats().live_bytes[static_cast<size_t>(category)];
    };
    const int64_t activations_before = live(MemCategory::Activations), params_before = live(MemCategory::Parameters),
                  grads_before = live(MemCategory::Gradients), moments_before = live(MemCategory::OptimizerState);
    Trainer trainer(config, world_group);
    trainer.run();
    const Transformer& model = trainer.model();
    activation_bytes[schedule] = live(MemCategory::Activations) - activations_before;

    const auto simulated = plan::simulate_pipeline(
        pipeline_actions(config.pp_schedule, p, m, 1), p, 1, 1.0, 2.0, 0.0);
    ASSERT_NE(trainer.pipeline(), nullptr);
    EXPECT_EQ(trainer.pipeline()->activations().sets_allocated(),
              simulated.peak_in_flight[static_cast<size_t>(world_group->rank())])
        << schedule << " on rank " << world_group->rank();

    // Parameters: this stage's layers, embeddings on the first, final norm and head (and the
    // tied table's copy) on the last, as the planner places them from the parameter list.
    const ModelChunk& chunk = model.chunks().front();
    const auto expected = static_cast<int64_t>(
        plan::rank_parameters(config.model, config.layout(), chunk.stage).total());
    int64_t held = 0;
    for (const Parameter* param : model.parameters()) held += param->value.numel();
    EXPECT_EQ(held, expected) << "rank " << world_group->rank();
    // Gradients and AdamW's two moments follow the stage's parameters (f32, no ZeRO).
    const auto held_bytes = static_cast<int64_t>(sizeof(float)) * held;
    EXPECT_EQ(live(MemCategory::Parameters) - params_before, held_bytes);
    EXPECT_EQ(live(MemCategory::Gradients) - grads_before, held_bytes);
    EXPECT_EQ(live(MemCategory::OptimizerState) - moments_before, 2 * held_bytes);
    int64_t owned = 0;
    for (const Parameter* param : model.parameters())
      if (!param->pipeline_copy) owned += param->value.numel();
    float total = static_cast<float>(owned);
    world_group->all_reduce(&total, 1, ReduceOp::Sum)->wait();
    EXPECT_EQ(static_cast<int64_t>(total), config.model.parameter_count()) << "the stages hold the model once";
  }
  // Same sets, different counts: the ratio is exactly the in-flight ratio.
  const int r = world_group->rank();
  EXPECT_EQ(activation_bytes["1f1b"] * m, activation_bytes["afab"] * (p - r)) << "rank " << r;
}

// What `loom plan --profile` prints for a pipeline (plan::predict_engine_pipeline_memory) is the
// first stage's allocator bytes: its parameters, gradients and moments (also under ZeRO-1 is
// not testable here: dp = 1), and its activations at their peak within the step, for each
// schedule and recomputation mode. Nothing is measured to make the prediction: it comes from
// the parameter list, the stash layout and the replay of the schedule's action list.
TEST(PipelineMemory, FirstStageBytesAreThePlannersEngineFigure) {
  const auto world_group = world();
  const int p = world_group->size();
  if (p < 2 || p > 4) GTEST_SKIP() << "one stage per rank of 4 layers: needs 2 to 4 ranks";
  TinyRun run("pp_engine_memory");
  const int64_t layers = 4, batch = 2;
  struct Case {
    std::string arch, schedule, recompute;
    int v;
    int64_t m = 4;  // micro-batches a step (8: DualPipeV's steady state of paired F and B)
  };
  const Case cases[] = {{"gpt2", "afab", "none", 1},        {"gpt2", "1f1b", "selective", 1},
                        {"llama", "1f1b", "full", 1},       {"gpt2", "zbh1", "none", 1},
                        {"llama", "zbh1", "selective", 1},  {"gpt2", "interleaved", "none", 2},
                        {"gpt2", "zbv", "none", 2},         {"llama", "dualpipev", "full", 2},
                        {"gpt2", "dualpipev", "none", 2, 8}};
  for (const Case& c : cases) {
    if (layers % (p * c.v) != 0) continue;  // two chunks per rank at pp = 4 would need 8 layers
    const std::string what = c.arch + " " + c.schedule + " recompute=" + c.recompute;
    // Three steps: the pool of activation sets outlives a step, and the planner replays steps
    // until they settle (DualPipeV's second step gives the last stage's extras to more sets).
    const TrainConfig config = pipeline_config(
        run, c.arch, 3,
        {"train.batch_size=" + std::to_string(batch), "optim.warmup_steps=0",
         "parallel.pp=" + std::to_string(p), "parallel.pp_schedule=\"" + c.schedule + "\"",
         "parallel.pp_chunks=" + std::to_string(c.v), "model.recompute=\"" + c.recompute + "\"",
         "checkpoint.dir=\"\"", "train.grad_accum=" + std::to_string(c.m),
         "log.dir=\"" + run.dir + "/" + c.schedule + c.recompute + "\""});
    auto stats = [] { return HostAllocator::instance().stats(); };
    const MemStats before = stats();
    auto live = [&](const MemStats& now, MemCategory category) {
      const auto i = static_cast<size_t>(category);
      return static_cast<double>(now.live_bytes[i] - before.live_bytes[i]);
    };
    double peak_activations = 0;
    {
      Trainer trainer(config, world_group);
      trainer.run();
      const MemStats after = stats();
      // The trainer opens a peak window per step; the last step's is the steady state's.
      peak_activations = static_cast<double>(after.peak_bytes[static_cast<size_t>(MemCategory::Activations)] -
                                             before.live_bytes[static_cast<size_t>(MemCategory::Activations)]);
      if (world_group->rank() != 0) continue;
      plan::PlanLayout layout = config.layout();
      const plan::MemoryBreakdown predicted = plan::predict_engine_pipeline_memory(
          config.model, layout, config.seq_len, c.m, static_cast<int64_t>(config.bucket_mb * 1e6));
      EXPECT_EQ(live(after, MemCategory::Parameters), predicted.parameters) << what;
      EXPECT_EQ(live(after, MemCategory::Gradients), predicted.gradients) << what;
      EXPECT_EQ(live(after, MemCategory::OptimizerState), predicted.optimizer_state) << what;
      EXPECT_EQ(peak_activations, predicted.activations) << what;
    }
  }
}

// `--print-schedule`: the last step's timeline, one row per stage and one bar per action, and
// the bubble next to the textbook one.
TEST(PipelineSchedulePrint, DrawsEveryActionOfTheLastStep) {
  const auto world_group = world();
  const int p = world_group->size();
  if (p < 2 || p > 4) GTEST_SKIP() << "one stage per rank of 4 layers: needs 2 to 4 ranks";
  TinyRun run("pp_print");
  TrainConfig config = pipeline_config(run, "llama", 2,
                                       {"optim.warmup_steps=0", "parallel.pp=" + std::to_string(p), "checkpoint.dir=\"\"",
                                        "log.dir=\"" + run.dir + "/log\""});
  config.print_schedule = true;
  Trainer trainer(config, world_group);
  trainer.run();
  if (world_group->rank() != 0) return;
  std::ifstream in(run.dir + "/log/pipeline.svg");
  ASSERT_TRUE(in.good()) << "no pipeline.svg";
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto count = [&](const std::string& needle) {
    int64_t n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("class=\"span forward\""), p * config.grad_accum);
  EXPECT_EQ(count("class=\"span backward\""), p * config.grad_accum);
  expect_contains(svg, {"textbook " + std::to_string(100 * (p - 1) / config.grad_accum), "rank " + std::to_string(p - 1)});
}

// Evaluation runs forwards through the stages; every rank gets the last stage's loss.
TEST(PipelineEvaluation, ValidationLossEqualsOneProcess) {
  const auto world_group = world();
  const int p = world_group->size();
  if (p < 2 || p > 4) GTEST_SKIP() << "one stage per rank of 4 layers: needs 2 to 4 ranks";
  TinyRun run("pp_eval");
  auto config = [&](int pp, const std::string& log) {
    return pipeline_config(run, "gpt2", 3,
                           {"optim.warmup_steps=0", "data.val=\"" + run.dir + "/data/tiny_val_*.bin\"",
                            "eval.every=0", "eval.batches=3", "parallel.pp=" + std::to_string(pp),
                            "checkpoint.dir=\"\"", "log.dir=\"" + run.dir + "/" + log + "\""});
  };
  Trainer reference(config(1, "ref"));
  const TrainSummary expected = reference.run();
  Trainer pipelined(config(p, "pp"), world_group);
  const TrainSummary got = pipelined.run();
  ASSERT_TRUE(expected.last_val_loss && got.last_val_loss);
  EXPECT_NEAR(*got.last_val_loss, *expected.last_val_loss, 1e-5 * *expected.last_val_loss) << "rank " << world_group->rank();
  const std::string val = run.dir + "/data/tiny_val_*.bin";
  EXPECT_NEAR(pipelined.evaluate(val, 2), reference.evaluate(val, 2), 1e-5 * reference.evaluate(val, 2));
}

}  // namespace
}  // namespace loom::test
