// `parallel.pp` through the trainer: every pipeline schedule (zero-bubble ZB-H1 and ZB-V too), alone and mixed with dp, tp,
// sequence parallelism and ZeRO-1 on one mesh, against one process on the same global batch;
// and checkpoints saved on one pp x tp layout loaded on another and by one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "dist_fixture.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom::test {
namespace {

struct Case {
  std::string arch;
  std::string schedule;
  int tp, dp;  // pp = world / (tp x dp)
  int chunks;
  int zero_stage;
  bool sequence_parallel;
  int ranks;  // the world size the layout is for
  std::string pp_layers = "";  // layers per stage as a TOML array ("": even split)
  std::string recompute = "none";
  std::string precision = "f32";
  bool documents = false;  // packed documents on token 5 (random data holds ~1 in 64), positions restarting
  int layers = 4;          // ZB-V over pp = 4 needs 2 x 4 stages of a layer each
  std::string pp_overlap = "";  // parallel.pp_overlap ("": the default)
};

std::string case_name(const Case& c) {
  return c.arch + "_" + (c.schedule == "1f1b" ? std::string("onef1b") : c.schedule) + "_tp" +
         std::to_string(c.tp) + "_dp" + std::to_string(c.dp) +
         (c.chunks > 1 ? "_v" + std::to_string(c.chunks) : "") + "_zero" +
         std::to_string(c.zero_stage) + (c.sequence_parallel ? "_sp" : "") +
         (c.pp_layers.empty() ? "" : "_uneven") + (c.recompute == "none" ? "" : "_" + c.recompute) +
         (c.precision == "f32" ? "" : "_" + c.precision) + (c.documents ? "_documents" : "") +
         (c.layers != 4 ? "_l" + std::to_string(c.layers) : "") +
         (c.pp_overlap.empty() ? "" : "_overlap_" + c.pp_overlap) + "_np" + std::to_string(c.ranks);
}

// Four layers (so 4 stages, or 2 ranks x 2 chunks, each get one), 4 micro-batches (grad_accum)
// of the global batch, AdamW with clipping active every step.
// ZB-V needs 2 x pp micro-batches: 8 over pp = 4 (`micro`).
std::vector<std::string> pipeline_overrides(const std::string& arch, int layers = 4, int micro = 4) {
  std::vector<std::string> o = {"data.val=\"\"", "optim.eps=1e-5", "optim.lr=1e-3", "optim.grad_clip=0.05",
                                "parallel.bucket_mb=0.002", "model.n_layer=" + std::to_string(layers),
                                "train.grad_accum=" + std::to_string(micro), "checkpoint.dir=\"\""};
  if (arch == "llama") {
    o.push_back("model.n_head=8");
    o.push_back("model.n_kv_head=4");
  }
  return o;
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class PipelineTraining : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineTraining, FollowsOneProcess) {
  const auto world_group = world();
  const Case c = GetParam();
  const int n = world_group->size();
  if (n != c.ranks) GTEST_SKIP() << "layout is for " << c.ranks << " ranks";
  const int pp = n / (c.tp * c.dp);
  TinyRun run("pp_train_" + c.arch);
  const std::string base = run.config(c.arch, kSteps);
  std::vector<std::string> shared =
      pipeline_overrides(c.arch, c.layers, c.schedule == "zbv" || c.schedule == "dualpipev" ? std::max(4, 2 * pp) : 4);
  shared.push_back("model.recompute=\"" + c.recompute + "\"");
  shared.push_back("train.precision=\"" + c.precision + "\"");
  if (c.documents)  // positions restart per document: the position rows and RoPE angles too
    shared.insert(shared.end(), {"data.document_mask=true", "data.eot_token=5", "data.document_positions=true",
                 "data.split_long_documents=true"});
  auto with = [&](std::vector<std::string> extra) { return plus(std::move(extra), shared); };
  Trainer reference(parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/ref\""})));
  reference.run();
  std::vector<std::string> layout = {"train.batch_size=" + std::to_string(kGlobalBatch / c.dp),
                                     "parallel.pp=" + std::to_string(pp), "parallel.tp=" + std::to_string(c.tp),
                                     "parallel.pp_schedule=\"" + c.schedule + "\"",
                                     "parallel.pp_chunks=" + std::to_string(c.chunks),
                                     "parallel.sequence_parallel=" + std::string(c.sequence_parallel ? "true" : "false"),
                                     "parallel.zero_stage=" + std::to_string(c.zero_stage),
                                     "log.dir=\"" + run.dir + "/pp\""};
  if (!c.pp_layers.empty()) layout.push_back("parallel.pp_layers=" + c.pp_layers);
  if (!c.pp_overlap.empty()) layout.push_back("parallel.pp_overlap=\"" + c.pp_overlap + "\"");
  Trainer parallel(parse(base, with(layout)),
                   world_group);
  parallel.run();

  if (world_group->rank() == 0) {
    // bf16: both runs round weights to 8 mantissa bits after every step, so a last-bit f32
    // difference becomes one bf16 ulp where it crosses a rounding edge (as in the dp tests).
    expect_losses_follow(run.dir + "/ref/metrics.jsonl", run.dir + "/pp/metrics.jsonl",
                         c.precision == "bf16" ? 1e-3 : 1e-5);
  }
  // Every parameter this rank holds (its stage's layers, its tp shard of them, and the last
  // stage's copy of a tied embedding) ends where one process's ends.
  const auto ref = by_name(reference.model().parameters());
  for (const Parameter* p : parallel.model().parameters()) {
    ASSERT_TRUE(ref.count(p->name)) << p->name;
    EXPECT_LE(shard_difference(ref.at(p->name)->value, p->placement, p->value), c.precision == "bf16" ? 1e-2 : 1e-5)
        << p->name << " on rank " << world_group->rank();
  }
}

