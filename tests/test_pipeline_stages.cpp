// Pipeline stages in one process, no MPI: how layers are cut into stages, each stage building
// exactly its share of the whole model's weights, and the stages driven through every schedule's
// action lists giving the whole model's loss and gradients with one activation set per
// micro-batch in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "loom/model/pipeline_layout.hpp"
#include "loom/model/transformer.hpp"
#include "loom/parallel/pipeline_activations.hpp"
#include "loom/parallel/pipeline_executor.hpp"
#include "loom/parallel/pipeline_schedule.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "model_fixtures.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using Counts = std::vector<int64_t>;

void expect_chunk(const ModelChunk& c, int64_t stage, int64_t stages, int64_t first, int64_t end) {
  EXPECT_EQ(c.stage, stage);
  EXPECT_EQ(c.stages, stages);
  EXPECT_EQ(c.first_layer, first) << "stage " << stage;
  EXPECT_EQ(c.end_layer, end) << "stage " << stage;
  EXPECT_EQ(c.first_stage(), stage == 0);
  EXPECT_EQ(c.last_stage(), stage == stages - 1);
}

TEST(PipelineLayout, EvenSplitGivesTheFirstStagesTheExtraLayers) {
  EXPECT_EQ(stage_layer_counts(4, 2), (Counts{2, 2}));
  EXPECT_EQ(stage_layer_counts(5, 3), (Counts{2, 2, 1}));  // never the last: it runs the head
  EXPECT_EQ(stage_layer_counts(7, 4), (Counts{2, 2, 2, 1}));
  EXPECT_EQ(stage_layer_counts(3, 3), (Counts{1, 1, 1}));
  EXPECT_EQ(stage_layer_counts(6, 1), (Counts{6}));
  EXPECT_EQ(stage_layer_counts(5, 3, {1, 1, 3}), (Counts{1, 1, 3}));  // a given list is kept
}

TEST(PipelineLayout, BadSplitsNameTheKeyAndWhatWorks) {
  expect_contains(error_message([] { stage_layer_counts(2, 3); }),
                  {"3 stages", "parallel.pp x parallel.pp_chunks", "model.n_layer = 2", "use at most 2 stages"});
  expect_contains(error_message([] { stage_layer_counts(4, 0); }), {"0 stages", "expected >= 1"});
  // The key is the caller's, so the message points at the line of the config to fix.
  expect_contains(error_message([] { stage_layer_counts(4, 2, {4}, "my.layers"); }),
                  {"'my.layers'", "lists 1 stages, expected 2"});
  expect_contains(error_message([] { stage_layer_counts(4, 2, {1, 2}, "my.layers"); }),
                  {"'my.layers'", "adds up to 3", "model.n_layer = 4"});
  expect_contains(error_message([] { stage_layer_counts(4, 2, {0, 4}, "my.layers"); }),
                  {"'my.layers'", "stage 0 0 layers", "expected >= 1"});
  expect_contains(error_message([] { stage_layer_counts(4, 2, {1, 3, 0}); }), {"'parallel.pp_layers'"});
}

TEST(PipelineLayout, RankRHoldsStagesRThenRPlusPp) {
  // v = 1: rank r is stage r.
  const Counts three = {2, 1, 1};
  for (int64_t r = 0; r < 3; ++r) ASSERT_EQ(pipeline_chunks(three, 3, r).size(), 1u);
  expect_chunk(pipeline_chunks(three, 3, 0)[0], 0, 3, 0, 2);
  expect_chunk(pipeline_chunks(three, 3, 1)[0], 1, 3, 2, 3);
  expect_chunk(pipeline_chunks(three, 3, 2)[0], 2, 3, 3, 4);
  // v = 2 over pp = 2: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3 (the last).
  const Counts four = {1, 2, 1, 1};
  const auto rank0 = pipeline_chunks(four, 2, 0), rank1 = pipeline_chunks(four, 2, 1);
  ASSERT_EQ(rank0.size(), 2u);
  ASSERT_EQ(rank1.size(), 2u);
  expect_chunk(rank0[0], 0, 4, 0, 1);
  expect_chunk(rank0[1], 2, 4, 3, 4);
  expect_chunk(rank1[0], 1, 4, 1, 3);
  expect_chunk(rank1[1], 3, 4, 4, 5);
  expect_chunk(whole_model(6)[0], 0, 1, 0, 6);
  expect_contains(error_message([&] { pipeline_chunks(three, 2, 0); }), {"3 stages", "pp = 2"});
  expect_contains(error_message([&] { pipeline_chunks(four, 2, 2); }), {"rank 2", "[0, 2)"});
}

