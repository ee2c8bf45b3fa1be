// Pipeline-parallel training throughput under mpirun: one stage per rank (pp = ranks), one
// core each, a GPT-2-style model whose output head costs about one layer (so even stages are
// balanced and the bubble is the schedule's), m micro-batches per step. Rank 0 first runs the
// whole model alone on the same micro-batches (the baseline, measured in the same run), then
// each schedule; it prints one JSON object per schedule: ms per step, tokens/s, speed-up over
// one rank, MFU against the measured one-core SGEMM peak times the ranks, the measured bubble
// (idle over busy, averaged over ranks), the textbook one and the planner's simulation of the
// same lists with rank 0's measured F, B and W times, activation sets on rank 0. ZB-V and
// DualPipeV run when the layers cut into 2 x ranks stages and m >= 2 x ranks; DualPipeV twice,
// its lists in sequence and with its pairs run as an overlapping executor runs them
// ("dualpipev pairs": both inputs, both computations, both outputs; on the CPU in sequence).
//   mpirun -np P bench_pipeline [--steps S] [--micro M] [--layers L] [--batch B] [--seq T]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/core/rng.hpp"
#include "loom/dist/runtime.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/flops.hpp"
#include "loom/model/transformer.hpp"
#include "loom/obs/trace.hpp"
#include "loom/parallel/pipeline_executor.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/train/pipeline_report.hpp"

