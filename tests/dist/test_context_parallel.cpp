// Context parallelism (parallel.cp): each rank holds chunks r and 2C-1-r of every sequence.
// Its attention (ring and all-gather) against one process's attention over the whole sequence,
// with the FLOPs and wire bytes each rank is asked for; the trainer at cp = world size and on
// meshes with tp (+sp), pp, dp and ZeRO-1/3, GPT-2 and Llama (GQA), with and without packed
// documents, against one process on the same global batch; a cp run's checkpoint resumed by one
// process; and launches that cannot work, refused before any work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "../gradcheck.hpp"
#include "../model_fixtures.hpp"
#include "dist_fixture.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/parallel/context_parallel.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/time_model.hpp"
#include "tensor_parallel_fixture.hpp"

namespace loom::test {
namespace {

// ---- attention alone ------------------------------------------------------------------------

struct AttentionCase {
  CpComm comm;
  bool documents;
};

void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << cp_comm_name(c.comm) << (c.documents ? " documents" : " causal");
}

class ContextAttentionParity : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(ContextAttentionParity, EqualsAttentionOverTheWholeSequence) {
  const auto group = world();
  const int n = group->size(), rank = group->rank();
  const AttentionCase c = GetParam();
  // GQA (heads and kv heads split over cp 1, 2 and 4 for Ulysses); chunks of 12 rows, so the
  // kernels' 64-row tiles straddle the chunk edges.
  const int64_t batch = 2, heads = 8, kv_heads = 4, d = 8, chunk = 12, seq = 2 * n * chunk;
  const ops::AttentionShape whole{batch, seq, heads, kv_heads, d};
  const int64_t ld = whole.qkv_ld(), out_ld = whole.out_ld();
  const std::vector<float> qkv_values = random_vector(batch * seq * ld, 61);
  // Packed documents: boundaries every 17 tokens from a per-sequence offset (some inside a
  // rank's chunk, some on a chunk edge). Else causal.
  std::vector<int32_t> ranges(2 * batch * seq);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t shifted = t + 5 * b;
      ranges[2 * (b * seq + t)] = c.documents ? static_cast<int32_t>(std::max<int64_t>(0, shifted / 17 * 17 - 5 * b)) : 0;
      ranges[2 * (b * seq + t) + 1] = static_cast<int32_t>(t + 1);
    }
  const Tensor qkv = tensor_of({batch * seq, ld}, qkv_values);
  const Tensor out = Tensor::empty({batch * seq, out_ld}, DType::F32, MemCategory::Workspace);
  const Tensor lse = Tensor::empty({batch, heads, seq}, DType::F32, MemCategory::Workspace);
  ops::attention_forward(out, lse, qkv, whole, ranges);
  const std::vector<float> probe = random_vector(batch * seq * out_ld, 62);
  const Tensor d_qkv = Tensor::empty(qkv.shape(), DType::F32, MemCategory::Workspace);
  ops::attention_backward(d_qkv, tensor_of(out.shape(), probe), qkv, out, lse, whole, ranges);