// Interleaving needs pp x chunks <= 4 layers; 1F1B and interleaved need grad_accum (4) >= pp.
INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineTraining,
    ::testing::Values(
        Case{"gpt2", "1f1b", 1, 1, 1, 0, false, 2}, Case{"llama", "1f1b", 1, 1, 1, 0, false, 2},
        Case{"gpt2", "afab", 1, 1, 1, 0, false, 2},
        Case{"gpt2", "interleaved", 1, 1, 2, 0, false, 2},
        Case{"llama", "interleaved", 1, 1, 2, 0, false, 2},
        Case{"gpt2", "1f1b", 1, 1, 1, 0, false, 2, "[3, 1]"},
        Case{"llama", "afab", 1, 1, 1, 0, false, 2, "[1, 3]"},
        Case{"gpt2", "1f1b", 1, 1, 1, 0, false, 2, "", "selective"},
        Case{"llama", "interleaved", 1, 1, 2, 0, false, 2, "", "full"},
        Case{"gpt2", "1f1b", 1, 2, 1, 1, false, 4, "", "none", "bf16"},
        // Every stage finds the documents from the tokens (later stages too).
        Case{"llama", "interleaved", 1, 1, 2, 0, false, 2, "", "selective", "f32", true},
        Case{"gpt2", "1f1b", 2, 1, 1, 0, true, 4, "", "none", "f32", true},
        Case{"gpt2", "1f1b", 1, 1, 1, 0, false, 4}, Case{"llama", "afab", 1, 1, 1, 0, false, 4},
        Case{"gpt2", "1f1b", 1, 2, 1, 1, false, 4},
        Case{"llama", "interleaved", 1, 2, 2, 0, false, 4},
        Case{"gpt2", "1f1b", 2, 1, 1, 0, true, 4}, Case{"llama", "1f1b", 2, 1, 1, 0, false, 4},
        Case{"gpt2", "1f1b", 2, 2, 1, 1, true, 8},
        Case{"llama", "interleaved", 2, 2, 2, 1, false, 8},
        // Zero-bubble ZB-H1: split backwards, W's held back; alone, with recomputation,
        // dp2 with ZeRO-1 (buckets fill at W), tp2 (+ sp: partial sums at W).
        Case{"gpt2", "zbh1", 1, 1, 1, 0, false, 2}, Case{"llama", "zbh1", 1, 1, 1, 0, false, 2},
        Case{"gpt2", "zbh1", 1, 1, 1, 0, false, 2, "", "selective"},
        Case{"llama", "zbh1", 1, 1, 1, 0, false, 2, "", "full"},
        Case{"gpt2", "zbh1", 1, 1, 1, 0, false, 4}, Case{"llama", "zbh1", 1, 1, 1, 0, false, 4},
        Case{"llama", "zbh1", 1, 2, 1, 1, false, 4}, Case{"gpt2", "zbh1", 1, 2, 1, 0, false, 4},
        Case{"gpt2", "zbh1", 2, 1, 1, 0, true, 4}, Case{"llama", "zbh1", 2, 1, 1, 0, false, 4},
        // ZB-V: two chunks per rank in a V (rank 0 holds the first and last stage, so
        // the tied embedding is one matrix there); pp2 and pp4, recomputation, dp2
        // with and without ZeRO-1, tp2 (+ sp).
        Case{"gpt2", "zbv", 1, 1, 2, 0, false, 2}, Case{"llama", "zbv", 1, 1, 2, 0, false, 2},
        Case{"gpt2", "zbv", 1, 1, 2, 0, false, 2, "", "selective"},
        Case{"llama", "zbv", 1, 1, 2, 0, false, 2, "", "full"},
        Case{"gpt2", "zbv", 1, 1, 2, 0, false, 4, "", "none", "f32", false, 8},
        Case{"llama", "zbv", 1, 1, 2, 0, false, 4, "", "none", "f32", false, 8},
        Case{"llama", "zbv", 1, 2, 2, 1, false, 4}, Case{"gpt2", "zbv", 1, 2, 2, 0, false, 4},
        Case{"gpt2", "zbv", 2, 1, 2, 0, true, 4}, Case{"llama", "zbv", 2, 1, 2, 0, false, 4},
        // DualPipeV: the same V, whole backwards paired with forwards, split ones at the
        // ends (W's queued in order).
        Case{"gpt2", "dualpipev", 1, 1, 2, 0, false, 2},
        Case{"llama", "dualpipev", 1, 1, 2, 0, false, 2},
        Case{"gpt2", "dualpipev", 1, 1, 2, 0, false, 2, "", "selective"},
        Case{"llama", "dualpipev", 1, 1, 2, 0, false, 4, "", "full", "f32", false, 8},
        Case{"gpt2", "dualpipev", 1, 1, 2, 0, false, 4, "", "none", "f32", false, 8},
        Case{"llama", "dualpipev", 1, 2, 2, 1, false, 4},
        Case{"gpt2", "dualpipev", 1, 2, 2, 0, false, 4},
        Case{"gpt2", "dualpipev", 2, 1, 2, 0, true, 4},
        // Its pairs run as an overlapping executor runs them (both inputs, the
        // backward, the forward, both outputs): on the CPU in that order.
        Case{"gpt2", "dualpipev", 1, 1, 2, 0, false, 2, "", "none", "f32", false, 4, "on"},
        Case{"llama", "dualpipev", 1, 1, 2, 0, false, 4, "", "full", "f32", false, 8, "on"},
        Case{"gpt2", "dualpipev", 1, 2, 2, 1, false, 4, "", "none", "f32", false, 4, "on"},
        Case{"llama", "dualpipev", 2, 1, 2, 0, true, 4, "", "none", "f32", false, 4, "on"}),
    [](const auto& info) { return case_name(info.param); });

// A launch whose ranks are not pp x dp x tp is refused before any work, saying what would work.
TEST(PipelineLaunch, RanksThatAreNotAMultipleOfTpTimesPpAreRejected) {
  const auto world_group = world();
  const int n = world_group->size();
  TinyRun run("pp_launch");
  const int pp = 2 * n;
  const TrainConfig config = parse(run.config("gpt2", 4), {"model.n_layer=" + std::to_string(pp),
                                                           "train.grad_accum=" + std::to_string(pp),
                                                           "parallel.pp=" + std::to_string(pp)});
  expect_contains(error_message([&] { Trainer trainer(config, world_group); }),
                  {"launched with " + std::to_string(n) + " rank(s)",
                   "parallel.tp x parallel.pp = 1 x " + std::to_string(pp), "launch dp x " + std::to_string(pp)});
}

}  // namespace
}  // namespace loom::test