// ---- stages against the whole model -------------------------------------------------------

constexpr int64_t kBatch = 2, kSeq = 8, kMicro = 4;
constexpr uint64_t kSeed = 5;

ModelConfig four_layers(Architecture arch) {
  ModelConfig c = arch == Architecture::GPT2 ? tiny_gpt2() : tiny_llama();  // tied / untied with GQA
  c.n_layer = 4;
  return c;
}

// How one layout cuts the 4 layers, which schedule drives it, and the activation sets each rank
// ends up holding.
struct Layout {
  Counts counts;
  int64_t pp;
  PipelineSchedule schedule;
  std::vector<int64_t> sets;
  int64_t v() const { return static_cast<int64_t>(counts.size()) / pp; }
  std::string name() const {
    return std::string(schedule_name(schedule)) + " pp=" + std::to_string(pp) + " v=" + std::to_string(v());
  }
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {{2, 2}, 2, PipelineSchedule::AllForwardAllBackward, {kMicro, kMicro}},  // GPipe holds all m
      {{1, 3}, 2, PipelineSchedule::OneFOneB, {2, 1}},                          // 1F1B: p - r
      {{1, 1, 1, 1}, 4, PipelineSchedule::OneFOneB, {4, 3, 2, 1}},
      // Chunks of as many layers share idle sets, so a rank holds its most chunk-micro-batches
      // in flight at once (rank 0: 4 on chunk 0 then 2 on chunk 1, never 6 together).
      {{1, 1, 1, 1}, 2, PipelineSchedule::Interleaved, {5, 3}},
      // ZB-H1 keeps 1F1B's forwards and B's, and a set goes idle at B: 1F1B's sets.
      {{1, 3}, 2, PipelineSchedule::ZeroBubbleH1, {2, 1}},
      {{1, 1, 1, 1}, 4, PipelineSchedule::ZeroBubbleH1, {4, 3, 2, 1}},
      // ZB-V in its V (rank 0: stages 0 and 3, rank 1: stages 1 and 2): 2p chunk passes in
      // flight between F and B at most on every rank, its one-layer chunks sharing idle sets.
      {{1, 1, 1, 1}, 2, PipelineSchedule::ZeroBubbleV, {4, 4}},
  };
  return all;
}

using Ranks = std::vector<std::unique_ptr<Transformer>>;

Ranks build_ranks(const ModelConfig& config, const Layout& layout) {
  Ranks ranks;
  for (int64_t r = 0; r < layout.pp; ++r) {
    ranks.push_back(std::make_unique<Transformer>(config, Recompute::None, kDefaultVocabChunk, nullptr,
                                                  pipeline_chunks(layout.counts, layout.pp, r,
                                                                  stage_placement(layout.schedule))));
    ranks.back()->init_weights(kSeed);
  }
  return ranks;
}

std::map<std::string, const Parameter*> by_name(const Transformer& model) {
  std::map<std::string, const Parameter*> out;
  for (const Parameter* p : model.parameters()) out[p->name] = p;
  return out;
}

class PipelineStages : public ::testing::TestWithParam<Architecture> {};

