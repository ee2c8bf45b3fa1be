#pragma once
// What every tensor-parallel layer shares: which slice of a full tensor a tp rank holds, and
// the row collectives that move activations between the sequence-parallel region (rows split
// over tp) and the tensor-parallel region (rows whole on every tp rank).
// Tensor parallelism: Shoeybi et al., "Megatron-LM" (2019), section 3. Sequence parallelism:
// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022),
// section 4.2.2.
//
// Activations are [rows, width] with rows = batch x sequence positions, row-major. Under
// sequence parallelism tp rank r holds the contiguous rows [r*rows/tp, (r+1)*rows/tp). What
// runs in that region (norms, residual adds, dropout) is row-wise, so any contiguous split is
// correct; with batch > 1 it splits [B, T] into blocks of whole or partial sequences.
#include <cstdint>
#include <string_view>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// full / tp, or a loom::Error "<layer>: <dimension> = <full> does not divide by tp = <tp>".
int64_t tp_shard_size(std::string_view layer, std::string_view dimension, int64_t full, int tp);

// Rank `rank`'s share of `full` split along its first axis into `ranks` blocks (a 1-D tensor is
// one column). With `segments` (their sum = full rows) each segment is split on its own and the
// rank's pieces are concatenated in segment order: a fused q|k|v or gate|up weight, where rank r
// needs its heads of q, of k and of v. This is ColumnParallelLinear's weight and bias and
// VocabParallelEmbedding's table.
Tensor row_shard(const Tensor& full, int rank, int ranks, const std::vector<int64_t>& segments = {},
                 MemCategory category = MemCategory::Parameters);
// Columns [rank*cols/ranks, (rank+1)*cols/ranks) of a 2-D `full`: RowParallelLinear's weight.
Tensor column_shard(const Tensor& full, int rank, int ranks,
                    MemCategory category = MemCategory::Parameters);

// rows / tp for a sequence-parallel layer, or a loom::Error naming the layer.
int64_t sequence_shard_rows(std::string_view layer, int64_t rows, int tp);

// Sequence-parallel all-gather: every tp rank's [local_rows, width] becomes the whole
// [tp*local_rows, width] in rank order (rows are contiguous, so this is a plain all_gather).
// Tensors of any device and dtype (dist/tensor_comm stages what the group cannot take).
WorkHandle gather_sequence_rows(ProcessGroup& tp, const Tensor& local, const Tensor& full);
// Sequence-parallel reduce-scatter: the sum over tp ranks of `full` [tp*local_rows, width],
// of which rank r keeps rows [r*local_rows, (r+1)*local_rows) in `local`.
WorkHandle reduce_scatter_sequence_rows(ProcessGroup& tp, const Tensor& full, const Tensor& local);

// Under sequence parallelism a parameter replicated over tp but applied only to the rank's
// rows (norm weights and biases, RowParallelLinear's bias, a learned position table) gets a
// partial gradient from those rows alone. This sums such gradients over tp, in place; call it
// once per step after backward, before clipping and the optimizer (Megatron-LM's
// allreduce_sequence_parallel_grads).
void all_reduce_sequence_parallel_grads(const ParameterList& params, ProcessGroup& tp);

// A [rows, width] view of `buffer` in `like`'s dtype and device, reallocated only when too
// small or elsewhere: the layers' scratch for gathered inputs and unreduced partial sums.
Tensor reserve_like(Tensor& buffer, int64_t rows, int64_t width, const Tensor& like,
                    MemCategory category = MemCategory::Workspace);

}  // namespace loom
