#include "loom/optim/grad_clip.hpp"

#include <cmath>
#include <vector>

#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/ops.hpp"

namespace loom {

namespace {
// Each parameter's sum of squared gradients, read from the device in one go.
std::vector<double> grad_sums_of_squares(const ParameterList& params) {
  std::vector<const Tensor*> grads;
  grads.reserve(params.size());
  for (const Parameter* p : params) grads.push_back(&p->grad);
  return ops::sums_of_squares(grads);
}
}  // namespace

double global_grad_norm(const ParameterList& params) {
  double sum = 0.0;
  for (double s : grad_sums_of_squares(params)) sum += s;  // in parameter order, as before
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
  ParameterList counted;  // a pipeline stage's copy of a tied weight is counted once, elsewhere
  for (Parameter* p : params)
    if (!p->pipeline_copy) counted.push_back(p);
  double sharded = 0.0, replicated = 0.0, experts = 0.0;
  const std::vector<double> sums = grad_sums_of_squares(counted);
  for (size_t i = 0; i < counted.size(); ++i) {
    const Parameter* p = counted[i];
    (p->expert_sharded ? experts : p->placement.replicated ? replicated : sharded) += sums[i];
  }
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