  const auto cp = make_context_attention(group, c.comm);
  const ContextSplit split = cp->split();
  ASSERT_EQ(split.rank, rank);
  const int64_t local = seq / n, rows = batch * local;
  const ops::AttentionShape mine{batch, local, heads, kv_heads, d};
  auto local_rows = [&](const std::vector<float>& v, int64_t width) {
    std::vector<float> out_rows(static_cast<size_t>(rows * width));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < local; ++t) {
        const int64_t g = b * seq + split.global_position(t, seq);
        std::copy(&v[g * width], &v[g * width] + width, &out_rows[(b * local + t) * width]);
      }
    return out_rows;
  };
  std::vector<int32_t> local_ranges(2 * rows);
  split.take_local(ranges.data(), local_ranges.data(), batch, seq, 2);
  const Tensor my_qkv = tensor_of({rows, ld}, local_rows(qkv_values, ld));
  const Tensor my_out = Tensor::empty({rows, out_ld}, DType::F32, MemCategory::Workspace);
  const Tensor my_lse = Tensor::empty({batch, heads, local}, DType::F32, MemCategory::Workspace);
  group->reset_stats();
  cp->forward(my_out, my_lse, my_qkv, mine, local_ranges);
  const CommStats forward_stats = group->stats();
  const Tensor my_d_qkv = Tensor::empty(my_qkv.shape(), DType::F32, MemCategory::Workspace);
  cp->backward(my_d_qkv, tensor_of({rows, out_ld}, local_rows(probe, out_ld)), my_qkv, my_out, my_lse, mine,
               local_ranges);

  const std::vector<float> want_out = local_rows(out.to_f32_vector(), out_ld);
  const std::vector<float> got_out = my_out.to_f32_vector();
  for (size_t i = 0; i < want_out.size(); ++i) ASSERT_NEAR(got_out[i], want_out[i], 1e-6f) << i;
  const std::vector<float> all_lse = lse.to_f32_vector(), got_lse = my_lse.to_f32_vector();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < local; ++t)
        ASSERT_NEAR(got_lse[(b * heads + h) * local + t], all_lse[(b * heads + h) * seq + split.global_position(t, seq)],
                    1e-5f);
  const std::vector<float> all_grad = d_qkv.to_f32_vector();
  double scale = 0;
  for (float g : all_grad) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  const std::vector<float> want_grad = local_rows(all_grad, ld), got_grad = my_d_qkv.to_f32_vector();
  for (size_t i = 0; i < want_grad.size(); ++i) ASSERT_NEAR(got_grad[i], want_grad[i], 1e-5 * scale) << i;

  // Wire bytes per rank: a k|v block is rows x 2 KV D floats. Ring: C - 1 blocks forward, then
  // the blocks again and their gradients backward. All-gather: one all-gather forward, one
  // more and a reduce-scatter backward. Ulysses: (C-1)/C of this rank's q|k|v, output and
  // log-sum-exps forward (and the key ranges, gathered); backward q|k|v, output, its gradient
  // and the log-sum-exps out, q|k|v's gradient back.
  const int64_t block = rows * 2 * kv_heads * d * 4;
  const CommStats& total = group->stats();
  if (c.comm == CpComm::AllToAll) {
    const int64_t qkv_bytes = rows * ld * 4, out_bytes = rows * out_ld * 4, lse_bytes = rows * heads * 4;
    EXPECT_EQ(forward_stats.sent(CommOp::AllToAll), (n - 1) * (qkv_bytes + out_bytes + lse_bytes) / n);
    EXPECT_EQ(forward_stats.sent(CommOp::AllGather), (n - 1) * rows * 2 * 4);
    EXPECT_EQ(total.sent(CommOp::AllToAll) - forward_stats.sent(CommOp::AllToAll),
              (n - 1) * (2 * qkv_bytes + 2 * out_bytes + lse_bytes) / n);
  } else if (c.comm == CpComm::P2P) {
    EXPECT_EQ(forward_stats.sent(CommOp::Send), (n - 1) * block);
    EXPECT_EQ(total.sent(CommOp::Send), 3 * (n - 1) * block);
    EXPECT_EQ(total.received(CommOp::Recv), 3 * (n - 1) * block);
  } else {
    EXPECT_EQ(forward_stats.sent(CommOp::AllGather), (n - 1) * block);
    EXPECT_EQ(total.sent(CommOp::AllGather), 2 * (n - 1) * block);
    EXPECT_EQ(total.sent(CommOp::ReduceScatter), (n - 1) * block);
    EXPECT_EQ(total.sent(CommOp::Send), 0);
  }
  // The planner's figures (plan::context_parallel_wire_bytes, which its step time charges) are
  // these bytes: the engine's sends, all ops together.
  ModelConfig as_model;
  as_model.n_embd = heads * d, as_model.n_head = heads, as_model.n_kv_head = kv_heads;
  plan::PlanLayout as_layout;
  as_layout.cp = n, as_layout.cp_comm = c.comm;
  const plan::CpWireBytes planned =
      plan::context_parallel_wire_bytes(as_model, as_layout, static_cast<double>(rows), 4.0);
  auto all_sent = [](const CommStats& stats) {
    int64_t sum = 0;
    for (CommOp op : {CommOp::Send, CommOp::AllGather, CommOp::ReduceScatter, CommOp::AllToAll})
      sum += stats.sent(op);
    return static_cast<double>(sum);
  };
  EXPECT_EQ(all_sent(forward_stats), planned.forward);
  EXPECT_EQ(all_sent(total) - all_sent(forward_stats), planned.backward);
  // Attention FLOPs: causal, every rank is asked for the same, and together for one process's
  // 4 D H per (query, visible key) pair: T (T + 1) / 2 pairs per sequence.
  if (!c.documents) {
    float flops = static_cast<float>(cp->forward_flops());
    std::vector<float> all(static_cast<size_t>(n));
    comm::all_gather(*group, &flops, all.data(), 1)->wait();
    const double expected_total = 4.0 * d * heads * batch * (seq * (seq + 1) / 2);
    double sum = 0;
    for (float f : all) {
      EXPECT_EQ(f, all[0]) << "the split must even out causal work";
      sum += f;
    }
    EXPECT_EQ(sum, expected_total);
  }
}

