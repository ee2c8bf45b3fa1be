#include "loom/kernels/weight_grads.hpp"

#include <cstring>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"

namespace loom::ops {

namespace {
thread_local DeferredWeightGrads* current = nullptr;
}

DeferredWeightGrads* deferring_weight_grads() { return current; }

DeferWeightGrads::DeferWeightGrads(DeferredWeightGrads& into) : previous_(current) {
  current = &into;
}

DeferWeightGrads::~DeferWeightGrads() { current = previous_; }

Tensor DeferredWeightGrads::keep(const Tensor& t) {
  // Projections that share an input (q, k and v; gate and up; a tensor-parallel fan-out's
  // layers) keep it once: the last copy serves again when its source still holds the same
  // bytes (compared, so a buffer rewritten in between is copied afresh). CPU only.
  if (last_source_ != nullptr && t.device() == Device::CPU && t.raw() == last_source_ &&
      t.shape() == last_copy_.shape() && t.dtype() == last_copy_.dtype() &&
      std::memcmp(t.raw(), last_copy_.raw(), t.nbytes()) == 0)
    return last_copy_;
  Tensor copy = t.clone(MemCategory::Activations);
  kept_bytes_ += static_cast<int64_t>(copy.nbytes());
  kept_.push_back(copy);
  last_source_ = t.raw();
  last_copy_ = copy;
  return copy;
}

Tensor DeferredWeightGrads::keep_columns(const Tensor& t, int64_t col, int64_t cols) {
  LOOM_CHECK(t.dim() == 2 && col >= 0 && col + cols <= t.size(1), "keep_columns: columns [", col, ", ",
             col + cols, ") of ", shape_to_string(t.shape()));
  if (col == 0 && cols == t.size(1)) return keep(t);
  Tensor copy = Tensor::empty({t.size(0), cols}, t.dtype(), MemCategory::Activations, t.device());
  copy_columns(copy, 0, t, col, cols);
  kept_bytes_ += static_cast<int64_t>(copy.nbytes());
  kept_.push_back(copy);
  return copy;
}

void DeferredWeightGrads::run() {
  DeferredWeightGrads* const outer = current;
  current = nullptr;  // the queued calls run whole
  try {
    for (auto& work : work_) work();
  } catch (...) {
    current = outer;
    throw;
  }
  current = outer;
  work_.clear();
  kept_.clear();
  kept_bytes_ = 0;
  last_source_ = nullptr;
  last_copy_ = Tensor();
}

}  // namespace loom::ops
