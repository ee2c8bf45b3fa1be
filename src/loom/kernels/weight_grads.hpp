#pragma once
// A backward split in two, for zero-bubble pipeline schedules (Qi et al. 2023, "Zero Bubble
// Pipeline Parallelism", sec 2): B computes the input gradient, which the previous stage waits
// for, and W the parameter gradients, which nothing waits for until the optimizer step.
//
// The split happens in the op layer, so every module (linear layers, their tensor-parallel
// versions, norms, embeddings, mixture-of-experts experts) splits the same way without knowing
// it: while a DeferWeightGrads scope is open on this thread, the ops that accumulate parameter
// gradients (linear_backward's weight and bias, the norms' gains, bias_grad, the embedding
// backwards) compute their input gradient at once and queue the rest, with copies of the tensors
// it reads, into a DeferredWeightGrads list. Running the list later performs exactly the calls
// the fused backward would have made, on equal values and in the same order, so B then W gives
// the fused backward's gradients bit for bit. Collectives stay in B (they produce what W reads).
#include <cstdint>
#include <functional>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom::ops {

class DeferredWeightGrads {
 public:
  DeferredWeightGrads() = default;
  DeferredWeightGrads(DeferredWeightGrads&&) = default;
  DeferredWeightGrads& operator=(DeferredWeightGrads&&) = default;

  // Copies `t` (same device and dtype, category Activations) and holds the copy until run():
  // what queued work reads in place of buffers B goes on to reuse.
  Tensor keep(const Tensor& t);
  // Keeps columns [col, col + cols) of the 2-D `t` as a contiguous [rows, cols] tensor.
  Tensor keep_columns(const Tensor& t, int64_t col, int64_t cols);
  void add(std::function<void()> work) { work_.push_back(std::move(work)); }

  // Runs every queued item in order (no recording while it runs), then frees the copies.
  void run();
  bool empty() const { return work_.empty(); }
  size_t size() const { return work_.size(); }
  // Bytes of the copies held: the memory a micro-batch costs between its B and its W.
  int64_t kept_bytes() const { return kept_bytes_; }

 private:
  std::vector<std::function<void()>> work_;
  std::vector<Tensor> kept_;
  int64_t kept_bytes_ = 0;
  const void* last_source_ = nullptr;  // what keep() copied last, and the copy
  Tensor last_copy_;
};

// The list this thread's ops queue into, or null when they run whole.
DeferredWeightGrads* deferring_weight_grads();

// While alive, this thread's ops queue their parameter-gradient work into `into`.
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(DeferredWeightGrads& into);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  DeferredWeightGrads* previous_;
};

}  // namespace loom::ops
