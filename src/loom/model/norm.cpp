#include "loom/model/norm.hpp"

#include "loom/kernels/cpu/norms.hpp"
#include "loom/model/linear.hpp"

namespace loom {

Norm::Norm(NormKind kind, std::string name, int64_t dim, float eps)
    : kind_(kind), dim_(dim), eps_(eps) {
  allocate_parameter(weight, name + ".weight", {dim}, false);
  if (kind == NormKind::LayerNorm) allocate_parameter(bias, name + ".bias", {dim}, false);
}

void Norm::forward(float* out, NormStash& stash, const float* input, int64_t rows) const {
  if (kind_ == NormKind::LayerNorm)
    cpu::layernorm_forward(out, stash.mean.f32(), stash.rstd.f32(), input, weight.value.f32(),
                           bias.value.f32(), rows, dim_, eps_);
  else
    cpu::rmsnorm_forward(out, stash.rstd.f32(), input, weight.value.f32(), rows, dim_, eps_);
}

void Norm::backward(float* d_input, const float* d_out, const float* input, const NormStash& stash,
                    int64_t rows) {
  if (kind_ == NormKind::LayerNorm)
    cpu::layernorm_backward(d_input, weight.grad.f32(), bias.grad.f32(), d_out, input,
                            weight.value.f32(), stash.mean.f32(), stash.rstd.f32(), rows, dim_);
  else
    cpu::rmsnorm_backward(d_input, weight.grad.f32(), d_out, input, weight.value.f32(),
                          stash.rstd.f32(), rows, dim_);
}

void Norm::collect(ParameterList& out) {
  out.push_back(&weight);
  if (!bias.name.empty()) out.push_back(&bias);  // LayerNorm only
}

}  // namespace loom