TEST_P(PipelineStages, EachStageBuildsItsShareOfTheWholeModelsWeights) {
  const ModelConfig config = four_layers(GetParam());
  Transformer whole(config);
  whole.init_weights(kSeed);
  const auto whole_params = by_name(whole);
  for (const Layout& layout : layouts()) {
    SCOPED_TRACE(layout.name());
    const Ranks ranks = build_ranks(config, layout);
    std::multiset<std::string> owned;
    int copies = 0;
    for (const auto& rank : ranks) {
      const bool first = rank->chunks().front().first_stage(), last = rank->chunks().back().last_stage();
      EXPECT_EQ(rank->holds_embedding(), first);
      EXPECT_EQ(rank->holds_head(), last);
      EXPECT_FALSE(rank->is_whole());
      EXPECT_EQ(rank->has_position_embedding(), first && GetParam() == Architecture::GPT2);
      EXPECT_EQ(rank->final_norm != nullptr, last);
      EXPECT_EQ(!rank->lm_head.name.empty(), last && !config.tied_embeddings);
      EXPECT_EQ(!split_tied_embedding(*rank).empty(), config.tied_embeddings && first != last);
      int64_t layers = 0;
      for (const ModelChunk& c : rank->chunks()) layers += c.layers();
      EXPECT_EQ(static_cast<int64_t>(rank->blocks.size()), layers);
      for (const Parameter* p : rank->parameters()) {
        auto it = whole_params.find(p->name);
        ASSERT_NE(it, whole_params.end()) << p->name;
        EXPECT_EQ(p->value.to_f32_vector(), it->second->value.to_f32_vector()) << p->name;  // bitwise
        if (p->pipeline_copy) {
          ++copies;  // the last stage's replica of the tied token embedding
          EXPECT_EQ(p, &rank->token_embedding);
          EXPECT_TRUE(last && !first);
        } else {
          owned.insert(p->name);
        }
      }
    }
    // Under the V the first and last stage share rank 0: one embedding, no copy.
    EXPECT_EQ(copies, config.tied_embeddings && layout.schedule != PipelineSchedule::ZeroBubbleV ? 1 : 0);
    // Every whole-model parameter is owned by exactly one stage.
    std::multiset<std::string> expected;
    for (const auto& entry : whole_params) expected.insert(entry.first);
    EXPECT_EQ(owned, expected);
  }
}

struct Batches {
  std::vector<int32_t> tokens = random_tokens(kMicro * kBatch * kSeq, 64, 21);
  std::vector<int32_t> targets = random_tokens(kMicro * kBatch * kSeq, 64, 22);
  const int32_t* tokens_of(int64_t mb) const { return tokens.data() + mb * kBatch * kSeq; }
  const int32_t* targets_of(int64_t mb) const { return targets.data() + mb * kBatch * kSeq; }
};

// Runs every rank's actions in order, each as soon as its input exists (as the executor's
// blocking receives would), handing activations and gradients between stages by copy; rank r's
// activation sets are `pools[r]`'s. Returns the summed loss; `peak[r]` gets the most
// micro-batch-chunks rank r had in flight at once.
double run_schedule(std::vector<PipelineActivations>& pools, const Layout& layout, const Batches& mb,
                    float grad_scale, std::vector<int64_t>& peak) {
  const int64_t pp = layout.pp, v = layout.v(), stages = pp * v;
  const auto actions = pipeline_actions(layout.schedule, pp, kMicro, v);
  std::map<std::pair<int64_t, int64_t>, Tensor> activation, gradient;  // by (micro, stage)
  std::vector<int64_t> in_flight(static_cast<size_t>(pp), 0);
  peak = in_flight;
  std::vector<size_t> next(static_cast<size_t>(pp), 0);
  double loss = 0;
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int64_t r = 0; r < pp; ++r) {
      PipelineActivations& pool = pools[static_cast<size_t>(r)];
      const auto& mine = actions[static_cast<size_t>(r)];
      for (size_t& i = next[static_cast<size_t>(r)]; i < mine.size(); ++i, progressed = true) {
        const PipeAction& a = mine[i];
        const int64_t stage = stage_of(a.chunk, r, pp, stage_placement(layout.schedule)), micro = a.micro_batch;
        int64_t& held = in_flight[static_cast<size_t>(r)];
        if (a.op == PipeOp::Forward) {
          Tensor input;
          if (stage > 0) {
            auto it = activation.find({micro, stage - 1});
            if (it == activation.end()) break;  // the previous stage has not run it yet
            input = it->second;
          }
          loss += pool.forward(a.chunk, micro, stage == 0 ? mb.tokens_of(micro) : nullptr,
                                      stage == stages - 1 ? mb.targets_of(micro) : nullptr, input, kBatch, kSeq,
                                      {true, grad_scale});
          if (stage < stages - 1) {
            activation[{micro, stage}] = pool.output(a.chunk, micro).clone(MemCategory::Workspace);
          }
          auto& top = peak[static_cast<size_t>(r)];
          top = std::max(top, ++held);
        } else if (a.op == PipeOp::BackwardWeight) {
          pool.backward_weights(a.chunk, micro);
        } else {
          Tensor d_output;
          if (stage < stages - 1) {
            auto it = gradient.find({micro, stage + 1});
            if (it == gradient.end()) break;  // the next stage has not run it yet
            d_output = it->second;
          }
          const Tensor d_input = pool.backward(a.chunk, micro, d_output, a.op == PipeOp::BackwardInput);
          if (stage > 0) {
            EXPECT_TRUE(d_input.defined());
            gradient[{micro, stage}] = d_input.clone(MemCategory::Workspace);
          } else {
            EXPECT_FALSE(d_input.defined());  // the first stage has no input to differentiate
          }
          --held;
        }
      }
    }
  }
  for (int64_t r = 0; r < pp; ++r)
    EXPECT_EQ(next[static_cast<size_t>(r)], actions[static_cast<size_t>(r)].size()) << "rank " << r << " is stuck";
  return loss;
}