INSTANTIATE_TEST_SUITE_P(Ways, ContextAttentionParity,
                         ::testing::Values(AttentionCase{CpComm::P2P, false}, AttentionCase{CpComm::P2P, true},
                                           AttentionCase{CpComm::AllGather, false},
                                           AttentionCase{CpComm::AllGather, true},
                                           AttentionCase{CpComm::AllToAll, false},
                                           AttentionCase{CpComm::AllToAll, true}),
                         [](const auto& info) {
                           return std::string(cp_comm_name(info.param.comm)) +
                                  (info.param.documents ? "_documents" : "_causal");
                         });

// ---- the trainer ------------------------------------------------------------------------------

struct TrainCase {
  std::string arch;
  std::string comm;
  int cp, tp = 1, pp = 1, dp = 1;
  int zero_stage = 0;
  bool sequence_parallel = false;
  bool documents = false;
  int window = 0;  // a sliding window of that many keys on every second layer (the first of two)
  int ranks() const { return cp * tp * pp * dp; }
};

std::string train_case_name(const TrainCase& c) {
  return c.arch + "_" + c.comm + "_cp" + std::to_string(c.cp) +
         (c.tp > 1 ? "_tp" + std::to_string(c.tp) : "") + (c.sequence_parallel ? "_sp" : "") +
         (c.pp > 1 ? "_pp" + std::to_string(c.pp) : "") +
         (c.dp > 1 ? "_dp" + std::to_string(c.dp) : "") +
         (c.zero_stage > 0 ? "_zero" + std::to_string(c.zero_stage) : "") +
         (c.documents ? "_documents" : "") +
         (c.window > 0 ? "_window" + std::to_string(c.window) : "") + "_np" +
         std::to_string(c.ranks());
}

void PrintTo(const TrainCase& c, std::ostream* os) { *os << train_case_name(c); }

