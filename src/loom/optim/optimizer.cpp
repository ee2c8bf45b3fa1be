#include "loom/optim/optimizer.hpp"

#include "loom/optim/grad_clip.hpp"

namespace loom {

double Optimizer::step(double lr, double max_norm) {
  const double norm = finish_gradients();
  update(lr, clip_factor(norm, max_norm));
  return norm;
}

}  // namespace loom
