// Vocabulary-parallel embedding and cross-entropy against the full lookup and the fused
// single-process kernel (fixture and layouts: tensor_parallel_fixture.hpp).
#include "tensor_parallel_fixture.hpp"

namespace loom::test {
namespace {

// ---------------------------------------------------------------------------------------------

TEST_F(TensorParallel, VocabParallelEmbeddingMatchesTheFullLookup) {
  const std::vector<float> table = random_values(kVocab * kEmbDim, 31),
                           d = random_values(kRows * kEmbDim, 32);
  // Tokens from every quarter of the vocabulary, one of them twice (rows 0 and 7).
  std::vector<int32_t> tokens(kRows);
  for (int64_t i = 0; i < kRows; ++i) tokens[i] = static_cast<int32_t>((7 * i + 3) % kVocab);
  tokens[kRows - 1] = tokens[0];
  std::vector<float> out_ref(kRows * kEmbDim), d_table_ref(kVocab * kEmbDim, 0.0f);
  cpu::embedding_forward(out_ref.data(), tokens.data(), table.data(), nullptr, 1, kRows, kEmbDim);
  cpu::embedding_backward(d_table_ref.data(), nullptr, d.data(), tokens.data(), 1, kRows, kEmbDim);

  for (const Layout& layout : layouts(world_))
    for (bool sp : {false, true}) {
      SCOPED_TRACE(layout.label + (sp ? " sp" : ""));
      const int tp = layout.tp->size(), rank = layout.tp->rank();
      const int64_t local_rows = sp ? kRows / tp : kRows, shard = kVocab / tp;
      const int64_t r0 = sp ? rank * local_rows : 0, r1 = r0 + local_rows;
      VocabParallelEmbedding embedding("transformer.wte.weight", kVocab, kEmbDim, layout.tp, sp);
      embedding.load_full(tensor_of({kVocab, kEmbDim}, table));
      EXPECT_EQ(embedding.vocab_begin(), rank * shard);
      EXPECT_EQ(embedding.vocab_end(), (rank + 1) * shard);

      const Tensor out =
          tensor_of({local_rows, kEmbDim}, std::vector<float>(local_rows * kEmbDim, -100.0f));
      embedding.forward(out, tokens.data(), kRows);
      expect_close("embedding forward", out.to_f32_vector(),
                   row_block(out_ref.data(), kEmbDim, r0, r1));
      const Tensor d_out = tensor_of({local_rows, kEmbDim}, row_block(d.data(), kEmbDim, r0, r1));
      embedding.backward(d_out, tokens.data(), kRows);
      expect_close("embedding d_table", embedding.weight.grad.f32(),
                   row_block(d_table_ref.data(), kEmbDim, rank * shard, (rank + 1) * shard));

      std::vector<int32_t> bad = tokens;
      bad[3] = static_cast<int32_t>(kVocab);
      expect_contains(
          error_message([&] { embedding.forward(out, bad.data(), kRows); }),
          {"VocabParallelEmbedding 'transformer.wte.weight'", "token 16 at row 3", "[0, 16)"});
    }
}

// ---------------------------------------------------------------------------------------------

TEST_F(TensorParallel, VocabParallelCrossEntropyMatchesTheFusedKernel) {
  const int64_t dim = kIn;
  const std::vector<float> hidden = random_values(kRows * dim, 41),
                           weight = random_values(kVocab * dim, 42, 0.5);
  // Targets in every shard; rows 2 and 5 ignored (-1), as the fused kernel allows.
  std::vector<int32_t> targets(kRows);
  for (int64_t i = 0; i < kRows; ++i) targets[i] = static_cast<int32_t>((5 * i + 2) % kVocab);
  targets[2] = targets[5] = -1;
  const float grad_scale = 1.0f / static_cast<float>(kRows - 2);  // mean over counted rows

  std::vector<float> d_hidden_ref(kRows * dim), d_weight_ref(kVocab * dim, 0.0f), losses_ref(kRows);
  cpu::CrossEntropyArgs ref{};
  ref.hidden = hidden.data();
  ref.weight = weight.data();
  ref.targets = targets.data();
  ref.rows = kRows;
  ref.dim = dim;
  ref.vocab = kVocab;
  ref.vocab_chunk = 5;
  ref.grad_scale = grad_scale;
  ref.d_hidden = d_hidden_ref.data();
  ref.d_weight = d_weight_ref.data();
  ref.row_losses = losses_ref.data();
  const double loss_ref = cpu::lm_head_cross_entropy(ref);
  ASSERT_GT(loss_ref, 0.0);

  for (const Layout& layout : layouts(world_))
    for (bool sp : {false, true})
      for (int64_t chunk : {int64_t{3}, kVocab}) {  // chunks that split the shard unevenly, or one
        SCOPED_TRACE(layout.label + (sp ? " sp" : "") + " chunk=" + std::to_string(chunk));
        const int tp = layout.tp->size(), rank = layout.tp->rank();
        const int64_t local_rows = sp ? kRows / tp : kRows, shard = kVocab / tp;
        const int64_t r0 = sp ? rank * local_rows : 0, r1 = r0 + local_rows;
        std::vector<float> losses(kRows, -1.0f);
        VocabParallelCrossEntropyArgs args;
        args.hidden = tensor_of({local_rows, dim}, row_block(hidden.data(), dim, r0, r1));
        args.weight = tensor_of({shard, dim},
                                row_block(weight.data(), dim, rank * shard, (rank + 1) * shard));
        args.targets = targets.data();
        args.rows = kRows;
        args.vocab = kVocab;
        args.vocab_chunk = chunk;
        args.grad_scale = grad_scale;
        args.d_hidden = tensor_of({local_rows, dim}, std::vector<float>(local_rows * dim, -100.0f));
        args.d_weight = Tensor::zeros({shard, dim}, DType::F32, MemCategory::Workspace);
        args.row_losses = losses.data();
        args.sequence_parallel = sp;
        layout.tp->reset_stats();
        const double loss = vocab_parallel_cross_entropy(args, *layout.tp);

        const double loss_diff = std::fabs(loss - loss_ref) / loss_ref;
        EXPECT_LE(loss_diff, kTolerance) << loss << " vs " << loss_ref;
        worst_["cross-entropy loss sum"] = std::max(worst_["cross-entropy loss sum"], loss_diff);
        expect_close("cross-entropy row losses", losses, losses_ref);
        EXPECT_EQ(losses[2], 0.0f);
        expect_close("cross-entropy d_hidden", args.d_hidden.to_f32_vector(),
                     row_block(d_hidden_ref.data(), dim, r0, r1));
        expect_close("cross-entropy d_weight", args.d_weight.to_f32_vector(),
                     row_block(d_weight_ref.data(), dim, rank * shard, (rank + 1) * shard));

        // Only per-row scalars and d_hidden cross ranks, never [rows, vocab] logits: two
        // all-reduces of rows and 2*rows floats, then d_hidden's reduction.
        if (tp == 1) continue;
        const CommStats& stats = layout.tp->stats();
        EXPECT_EQ(stats.count(CommOp::AllReduce), sp ? 2 : 3);
        EXPECT_EQ(stats.count(CommOp::AllGather), sp ? 1 : 0);
        EXPECT_EQ(stats.count(CommOp::ReduceScatter), sp ? 1 : 0);
        const int64_t scalar_bytes = ring_all_reduce_wire_bytes(4 * kRows, tp).sent +
                                     ring_all_reduce_wire_bytes(8 * kRows, tp).sent;
        const int64_t d_hidden_bytes =
            sp ? ring_reduce_scatter_wire_bytes(4 * local_rows * dim, tp).sent
               : ring_all_reduce_wire_bytes(4 * kRows * dim, tp).sent;
        const int64_t hidden_bytes =
            sp ? ring_all_gather_wire_bytes(4 * local_rows * dim, tp).sent : 0;
        EXPECT_EQ(stats.sent(CommOp::AllReduce) + stats.sent(CommOp::ReduceScatter) +
                      stats.sent(CommOp::AllGather),
                  scalar_bytes + d_hidden_bytes + hidden_bytes);
      }
}

}  // namespace
}  // namespace loom::test
