#include "loom/model/norm.hpp"

#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"

namespace loom {

Norm::Norm(NormKind kind, std::string name, int64_t dim, float eps) : kind_(kind), eps_(eps) {
  allocate_parameter(weight, name + ".weight", {dim}, false);
  if (kind == NormKind::LayerNorm) allocate_parameter(bias, name + ".bias", {dim}, false);
}

void Norm::forward(const Tensor& out, NormStash& stash, const Tensor& input) const {
  if (kind_ == NormKind::LayerNorm)
    ops::layernorm_forward(out, stash.mean, stash.rstd, input, weight.value, bias.value, eps_);
  else
    ops::rmsnorm_forward(out, stash.rstd, input, weight.value, eps_);
}

void Norm::forward_added(const Tensor& out, NormStash& stash, const Tensor& sum,
                         const Tensor& residual, const Tensor& delta,
                         bool round_sum_to_bf16) const {
  ops::add_norm_forward(sum, out, stash.mean, stash.rstd, residual, delta, weight.value,
                        kind_ == NormKind::LayerNorm ? bias.value : Tensor(), eps_,
                        round_sum_to_bf16);
}

void Norm::backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input,
                    const NormStash& stash) {
  if (kind_ == NormKind::LayerNorm)
    ops::layernorm_backward(d_input, weight.grad, bias.grad, d_out, input, weight.value,
                            stash.mean, stash.rstd);
  else
    ops::rmsnorm_backward(d_input, weight.grad, d_out, input, weight.value, stash.rstd);
}

void Norm::collect(ParameterList& out) {
  out.push_back(&weight);
  if (!bias.name.empty()) out.push_back(&bias);  // LayerNorm only
}

}  // namespace loom
