#include "loom/parallel/zero_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/transformer.hpp"
#include "loom/parallel/gradient_buckets.hpp"
#include "loom/optim/grad_clip.hpp"

namespace loom {

ZeroOptimizer::ZeroOptimizer(Transformer& model, std::shared_ptr<ProcessGroup> dp, ZeroConfig zero,
                             AdamWConfig adamw, std::shared_ptr<ProcessGroup> experts)
    : model_(model), dp_(std::move(dp)), experts_(std::move(experts)), zero_(zero), adamw_(adamw) {
  if (zero_.stage < 1 || zero_.stage > 3)
    throw_error("ZeRO stage ", zero_.stage, " is not one of 1, 2, 3");
  if (experts_ && dp_->size() % experts_->size() != 0)
    throw_error("zero: the expert-data-parallel group (", experts_->size(), " ranks) does not divide dp (",
                dp_->size(), ")");
  if (zero_.stage >= 2 && !model_.is_whole())
    throw_error("ZeRO stage ", zero_.stage, " acts per micro-batch and per model unit, which a pipeline stage "
                "does not have: use stage 1 with pipeline parallelism");
  build_flats();
  install_hooks();
}

ZeroOptimizer::~ZeroOptimizer() {
  model_.set_grad_ready_hook(nullptr);
  model_.set_unit_hooks({});
}

Device ZeroOptimizer::device() const { return model_.device(); }

DType ZeroOptimizer::working_dtype() const {
  for (Parameter* p : model_.parameters())
    if (p->value.defined()) return p->value.dtype();
  return DType::F32;
}

void ZeroOptimizer::build_flats() {
  const Device on = device();
  const DType working = working_dtype();
  std::vector<ParameterList> groups;
  std::vector<bool> expert_flat;
  std::vector<int64_t> unit_of_group;  // stage 3
  if (zero_.stage == 3) {
    // One flat per unit, or under expert parallelism two: the unit's dense parameters shard
    // over dp, its experts over the expert-data-parallel group (the ranks holding the same
    // experts); the unit gathers and releases both together.
    for (int64_t u = 0; u < model_.unit_count(); ++u) {
      ParameterList dense, experts;
      for (Parameter* p : model_.unit_parameters(u))
        (experts_ && p->expert_sharded ? experts : dense).push_back(p);
      for (ParameterList* list : {&dense, &experts}) {
        if (list->empty()) continue;
        groups.push_back(std::move(*list));
        expert_flat.push_back(list == &experts);
        unit_of_group.push_back(u);
      }
    }
  } else {
    // Experts' gradients reduce over another group than the dense ones: separate flats.
    ParameterList dense, experts;
    for (Parameter* p : model_.parameters_in_grad_ready_order()) (experts_ && p->expert_sharded ? experts : dense).push_back(p);
    for (const ParameterList* list : {&dense, &experts}) {
      if (list->empty()) continue;
      for (BucketPlan::Bucket& b : plan_gradient_buckets(*list, zero_.bucket_bytes).buckets) {
        groups.push_back(std::move(b.params));
        expert_flat.push_back(list == &experts);
      }
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    Flat& flat = flats_.emplace_back();
    flat.group = expert_flat[g] ? experts_.get() : dp_.get();
    if (expert_flat[g])
      flat.grad_scale = static_cast<float>(experts_->size()) / static_cast<float>(dp_->size());
    const int64_t ranks = flat.group->size(), rank = flat.group->rank();
    flat.params = groups[g];
    if (zero_.stage == 3) flat.unit = unit_of_group[g];
    for (Parameter* p : flat.params) {
      flat.offsets.push_back(flat.elements);
      flat.shapes.push_back(p->value.shape());
      flat.elements += p->value.numel();
      flat_of_[p] = g;
    }
    flat.padded = (flat.elements + ranks - 1) / ranks * ranks;
    flat.shard = flat.padded / ranks;
    const int64_t begin = rank * flat.shard, end = begin + flat.shard;
    for (size_t i = 0; i < flat.params.size(); ++i) {
      const int64_t p_begin = flat.offsets[i], p_end = p_begin + flat.params[i]->value.numel();
      const int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
      if (lo < hi) flat.segments.push_back({i, lo - p_begin, lo - begin, hi - lo});
    }

    // Every rank built the same initial values, so each can take its slice locally. The flats
    // live where the model does, values in its working dtype, gradients and state in F32.
    Tensor full = Tensor::zeros({flat.padded}, working, MemCategory::Parameters, on);
    for (size_t i = 0; i < flat.params.size(); ++i)
      full.slice_as(flat.offsets[i], flat.shapes[i]).copy_from(flat.params[i]->value);
    if (zero_.master_weights) {
      flat.master = Tensor::empty({flat.shard}, DType::F32, MemCategory::OptimizerState, on);
      flat.master.copy_from(full.slice_as(begin, {flat.shard}));
      ops::round_to_bf16_(full);
    }
    flat.exp_avg = Tensor::zeros({flat.shard}, DType::F32, MemCategory::OptimizerState, on);
    flat.exp_avg_sq = Tensor::zeros({flat.shard}, DType::F32, MemCategory::OptimizerState, on);
    flat.reduced = Tensor::zeros({flat.shard}, DType::F32, MemCategory::CommBuffers, on);
    for (size_t i = 0; i < flat.params.size(); ++i) flat.params[i]->grad = Tensor();
    if (zero_.stage == 3) {
      flat.param_shard = Tensor::empty({flat.shard}, working, MemCategory::Parameters, on);
      flat.param_shard.copy_from(full.slice_as(begin, {flat.shard}));
      for (Parameter* p : flat.params) p->value = Tensor();
    } else {
      flat.param_full = full;
      flat.send = Tensor::empty({flat.shard}, working, MemCategory::CommBuffers, on);
      for (size_t i = 0; i < flat.params.size(); ++i)
        flat.params[i]->value = full.slice_as(flat.offsets[i], flat.shapes[i]);
    }
    if (zero_.stage == 1) {
      flat.grad_full = Tensor::zeros({flat.padded}, DType::F32, MemCategory::Gradients, on);
      for (size_t i = 0; i < flat.params.size(); ++i)
        flat.params[i]->grad = flat.grad_full.slice_as(flat.offsets[i], flat.shapes[i]);
    } else {
      flat.grad_shard = Tensor::zeros({flat.shard}, DType::F32, MemCategory::Gradients, on);
    }
  }
  if (zero_.stage == 1) return;  // units matter to the stages that act per unit
  flats_of_unit_.resize(static_cast<size_t>(model_.unit_count()));
  for (int64_t u = 0; u < model_.unit_count(); ++u) {
    std::vector<size_t>& mine = flats_of_unit_[static_cast<size_t>(u)];
    for (Parameter* p : model_.unit_parameters(u)) {
      const auto it = flat_of_.find(p);
      if (it == flat_of_.end()) throw_error("zero: parameter '", p->name, "' is in no flat");
      const size_t f = it->second;
      if (std::find(mine.begin(), mine.end(), f) == mine.end()) mine.push_back(f);
    }
  }
}

void ZeroOptimizer::install_hooks() {
  model_.set_grad_ready_hook([this](Parameter& p) { on_grad_ready(p); });
  if (zero_.stage == 1) return;
  Transformer::UnitHooks hooks;
  hooks.before_backward = [this](int64_t unit) {
    retire_reduces();
    if (zero_.stage == 3) {
      gather_unit(unit);
      // The next unit backward needs: the last block after the root, then downwards.
      if (unit == 0) prefetch_unit(model_.unit_count() - 1);
      else if (unit > 1) prefetch_unit(unit - 1);
    }
    for (size_t f : flats_of_unit_[static_cast<size_t>(unit)]) allocate_grads(flats_[f]);
  };
  if (zero_.stage == 3) {
    hooks.before_forward = [this](int64_t unit) {
      gather_unit(unit);
      prefetch_unit(unit + 1);
    };
    hooks.after_forward = [this](int64_t unit) { release_unit(unit); };
    hooks.after_backward = [this](int64_t unit) { release_unit(unit); };
  }
  model_.set_unit_hooks(std::move(hooks));
}

Tensor ZeroOptimizer::shard_value(Flat& flat) {
  return zero_.stage == 3 ? flat.param_shard : flat.param_full.slice_as(flat.group->rank() * flat.shard, {flat.shard});
}

Tensor ZeroOptimizer::shard_grad(Flat& flat) { return zero_.stage == 1 ? flat.reduced : flat.grad_shard; }

// ---- gradients --------------------------------------------------------------------------

void ZeroOptimizer::allocate_grads(Flat& flat) {
  if (flat.grad_full.defined() && !flat.reduce_work) return;  // already live this micro-batch
  if (flat.reduce_work) complete_reduce(flat);  // the previous micro-batch's, still in flight
  flat.grad_full = Tensor::zeros({flat.padded}, DType::F32, MemCategory::Gradients, device());
  for (size_t i = 0; i < flat.params.size(); ++i)
    flat.params[i]->grad = flat.grad_full.slice_as(flat.offsets[i], flat.shapes[i]);
}

void ZeroOptimizer::on_grad_ready(Parameter& param) {
  if (zero_.stage == 1 && !sync_) return;
  const auto it = flat_of_.find(&param);
  if (it == flat_of_.end()) throw_error("zero: parameter '", param.name, "' is in no flat");
  Flat& flat = flats_[it->second];
  if (++flat.ready == static_cast<int64_t>(flat.params.size())) issue_reduce(flat);
  poll_reduces();
}

void ZeroOptimizer::issue_reduce(Flat& flat) {
  flat.ready = 0;
  flat.reduce_work = comm::reduce_scatter(*flat.group, flat.grad_full, flat.reduced, ReduceOp::Avg);
  if (zero_.stage >= 2) in_flight_.push_back(static_cast<size_t>(&flat - flats_.data()));
  // Stages 2-3: nothing may write these gradients again this micro-batch; the buffer itself
  // stays alive (held by grad_full) until the reduce-scatter has read it.
  if (zero_.stage >= 2)
    for (Parameter* p : flat.params) p->grad = Tensor();
}

void ZeroOptimizer::complete_reduce(Flat& flat) {
  flat.reduce_work->wait();
  flat.reduce_work.reset();
  const size_t index = static_cast<size_t>(&flat - flats_.data());
  in_flight_.erase(std::remove(in_flight_.begin(), in_flight_.end(), index), in_flight_.end());
  if (flat.grad_scale != 1.0f) ops::scale_(flat.reduced, flat.grad_scale);
  const bool first = !flat.reduced_this_step;
  flat.reduced_this_step = true;
  if (zero_.stage == 1) return;
  if (first) flat.grad_shard.copy_from(flat.reduced);
  else ops::add_into(flat.grad_shard, flat.reduced);
  flat.grad_full = Tensor();  // "free after use": the full-size gradients are gone
}

// MPI progresses only inside MPI calls: testing the reductions in flight from the backward
// pass drives them. Their buffers are freed at retire_reduces only, whenever they finish, so
// that the memory a step holds does not depend on how fast the other ranks are.
void ZeroOptimizer::poll_reduces() {
  if (zero_.stage == 1) return;
  for (size_t f : in_flight_) flats_[f].reduce_work->test();
}

// At each unit's backward: the reduce-scatter issued last may go on behind this unit's
// compute; the older ones are finished (by now they have had a unit's backward to run) and
// their full-size gradients freed. So a backward holds the unit's gradients, the previous
// unit's in flight and the root's (its embedding gradients come last), as FSDP does.
void ZeroOptimizer::retire_reduces() {
  while (in_flight_.size() > 1) complete_reduce(flats_[in_flight_.front()]);
}

void ZeroOptimizer::zero_grad() {
  for (Flat& flat : flats_) {
    if (zero_.stage == 1) flat.grad_full.zero_();
    flat.reduced_this_step = false;
    flat.ready = 0;
  }
}

// ---- parameters (stage 3) ---------------------------------------------------------------

void ZeroOptimizer::issue_gather(Flat& flat) {
  flat.param_full = Tensor::empty({flat.padded}, flat.param_shard.dtype(), MemCategory::Parameters, device());
  flat.gather_work = comm::all_gather(*flat.group, flat.param_shard, flat.param_full);
  flat.gather = GatherState::InFlight;
}

void ZeroOptimizer::ensure_gathered(Flat& flat) {
  if (flat.gather == GatherState::Ready) return;
  if (flat.gather == GatherState::Released) issue_gather(flat);
  flat.gather_work->wait();
  flat.gather_work.reset();
  for (size_t i = 0; i < flat.params.size(); ++i)
    flat.params[i]->value = flat.param_full.slice_as(flat.offsets[i], flat.shapes[i]);
  flat.gather = GatherState::Ready;
}

void ZeroOptimizer::release(Flat& flat) {
  if (flat.gather == GatherState::InFlight) flat.gather_work->wait();
  flat.gather_work.reset();
  for (Parameter* p : flat.params) p->value = Tensor();
  flat.param_full = Tensor();
  flat.gather = GatherState::Released;
}

void ZeroOptimizer::gather_unit(int64_t unit) {
  for (size_t f : flats_of_unit_[static_cast<size_t>(unit)]) ensure_gathered(flats_[f]);
}

void ZeroOptimizer::release_unit(int64_t unit) {
  for (size_t f : flats_of_unit_[static_cast<size_t>(unit)]) release(flats_[f]);
}

void ZeroOptimizer::prefetch_unit(int64_t unit) {
  if (unit < 1 || unit >= model_.unit_count()) return;  // the root is never prefetched
  for (size_t f : flats_of_unit_[static_cast<size_t>(unit)])
    if (flats_[f].gather == GatherState::Released) issue_gather(flats_[f]);
}

void ZeroOptimizer::materialize_parameters() {
  if (zero_.stage != 3) return;
  for (Flat& flat : flats_) ensure_gathered(flat);
}

// ---- the step ---------------------------------------------------------------------------

double ZeroOptimizer::finish_gradients() {
  double local_sum_sq[2] = {0.0, 0.0};  // sharded over tp, replicated
  for (size_t f = 0; f < flats_.size(); ++f) {
    Flat& flat = flats_[f];
    if (flat.reduce_work) complete_reduce(flat);
    if (!flat.reduced_this_step || flat.ready != 0)
      throw_error("zero: flat ", f, " was never reduced: ", flat.ready, " of ", flat.params.size(),
                  " gradients reported ready (first: '", flat.params.front()->name, "')");
    const Tensor grads = shard_grad(flat);
    for (const Segment& s : flat.segments) {  // split by placement for tensor parallelism
      const Parameter& p = *flat.params[s.param_index];
      if (p.pipeline_copy) continue;  // its owning stage counts it
      local_sum_sq[p.placement.replicated ? 1 : 0] += ops::sum_of_squares(grads.slice_as(s.shard_offset, {s.count}));
    }
  }
  // The global norm from every rank's shard: one small all-reduce over dp (f32 is enough for
  // a norm), then the sharded part over tp and every stage's over pp. An expert's flat shards
  // over the expert-data-parallel group and other ep ranks hold other experts, so summing over
  // dp (which holds both) counts every expert element once too.
  float sum_sq[2] = {static_cast<float>(local_sum_sq[0]), static_cast<float>(local_sum_sq[1])};
  comm::all_reduce(*dp_, sum_sq, 2, ReduceOp::Sum)->wait();
  return std::sqrt(sum_squares_over_model_parallel(sum_sq[0], sum_sq[1], {tp_.get(), pp_.get()}));
}

void ZeroOptimizer::skip_update() {
  if (zero_.stage == 3)
    for (Flat& flat : flats_)
      if (flat.gather != GatherState::Released) release(flat);
  zero_grad();
}

void ZeroOptimizer::update(double lr, double factor) {
  ++step_;
  // Every segment of every flat in one call: a single kernel launch on a GPU, the per-tensor
  // op in turn on the CPU.
  std::vector<ops::AdamWTensors> tensors;
  for (Flat& flat : flats_) {
    const Tensor values = shard_value(flat), grads = shard_grad(flat);
    for (const Segment& s : flat.segments) {
      const Parameter& p = *flat.params[s.param_index];
      const ops::AdamWStep step{static_cast<float>(lr), static_cast<float>(adamw_.beta1),
                                static_cast<float>(adamw_.beta2), static_cast<float>(adamw_.eps),
                                p.weight_decay ? static_cast<float>(adamw_.weight_decay) : 0.0f, step_,
                                static_cast<float>(factor)};
      const auto piece = [&](const Tensor& t) { return t.slice_as(s.shard_offset, {s.count}); };
      // With masters the update goes to the f32 master and rewrites the working values from it
      // (bf16-rounded in f32 on the CPU, bf16 storage on CUDA); otherwise to the values.
      if (zero_.master_weights)
        tensors.push_back({piece(flat.master), piece(values), piece(grads), piece(flat.exp_avg),
                           piece(flat.exp_avg_sq), step});
      else
        tensors.push_back({piece(values), Tensor{}, piece(grads), piece(flat.exp_avg),
                           piece(flat.exp_avg_sq), step});
    }
  }
  ops::adamw_update_many(tensors);
  publish_parameters();
}

void ZeroOptimizer::publish_parameters() {
  if (zero_.stage == 3) {
    // Shards are the parameters; a unit still gathered (materialize_parameters) is stale now.
    for (Flat& flat : flats_)
      if (flat.gather != GatherState::Released) release(flat);
    return;
  }
  for (Flat& flat : flats_) {
    // all_gather may not read and write the same buffer: send a copy of the updated slice.
    flat.send.copy_from(shard_value(flat));
    flat.gather_work = comm::all_gather(*flat.group, flat.send, flat.param_full);
  }
  for (Flat& flat : flats_) {
    flat.gather_work->wait();
    flat.gather_work.reset();
  }
}

// ---- checkpoints ------------------------------------------------------------------------

std::vector<OwnedSlice> ZeroOptimizer::owned_slices() {
  std::vector<OwnedSlice> out;
  for (Flat& flat : flats_) {
    const Tensor values = shard_value(flat);
    for (const Segment& s : flat.segments) {
      OwnedSlice slice;
      slice.param = flat.params[s.param_index];
      slice.shape = flat.shapes[s.param_index];
      slice.start = s.param_offset;
      slice.count = s.count;
      slice.value = values.slice_as(s.shard_offset, {s.count});
      slice.exp_avg = flat.exp_avg.slice_as(s.shard_offset, {s.count});
      slice.exp_avg_sq = flat.exp_avg_sq.slice_as(s.shard_offset, {s.count});
      if (zero_.master_weights) slice.master = flat.master.slice_as(s.shard_offset, {s.count});
      out.push_back(slice);
    }
  }
  return out;
}

std::vector<ZeroOptimizer::FlatSize> ZeroOptimizer::flat_sizes() const {
  std::vector<FlatSize> out;
  for (const Flat& flat : flats_) out.push_back({flat.elements, flat.padded, flat.shard, flat.unit == 0});
  return out;
}

}  // namespace loom