float max_abs(const std::vector<float>& x) {
  float m = 0;
  for (float e : x) m = std::max(m, std::fabs(e));
  return m;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  const float tolerance = 1e-5f * max_abs(want);
  EXPECT_GT(max_abs(want), 0.0f) << name << " has no gradient: the comparison would be empty";
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tolerance) << name << " [" << i << "]";
}

TEST_P(PipelineStages, ScheduledMicroBatchesGiveTheWholeModelsLossAndGradients) {
  const ModelConfig config = four_layers(GetParam());
  const Batches mb;
  const float grad_scale = 1.0f / static_cast<float>(kMicro * kBatch * kSeq);
  Transformer whole(config);
  whole.init_weights(kSeed);
  whole.zero_grad();
  double whole_loss = 0;
  for (int64_t k = 0; k < kMicro; ++k) {
    whole_loss += whole.forward(mb.tokens_of(k), mb.targets_of(k), kBatch, kSeq, {true, grad_scale});
    whole.backward();
  }
  const auto whole_params = by_name(whole);
  const std::string wte = whole.token_embedding.name;

  for (const Layout& layout : layouts()) {
    SCOPED_TRACE(layout.name());
    Ranks ranks = build_ranks(config, layout);
    std::map<std::string, int> reported;  // grad-ready reports per parameter (copy included)
    std::vector<PipelineActivations> pools;
    for (auto& rank : ranks) {
      rank->zero_grad();
      rank->set_grad_ready_hook([&](Parameter& p) { ++reported[p.name]; });
      rank->defer_grads_ready(split_tied_embedding(*rank));  // as the executor does
      pools.emplace_back(*rank);
    }
    std::vector<int64_t> peak;
    const double loss = run_schedule(pools, layout, mb, grad_scale, peak);
    EXPECT_NEAR(loss, whole_loss, 1e-6 * std::fabs(whole_loss));

    // Memory: one activation set per micro-batch-chunk between its forward and its backward
    // (or B), reused afterwards; under a split backward, what W reads from its B on. Both are
    // what the planner's replay of the same lists predicts: the sets to the count, W's copies
    // to the byte (plan/memory_model's per-stage figure, from the model's shapes).
    const auto actions = pipeline_actions(layout.schedule, layout.pp, kMicro, layout.v());
    const auto sim =
        plan::simulate_pipeline(actions, layout.pp, layout.v(), 1, 1, 0, stage_placement(layout.schedule));
    for (int64_t r = 0; r < layout.pp; ++r) {
      const auto& mine = actions[static_cast<size_t>(r)];
      const PipelineActivations& pool = pools[static_cast<size_t>(r)];
      const int64_t sets = pool.sets_allocated();
      EXPECT_EQ(sets, peak[static_cast<size_t>(r)]) << "rank " << r;
      EXPECT_EQ(sets, layout.sets[static_cast<size_t>(r)]) << "rank " << r;
      EXPECT_EQ(sets, plan::peak_activation_bytes(mine, 1, 0)) << "rank " << r;
      if (!splits_backward(layout.schedule)) {
        EXPECT_EQ(sets, sim.peak_in_flight[static_cast<size_t>(r)]) << "rank " << r;
        EXPECT_EQ(pool.peak_deferred_bytes(), 0) << "rank " << r;
        continue;
      }
      if (layout.schedule == PipelineSchedule::ZeroBubbleV) {
        // Two chunks of different W copies (the first and last stage's embedding and norm):
        // every W ran, and 2p passes stay between F and W (Qi et al. 2024 sec 3).
        EXPECT_EQ(pool.deferred_bytes(), 0) << "rank " << r;
        EXPECT_GT(pool.peak_deferred_bytes(), 0) << "rank " << r;
        EXPECT_EQ(sim.peak_in_flight[static_cast<size_t>(r)], 2 * layout.pp) << "rank " << r;
        continue;
      }
      ASSERT_EQ(layout.v(), 1);
      const ModelChunk& chunk = ranks[static_cast<size_t>(r)]->chunks()[0];
      const int64_t per_micro_batch = plan::deferred_weight_grad_bytes(
          config, chunk.layers(), chunk.first_stage(), chunk.last_stage(), kBatch * kSeq, 4);
      EXPECT_GT(per_micro_batch, 0);
      EXPECT_EQ(pool.peak_deferred_bytes(), plan::peak_activation_bytes(mine, 0, per_micro_batch)) << "rank " << r;
      EXPECT_EQ(pool.deferred_bytes(), 0) << "rank " << r << ": every W ran";
      // ZB-H1 holds back r W's on rank r: r + 1 micro-batches' copies at once (all m at most).
      EXPECT_EQ(pool.peak_deferred_bytes(), std::min<int64_t>(r + 1, kMicro) * per_micro_batch) << "rank " << r;
      // Every rank keeps at most p micro-batches between F and W (Qi et al. 2023, sec 3.1).
      EXPECT_EQ(sim.peak_in_flight[static_cast<size_t>(r)], std::min<int64_t>(layout.pp, kMicro)) << "rank " << r;
    }

    // Gradients: each owned parameter's equals the whole model's; a tied embedding split over the
    // first and last stage has its two parts summing to the whole model's.
    const Parameter* copy = nullptr;
    const Parameter* owner = nullptr;
    for (const auto& rank : ranks)
      for (const Parameter* p : rank->parameters()) {
        if (p->pipeline_copy) copy = p;
        else if (p->name == wte && !split_tied_embedding(*rank).empty()) owner = p;
        else expect_close(p->grad.to_f32_vector(), whole_params.at(p->name)->grad.to_f32_vector(), p->name);
      }
    const bool split_tied = config.tied_embeddings && layout.schedule != PipelineSchedule::ZeroBubbleV;
    ASSERT_EQ(copy != nullptr, split_tied);
    ASSERT_EQ(owner != nullptr, split_tied);
    if (copy) {
      std::vector<float> sum = owner->grad.to_f32_vector();
      const std::vector<float> head_part = copy->grad.to_f32_vector();
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += head_part[i];
      expect_close(sum, whole.token_embedding.grad.to_f32_vector(), wte + " (stage 0 + last stage's copy)");
    }
    // Every chunk reports its parameters ready once per backward, except the split tied embedding:
    // only whoever sums its parts knows it is final.
    for (const auto& [name, p] : whole_params)
      EXPECT_EQ(reported[name], copy && name == wte ? 0 : kMicro) << name;
    for (auto& rank : ranks) rank->report_grads_ready(split_tied_embedding(*rank));
    if (copy) {
      EXPECT_EQ(reported[wte], 2);
    }
  }
}

