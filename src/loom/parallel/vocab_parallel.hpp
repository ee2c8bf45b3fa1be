#pragma once
// The vocabulary split over tp: rank r holds entries [r*V/tp, (r+1)*V/tp) of the token table
// and of the output head (the same rows, so a tied embedding stays tied shard by shard).
// Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy (Shoeybi et al. 2019,
// section 3: "parallelize the output embedding GEMM ... fuse [it] with the cross entropy loss",
// which reduces the communication from b*s*V logits to b*s scalars).
// A vocabulary that does not divide by tp (GPT-2's 50257) is split unevenly, in blocks of
// ceil(V/tp) rows (model/tensor_shard.hpp), rather than padded as Megatron pads to a multiple
// of 128*tp: padded rows would join the softmax and change the model, and a checkpoint would
// depend on tp.
#include <cstdint>
#include <memory>
#include <string>

#include "loom/dist/process_group.hpp"
#include "loom/model/config.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// The vocabulary-parallel lookup without a layer object (the model's plan keeps its tables as
// the model's parameters): `table` holds rows [vocab_begin, vocab_end) of the full table; out
// is [rows, dim], or under sequence parallelism this rank's [rows/tp, dim]. `scratch` is
// reused between calls. Token ids are not checked here.
struct VocabLookup {
  const int32_t* tokens = nullptr;
  int64_t rows = 0, dim = 0, vocab_begin = 0, vocab_end = 0;
  bool sequence_parallel = false;
};
// Tensors of either device (activations F32, or BF16 on CUDA); the table gradient is F32.
void vocab_parallel_lookup(const Tensor& out, const Tensor& table, const VocabLookup& lookup,
                           ProcessGroup& tp, Tensor& scratch);
// Adds d_out (shaped like the lookup's out) into the gradient rows of the tokens in range.
void vocab_parallel_lookup_backward(const Tensor& table_grad, const Tensor& d_out,
                                    const VocabLookup& lookup, ProcessGroup& tp, Tensor& scratch);

class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(std::string name, int64_t vocab, int64_t dim,
                         std::shared_ptr<ProcessGroup> group, bool sequence_parallel);

  // tokens: [rows] ids in [0, vocab), the same on every tp rank. Each rank looks up the tokens
  // it owns (zeros for the others), then the rows are summed over tp: out is [rows, dim] on
  // every rank, or under sequence parallelism this rank's rows [rows/tp, dim].
  void forward(const Tensor& out, const int32_t* tokens, int64_t rows);
  // d_out shaped like forward's out (under sequence parallelism gathered first); adds into the
  // gradient rows of the tokens this rank owns.
  void backward(const Tensor& d_out, const int32_t* tokens, int64_t rows);

  // Copies this rank's rows out of the full table [vocab, dim].
  void load_full(const Tensor& full_table);
  void collect(ParameterList& out) { out.push_back(&weight); }

  int64_t vocab() const { return vocab_; }
  int64_t dim() const { return dim_; }
  int64_t vocab_begin() const { return vocab_begin_; }  // first id this rank owns
  int64_t vocab_end() const { return vocab_begin_ + weight.value.size(0); }
  bool sequence_parallel() const { return sequence_parallel_; }

  Parameter weight;  // [vocab/tp, dim], the full table's HF name

 private:
  VocabLookup lookup(const int32_t* tokens, int64_t rows) const;
  std::string layer_;  // "VocabParallelEmbedding '<name>'" for messages
  int64_t vocab_, dim_, vocab_begin_;
  std::shared_ptr<ProcessGroup> group_;
  bool sequence_parallel_;
  Tensor full_rows_;  // [rows, dim]: lookups before reduce-scatter / gathered d_out
};

// Tensors of one device: activations F32, or BF16 on CUDA; d_weight F32.
struct VocabParallelCrossEntropyArgs {
  Tensor hidden;                     // [rows, dim], the same on every tp rank; under sequence
                                     // parallelism this rank's rows [rows/tp, dim]
  Tensor weight;                     // [vocab/tp, dim]: this rank's head rows
  const int32_t* targets = nullptr;  // [rows] host ids of the full vocabulary, the same on every
                                     // rank; a negative target is ignored (no loss, no gradient)
  int64_t rows = 0;                          // the whole count (with or without SP)
  int64_t vocab = 0;                         // the full vocabulary
  int64_t vocab_chunk = kDefaultVocabChunk;  // logits per chunk of this rank's shard
  float grad_scale = 1.0f;                   // gradient of (grad_scale * sum of row losses)
  Tensor d_hidden;              // shaped like hidden, overwritten with the gradient summed
                                // over tp; undefined for loss only
  Tensor d_weight;              // [vocab/tp, dim] accumulated; undefined to skip
  Tensor workspace;             // F32 logits scratch on the device, reused if large enough
  float* row_losses = nullptr;  // [rows] optional host array, every rank
  double* loss_sum = nullptr;   // set (a double on the model's device): the summed loss is added
                                // there and 0 returned (ops::CrossEntropyArgs::loss_sum)
  bool sequence_parallel = false;
};

// The cross-entropy of the full-vocabulary softmax with logits that exist only in chunks of
// one rank's shard: per row, the shard's max -> all-reduce Max; its sum of exp rescaled to
// that max and the target's logit from the rank that owns it (zero elsewhere) -> one
// all-reduce Sum of both; then each rank forms softmax - onehot for its own entries, one chunk
// at a time, and d_hidden's partial sums are all-reduced (reduce-scattered under sequence
// parallelism). Returns the sum of the row losses, the same on every rank, as
// cpu::lm_head_cross_entropy does for one process.
double vocab_parallel_cross_entropy(const VocabParallelCrossEntropyArgs& args, ProcessGroup& tp);

}  // namespace loom