std::vector<std::string> shared_overrides(const TrainCase& c) {
  std::vector<std::string> o = {"data.val=\"\"", "optim.eps=1e-5", "optim.lr=1e-3", "optim.grad_clip=0.05",
                                "parallel.bucket_mb=0.002", "checkpoint.dir=\"\""};
  if (c.arch == "llama") o.insert(o.end(), {"model.n_head=8", "model.n_kv_head=4"});
  // Token 5 ends documents (random data holds about 1 in 64, so most run past a 16-token row and
  // are split there); positions restart in each.
  if (c.documents) o.insert(o.end(), {"data.document_mask=true", "data.eot_token=5", "data.document_positions=true",
                 "data.split_long_documents=true"});
  // A window shorter than a cp chunk (16 / 2C tokens) and longer: keys on other ranks' chunks.
  if (c.window > 0)
    o.insert(o.end(), {"model.sliding_window=" + std::to_string(c.window),
                       "model.global_attention_every=2"});
  return o;
}

class ContextParallelTraining : public ::testing::TestWithParam<TrainCase> {};

TEST_P(ContextParallelTraining, FollowsOneProcess) {
  const auto world_group = world();
  const TrainCase c = GetParam();
  if (world_group->size() != c.ranks()) GTEST_SKIP() << "layout is for " << c.ranks() << " ranks";
  TinyRun run("cp_train_" + c.arch);
  const std::string base = run.config(c.arch, kSteps);  // seq_len 16, grad_accum 2
  const std::vector<std::string> shared = shared_overrides(c);
  Trainer reference(parse(base, plus({"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/ref\""}, shared)));
  reference.run();
  Trainer parallel(parse(base, plus({"train.batch_size=" + std::to_string(kGlobalBatch / c.dp),
                                     "parallel.cp=" + std::to_string(c.cp), "parallel.cp_comm=\"" + c.comm + "\"",
                                     "parallel.tp=" + std::to_string(c.tp), "parallel.pp=" + std::to_string(c.pp),
                                     "parallel.sequence_parallel=" + std::string(c.sequence_parallel ? "true" : "false"),
                                     "parallel.zero_stage=" + std::to_string(c.zero_stage),
                                     "log.dir=\"" + run.dir + "/cp\""},
                                    shared)),
                   world_group);
  parallel.run();
  if (world_group->rank() == 0) {
    expect_losses_follow(run.dir + "/ref/metrics.jsonl", run.dir + "/cp/metrics.jsonl");
    // Each step's record: the ring's wire bytes (3 (C-1) k|v blocks per layer and micro-batch:
    // rows 8 x 16 / C of 2 x n_embd floats, GPT-2's kv heads being all its heads), and where
    // the attention's time went.
    for (const nlohmann::json& record : MetricsLog::read_all(run.dir + "/cp/metrics.jsonl")) {
      if (record.value("kind", "") == "val") continue;
      ASSERT_TRUE(record.contains("cp_attention_ms")) << record.dump();
      EXPECT_GT(record["cp_attention_ms"].get<double>(), 0.0);
      EXPECT_GE(record["cp_exposed_comm_ms"].get<double>(), 0.0);
      if (c.comm == "p2p" && c.arch == "gpt2" && c.tp == 1 && c.pp == 1 && c.dp == 1) {
        const int64_t block = kGlobalBatch * 16 / c.cp * 2 * 32 * 4;
        EXPECT_EQ(record["comm_cp"]["send"]["bytes_sent"].get<int64_t>(), 3 * (c.cp - 1) * block * 2 * 2)
            << "2 layers x 2 micro-batches";
      }
    }
  }
  // ZeRO-3 keeps a shard of each parameter between steps: gather them for the comparison.
  if (ZeroOptimizer* zero = parallel.zero_optimizer()) zero->materialize_parameters();
  const auto ref = by_name(reference.model().parameters());
  for (const Parameter* p : parallel.model().parameters()) {
    ASSERT_TRUE(ref.count(p->name)) << p->name;
    EXPECT_LE(shard_difference(ref.at(p->name)->value, p->placement, p->value), 1e-5)
        << p->name << " on rank " << world_group->rank();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ContextParallelTraining,
    ::testing::Values(
        // cp over the whole world, each way, each model; packed documents too.
        TrainCase{"gpt2", "p2p", 2}, TrainCase{"llama", "p2p", 2},
        TrainCase{"gpt2", "allgather", 2}, TrainCase{"llama", "allgather", 2},
        TrainCase{"llama", "p2p", 2, 1, 1, 1, 0, false, true},
        TrainCase{"gpt2", "allgather", 2, 1, 1, 1, 0, false, true}, TrainCase{"gpt2", "p2p", 4},
        TrainCase{"llama", "allgather", 4}, TrainCase{"llama", "p2p", 4, 1, 1, 1, 0, false, true},
        TrainCase{"gpt2", "p2p", 4, 1, 1, 1, 0, false, true},
        // Ulysses: GPT-2's 4 heads and Llama's 8 heads / 4 kv heads split over cp 2 and 4.
        TrainCase{"gpt2", "a2a", 2}, TrainCase{"llama", "a2a", 2, 1, 1, 1, 0, false, true},
        TrainCase{"llama", "a2a", 4}, TrainCase{"gpt2", "a2a", 4, 1, 1, 1, 0, false, true},
        TrainCase{"llama", "a2a", 2, 1, 1, 2, 1},
        // cp on a mesh.
        TrainCase{"gpt2", "p2p", 2, 2, 1, 1, 0, true}, TrainCase{"llama", "allgather", 2, 2},
        TrainCase{"gpt2", "p2p", 2, 1, 2},
        TrainCase{"llama", "allgather", 2, 1, 2, 1, 0, false, true},
        TrainCase{"llama", "p2p", 2, 1, 1, 2, 1}, TrainCase{"gpt2", "allgather", 2, 1, 1, 2, 3},
        TrainCase{"llama", "p2p", 2, 1, 1, 2, 3, false, true},
        TrainCase{"llama", "p2p", 2, 1, 1, 1, 0, false, true, 5},
        TrainCase{"llama", "a2a", 2, 1, 1, 1, 0, false, false, 3},
        TrainCase{"llama", "allgather", 4, 1, 1, 1, 0, false, false, 6},
        TrainCase{"llama", "p2p", 4, 1, 1, 1, 0, false, false, 3}),
    [](const auto& info) { return train_case_name(info.param); });

// Activation bytes per rank: a cp rank keeps seq / cp tokens of every sequence, so what the
// allocator counts falls by cp from one process's and equals the planner's engine figure for
// that cp (plan::predict_engine_memory), for each way attention travels and each recompute.
TEST(ContextParallelMemory, ActivationsPerRankFallByCpAsThePlannerSays) {
  const auto group = world();
  const int n = group->size();
  constexpr int64_t batch = 2, seq = 16;
  if (seq % (2 * n) != 0) GTEST_SKIP() << "seq_len 16 does not split for cp " << n;
  for (const ModelConfig& config : {tiny_gpt2(), tiny_llama()}) {
    for (const CpComm comm : {CpComm::P2P, CpComm::AllGather, CpComm::AllToAll}) {
      if (comm == CpComm::AllToAll && (config.n_head % n != 0 || config.n_kv_head % n != 0)) continue;
      for (const Recompute recompute : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        const std::string what = std::string(architecture_name(config.arch)) + " " + cp_comm_name(comm) + " " +
                                 recompute_name(recompute);
        const int64_t before = HostAllocator::instance().stats().live_bytes[static_cast<size_t>(MemCategory::Activations)];
        Transformer model(config, recompute);
        model.set_context_parallel(make_context_attention(group, comm));
        const auto tokens = random_tokens(batch * seq, config.vocab_size, 5);
        model.forward(tokens.data(), tokens.data(), batch, seq, {true, 1.0f});
        const double live = static_cast<double>(
            HostAllocator::instance().stats().live_bytes[static_cast<size_t>(MemCategory::Activations)] - before);
        const double one_process =
            plan::predict_engine_memory(config, 1, 0, 25'000'000, false, batch, seq, recompute).activations;
        EXPECT_EQ(live, plan::predict_engine_memory(config, 1, 0, 25'000'000, false, batch, seq, recompute, 1, false, n)
                            .activations)
            << what;
        EXPECT_EQ(live * n, one_process) << what;
        model.backward();
      }
    }
  }
}

// A cp run's checkpoint (whole tensors: cp shards no parameter) resumed by one process continues
// as one process that ran from the start.
TEST(ContextParallelCheckpoint, ResumesInOneProcess) {
  const auto world_group = world();
  const int n = world_group->size();
  if (n < 2) GTEST_SKIP() << "needs cp >= 2";
  TinyRun run("cp_resume");
  const std::string root = shared_path("cp_resume");
  const std::string base = run.config("llama", kSteps);  // checkpoints every 5 steps
  // optim.eps = 1e-5 (as the cp parity runs above): with a smaller eps, AdamW divides a
  // weight's near-zero gradient, a cancellation that cp's other summation order rounds
  // differently, by its own tiny square root and turns a 1e-7 rounding into a 1e-5 step (at
  // 1e-6 the o_proj weights part by 1.3e-5 on an AVX-512 EPYC, the same before and after this
  // change of the test; at 1e-5 such a gradient moves its weight by at most lr * |g| / eps).
  const std::vector<std::string> shared = {"data.val=\"\"", "model.n_head=8", "model.n_kv_head=4", "optim.eps=1e-5",
                                           "train.batch_size=" + std::to_string(kGlobalBatch)};
  Trainer parallel(parse(base, plus({"parallel.cp=" + std::to_string(n), "checkpoint.dir=\"" + root + "/cp\"",
                                     "log.dir=\"" + root + "/cp_log\""},
                                    shared)),
                   world_group);
  parallel.run();
  world_group->barrier();
  if (world_group->rank() == 0) {
    // Only the step-5 checkpoint, in a root of its own: the one process resumes there.
    std::filesystem::create_directories(root + "/half");
    for (const auto& dir : ckpt_files::list_step_dirs(root + "/cp"))
      if (dir.step == 5) std::filesystem::copy(dir.path, root + "/half/" + dir.path.filename().string(),
                                               std::filesystem::copy_options::recursive);
    Trainer reference(parse(base, plus({"checkpoint.dir=\"\"", "log.dir=\"" + root + "/ref\""}, shared)));
    reference.run();
    Trainer resumed(parse(base, plus({"checkpoint.dir=\"" + root + "/half\"", "log.dir=\"" + root + "/resumed\""},
                                     shared)));
    const TrainSummary summary = resumed.run();
    EXPECT_EQ(summary.first_step, 5);
    const auto ref = by_name(reference.model().parameters());
    for (const Parameter* p : resumed.model().parameters())
      EXPECT_LE(relative_weight_difference(ref.at(p->name)->value.to_f32_vector(), p->value.to_f32_vector()), 1e-5)
          << p->name;
    std::filesystem::remove_all(root);
  }
  world_group->barrier();
}

// What cannot work is refused before any work, saying what would.
TEST(ContextParallelLaunch, RanksThatDoNotHoldTheCpGroupAreRefused) {
  const auto world_group = world();
  const int n = world_group->size();
  TinyRun run("cp_launch");
  // cp = 2n never divides n ranks; seq_len 16 splits into 2 x 2n chunks for n <= 4.
  const int cp = 2 * n;
  if (16 % (2 * cp) != 0) GTEST_SKIP() << "seq_len 16 does not split for cp " << cp;
  const TrainConfig config = parse(run.config("gpt2", 4), {"parallel.cp=" + std::to_string(cp)});
  expect_contains(error_message([&] { Trainer trainer(config, world_group); }),
                  {"launched with " + std::to_string(n) + " rank(s)",
                   "parallel.tp x parallel.pp x parallel.cp = 1 x 1 x " + std::to_string(cp)});
}

}  // namespace
}  // namespace loom::test