// B then W against the fused backward, in one process, for each recomputation mode. The W's of
// two micro-batches run after both B's (their copies outlive the activation sets, which the second
// forward reuses). Every parameter gradient is bitwise the fused one's, except GPT-2's tied
// embedding: its head part is computed in the forward, so with W's held back its two parts
// arrive in another order (checked to rounding instead); with each W right after its B, all are
// bitwise.
TEST_P(PipelineStages, SplitBackwardEqualsTheFusedOneBitForBit) {
  const ModelConfig config = four_layers(GetParam());
  const Batches mb;
  const float grad_scale = 1.0f / static_cast<float>(2 * kBatch * kSeq);
  for (Recompute recompute : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    for (const bool held_back : {false, true}) {
      SCOPED_TRACE(std::string("recompute ") + recompute_name(recompute) + (held_back ? ", W's held back" : ""));
      Transformer fused(config, recompute), split(config, recompute);
      for (Transformer* m : {&fused, &split}) {
        m->init_weights(kSeed);
        m->zero_grad();
      }
      std::vector<std::string> ready;
      split.set_grad_ready_hook([&](Parameter& p) { ready.push_back(p.name); });
      PipelineActivations whole(fused), parts(split);
      double fused_loss = 0, split_loss = 0;
      for (int64_t k = 0; k < 2; ++k) {
        fused_loss += whole.forward(0, k, mb.tokens_of(k), mb.targets_of(k), Tensor(), kBatch, kSeq, {true, grad_scale});
        whole.backward(0, k, Tensor());
        split_loss += parts.forward(0, k, mb.tokens_of(k), mb.targets_of(k), Tensor(), kBatch, kSeq, {true, grad_scale});
        const size_t before = ready.size();
        parts.backward(0, k, Tensor(), /*defer_weights=*/true);
        EXPECT_EQ(ready.size(), before) << "B reported gradients ready";
        if (!held_back) parts.backward_weights(0, k);
      }
      if (held_back) {
        EXPECT_EQ(parts.awaiting_weights(), 2);
        EXPECT_GT(parts.deferred_bytes(), 0);
        parts.backward_weights(0, 0);
        parts.backward_weights(0, 1);
      }
      EXPECT_EQ(parts.deferred_bytes(), 0);
      EXPECT_EQ(fused_loss, split_loss);
      EXPECT_EQ(static_cast<int64_t>(ready.size()), 2 * static_cast<int64_t>(split.parameters().size()));
      const auto want = by_name(fused);
      for (const Parameter* p : split.parameters()) {
        const std::vector<float> got = p->grad.to_f32_vector(), expected = want.at(p->name)->grad.to_f32_vector();
        if (held_back && config.tied_embeddings && p == &split.token_embedding)
          expect_close(got, expected, p->name);
        else
          EXPECT_EQ(got, expected) << p->name;
      }
    }
  }
}