namespace {

struct Run {
  double step_s = 0;
  loom::PipelineBubble bubble;
  double bubble_simulated = 0;
  int64_t activation_sets = 0;
};

// Steps of `schedule` on this rank's stages; the bubble of the last step (pp rank 0 only).
Run run_schedule(const loom::ModelConfig& config, loom::PipelineSchedule schedule, int64_t v,
                 bool pairs, const std::shared_ptr<loom::ProcessGroup>& world,
                 const std::vector<int32_t>& tokens, int64_t m, int64_t batch, int64_t seq,
                 int64_t steps) {
  const int64_t p = world->size();
  loom::Transformer stage(
      config, loom::Recompute::None, loom::kDefaultVocabChunk, nullptr,
      loom::pipeline_chunks(loom::stage_layer_counts(config.n_layer, p * v), p, world->rank(),
                            loom::stage_placement(schedule)));
  stage.init_weights(1);
  // The first and last stage share the tied embedding (Megatron-LM's embedding group).
  const bool holder = world->rank() == 0 || world->rank() == p - 1;
  auto embedding = world->split(holder ? 0 : 1, world->rank(), "embedding");
  loom::PipelineExecutor executor(stage, world, schedule, holder ? embedding : nullptr, pairs);
  const loom::MicroBatches micro{tokens.data(), tokens.data() + 1, m, batch, seq, batch * seq};
  Run run;
  for (int64_t s = 0; s <= steps; ++s) {  // step 0 warms up
    stage.zero_grad();
    world->barrier();
    const double start = loom::TraceRecorder::now_s();
    executor.train_step(micro, 1.0f / static_cast<float>(m * batch * seq));
    world->barrier();
    if (s > 0) run.step_s += (loom::TraceRecorder::now_s() - start) / static_cast<double>(steps);
  }
  if (auto bubble = loom::report_pipeline_step(*world, executor.last_timings(), schedule, m, v, ""))
    run.bubble = *bubble;
  // The planner's prediction: the same lists simulated with this rank's mean F, B and W times
  // (a whole backward counts as B + W in equal halves), as idle over busy like the measurement.
  double sum[3] = {0, 0, 0}, count[3] = {0, 0, 0};
  for (const loom::ActionTiming& t : executor.last_timings()) {
    const int kind = t.op == loom::PipeOp::Forward ? 0 : t.op == loom::PipeOp::BackwardWeight ? 2 : 1;
    sum[kind] += t.end_s - t.start_s;
    count[kind] += 1;
  }
  const double f = sum[0] / count[0];
  const double b = count[2] > 0 ? sum[1] / count[1] : sum[1] / count[1] / 2;
  const double w = count[2] > 0 ? sum[2] / count[2] : b;
  // Paired (DualPipeV's pairs as an overlapping executor runs them): on the CPU nothing hides,
  // but each pair waits for both inputs and sends both outputs at its end.
  const auto timeline =
      loom::plan::simulate_pipeline(loom::pipeline_actions(schedule, p, m, v), p, v,
                                    std::vector<loom::plan::PassTimes>(
                                        static_cast<size_t>(p * v), loom::plan::PassTimes{f, b, w}),
                                    0, loom::stage_placement(schedule), pairs);
  run.bubble_simulated = timeline.bubble_fraction / (1 - timeline.bubble_fraction);
  run.activation_sets = executor.activations().sets_allocated();
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 3, m = 8, layers = 8, batch = 4, seq = 128;
  CLI::App app{"loom pipeline-parallel benchmark (run under mpirun, one stage per rank)"};
  app.add_option("--steps", steps);
  app.add_option("--micro", m, "micro-batches per step");
  app.add_option("--layers", layers);
  app.add_option("--batch", batch, "sequences per micro-batch");
  app.add_option("--seq", seq);
  CLI11_PARSE(app, argc, argv);

  loom::DistRuntime runtime;
  const auto world = runtime.world();
  const int64_t p = world->size();
  loom::cpu::set_num_threads(1);  // one core per rank
  loom::ModelConfig config;       // GPT-2 style, d = 256; a 2048-token head costs about one layer
  config.vocab_size = 2048;
  config.max_seq_len = seq;
  config.n_layer = layers;
  config.n_embd = 256;
  config.n_head = config.n_kv_head = 4;
  config.ffn_hidden = 4 * 256;
  const loom::CounterRng rng(5, 0);
  std::vector<int32_t> tokens(static_cast<size_t>(m * batch * seq + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % 2048);
  const double tokens_per_step = static_cast<double>(m * batch * seq);
  const double flops_per_step = loom::flops_per_token(config, seq) * tokens_per_step;
  const double peak_gflops = loom::cpu::measure_sgemm_gflops();

  // The baseline: the whole model on one rank, the same micro-batches one after another.
  double baseline_s = 0;
  if (world->rank() == 0) {
    loom::Transformer whole(config);
    whole.init_weights(1);
    for (int64_t s = 0; s <= steps; ++s) {
      whole.zero_grad();
      const double start = loom::TraceRecorder::now_s();
      for (int64_t k = 0; k < m; ++k) {
        whole.forward(tokens.data() + k * batch * seq, tokens.data() + 1 + k * batch * seq, batch,
                      seq, {true, 1.0f / static_cast<float>(tokens_per_step)});
        whole.backward();
      }
      if (s > 0) baseline_s += (loom::TraceRecorder::now_s() - start) / static_cast<double>(steps);
    }
  }
  world->barrier();
  struct Case {
    loom::PipelineSchedule schedule;
    int64_t v;
    bool pairs = false;  // parallel.pp_overlap = "on" (DualPipeV)
  };
  std::vector<Case> cases = {{loom::PipelineSchedule::AllForwardAllBackward, 1},
                             {loom::PipelineSchedule::OneFOneB, 1},
                             {loom::PipelineSchedule::ZeroBubbleH1, 1}};
  if (p > 1 && layers % (2 * p) == 0 && m % p == 0)
    cases.push_back({loom::PipelineSchedule::Interleaved, 2});
  if (p > 1 && layers % (2 * p) == 0 && m >= 2 * p) {
    cases.push_back({loom::PipelineSchedule::ZeroBubbleV, 2});
    cases.push_back({loom::PipelineSchedule::DualPipeV, 2});
    cases.push_back({loom::PipelineSchedule::DualPipeV, 2, true});
  }
  for (const Case& c : cases) {
    const Run run =
        run_schedule(config, c.schedule, c.v, c.pairs, world, tokens, m, batch, seq, steps);
    if (world->rank() != 0) continue;
    const nlohmann::json out = {
        {"schedule", std::string(loom::schedule_name(c.schedule)) + (c.pairs ? " pairs" : "")},
        {"ranks", p},
        {"micro_batches", m},
        {"chunks_per_rank", c.v},
        {"parameters", config.parameter_count()},
        {"ms_per_step", run.step_s * 1e3},
        {"one_rank_ms_per_step", baseline_s * 1e3},
        {"tokens_per_s", tokens_per_step / run.step_s},
        {"speedup_vs_one_rank", baseline_s / run.step_s},
        {"mfu", flops_per_step / run.step_s / (peak_gflops * 1e9 * static_cast<double>(p))},
        {"sgemm_peak_gflops_per_rank", peak_gflops},
        {"bubble_measured", run.bubble.measured},
        {"bubble_textbook", run.bubble.textbook},
        {"bubble_simulated", run.bubble_simulated},
        {"activation_sets_rank0", run.activation_sets}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
