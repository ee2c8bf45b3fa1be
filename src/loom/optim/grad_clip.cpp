#include "loom/optim/grad_clip.hpp"

#include <cmath>

#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/ops.hpp"

namespace loom {

double global_grad_norm(const ParameterList& params) {
  double sum = 0.0;
  for (const Parameter* p : params) sum += ops::sum_of_squares(p->grad);
  return std::sqrt(sum);
}

namespace {
double sum_over(ProcessGroup* group, double value) {
  if (group == nullptr || group->size() == 1) return value;
  auto v = static_cast<float>(value);  // f32 is plenty for a norm
  comm::all_reduce(*group, &v, 1, ReduceOp::Sum)->wait();
  return static_cast<double>(v);
}
}  // namespace

double sum_squares_over_model_parallel(double sharded, double replicated, ModelParallelGroups groups,
                                       double experts) {
  const double stage = sum_over(groups.tp, sharded) + replicated + (groups.ep ? sum_over(groups.ep, experts) : experts);
  return sum_over(groups.pp, stage);
}

double global_grad_norm(const ParameterList& params, ModelParallelGroups groups) {
  double sharded = 0.0, replicated = 0.0, experts = 0.0;
  for (const Parameter* p : params)
    if (!p->pipeline_copy)
      (p->expert_sharded ? experts : p->placement.replicated ? replicated : sharded) += ops::sum_of_squares(p->grad);
  return std::sqrt(sum_squares_over_model_parallel(sharded, replicated, groups, experts));
}

double clip_factor(double norm, double max_norm) {
  return max_norm > 0.0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(const ParameterList& params, double max_norm) {
  const double norm = global_grad_norm(params);
  const double factor = clip_factor(norm, max_norm);
  if (factor != 1.0)
    for (Parameter* p : params) ops::scale_(p->grad, static_cast<float>(factor));
  return norm;
}

}  // namespace loom