// A W without its B, a B twice, and a split backward under ZeRO-3's gather hooks are refused.
TEST_P(PipelineStages, SplitBackwardMisuseIsRefused) {
  const ModelConfig config = four_layers(GetParam());
  const Batches mb;
  Transformer model(config);
  model.init_weights(kSeed);
  PipelineActivations pool(model);
  expect_contains(error_message([&] { pool.backward_weights(0, 0); }), {"W of micro-batch 0", "needs its B"});
  pool.forward(0, 0, mb.tokens_of(0), mb.targets_of(0), Tensor(), kBatch, kSeq, {true, 1.0f});
  Transformer::UnitHooks hooks;
  hooks.after_backward = [](int64_t) {};
  model.set_unit_hooks(hooks);
  expect_contains(error_message([&] { pool.backward(0, 0, Tensor(), true); }), {"ZeRO-3", "zero_stage <= 1"});
}

INSTANTIATE_TEST_SUITE_P(Archs, PipelineStages, ::testing::Values(Architecture::GPT2, Architecture::Llama),
                         [](const auto& info) { return info.param == Architecture::GPT2 ? "gpt2" : "llama"; });

TEST(PipelineStageErrors, MisuseSaysWhatIsMissing) {
  const ModelConfig config = four_layers(Architecture::GPT2);
  Transformer first(config, Recompute::None, kDefaultVocabChunk, nullptr, pipeline_chunks({2, 2}, 2, 0));
  Transformer last(config, Recompute::None, kDefaultVocabChunk, nullptr, pipeline_chunks({2, 2}, 2, 1));
  first.init_weights(kSeed);
  last.init_weights(kSeed);
  const auto tokens = random_tokens(kBatch * kSeq, 64, 1), targets = random_tokens(kBatch * kSeq, 64, 2);
  Tensor input = Tensor::empty({kBatch * kSeq, config.n_embd}, DType::F32, MemCategory::Workspace);
  std::fill_n(input.f32(), input.numel(), 0.1f);
  const Tensor none;
  const ForwardOptions train{true, 1.0f};
  // The model runs one chunk on a set its caller holds; the pool keeps them by micro-batch.
  PipelineActivations first_sets(first), last_sets(last);
  ChunkActivations never_forwarded;
  expect_contains(error_message([&] { last.backward_chunk(0, never_forwarded, none); }),
                  {"backward of chunk 0", "needs its forward with compute_grad first"});

  expect_contains(error_message([&] { last_sets.backward(0, 0, none); }),
                  {"backward of micro-batch 0", "needs its forward with compute_grad first"});
  expect_contains(error_message([&] { last_sets.forward(0, 0, nullptr, targets.data(), none, kBatch, kSeq, train); }),
                  {"pipeline stage 1 needs the previous stage's output"});
  expect_contains(error_message([&] { last_sets.forward(0, 0, nullptr, nullptr, input, kBatch, kSeq, train); }),
                  {"last pipeline stage needs targets"});
  expect_contains(error_message([&] { last_sets.forward(0, 0, nullptr, targets.data(), input.narrow_rows(0, 1), kBatch, kSeq, train); }),
                  {"pipeline stage 1: input [1, " + std::to_string(config.n_embd) + "]", std::to_string(kBatch * kSeq) + " rows"});
  expect_contains(error_message([&] { first_sets.forward(0, 0, nullptr, nullptr, none, kBatch, kSeq, train); }),
                  {"first pipeline stage needs tokens"});
  expect_contains(error_message([&] { first.forward(tokens.data(), targets.data(), kBatch, kSeq); }),
                  {"forward() runs the whole model", "forward_chunk()"});
  expect_contains(error_message([&] { first.backward(); }), {"backward() runs the whole model", "backward_chunk()"});
  expect_contains(error_message([&] { (void)last.last_logits(tokens.data(), kBatch, kSeq); }), {"whole model"});
  expect_contains(error_message([&] { (void)first.unit_parameters(1); }), {"ZeRO-3"});

  first_sets.forward(0, 0, tokens.data(), nullptr, none, kBatch, kSeq, train);
  expect_contains(error_message([&] { first_sets.forward(0, 0, tokens.data(), nullptr, none, kBatch, kSeq, train); }),
                  {"micro-batch 0 of chunk 0 ran forward twice without a backward"});
  expect_contains(error_message([&] { first_sets.backward(0, 0, none); }),
                  {"pipeline stage 0 needs the gradient of its output from the next stage"});
  expect_contains(error_message([&] { first_sets.forward(0, 1, tokens.data(), nullptr, none, 1, kSeq, train); }),
                  {"1 micro-batch(es) of 2 x 8 await their backward"});
  // A forward without gradients keeps nothing for a backward.
  last_sets.forward(0, 3, nullptr, targets.data(), input, kBatch, kSeq, {false, 1.0f});
  expect_contains(error_message([&] { last_sets.backward(0, 3, none); }), {"micro-batch 3", "compute_grad first"});
  // A chunk this rank does not hold, and an output of a micro-batch that never ran.
  expect_contains(error_message([&] { first_sets.forward(1, 0, tokens.data(), nullptr, none, kBatch, kSeq, train); }),
                  {"chunk 1 is outside this rank's 1 chunk(s)"});
  expect_contains(error_message([&] { (void)last_sets.output(0, 7); }),
                  {"no output for micro-batch 7", "run its forward first"});
  // A chunk list that leaves the model's layers is refused when the stage is built.
  expect_contains(error_message([&] {
                    Transformer bad(config, Recompute::None, kDefaultVocabChunk, nullptr, {ModelChunk{1, 2, 2, 6}});
                  }),
                  {"stage 1", "[2, 6)", "4 layers"});
}

}  // namespace
}  // namespace loom::test
