#include "loom/train/trainer_mesh.hpp"

#include "loom/core/error.hpp"
#include "loom/dist/device_mesh.hpp"

namespace loom {

TrainerGroups make_trainer_groups(const TrainConfig& config, std::shared_ptr<ProcessGroup> world) {
  TrainerGroups g;
  const int model_parallel = config.tp * config.pp;
  if (!world) {
    if (model_parallel > 1)
      throw_error("parallel.tp = ", config.tp, " and parallel.pp = ", config.pp, " need ",
                  model_parallel, " ranks: launch under mpirun -np ", model_parallel, " (or srun)");
    if (config.dp > 1)
      throw_error("parallel.dp = ", config.dp, " needs ", config.dp,
                  " ranks: launch under mpirun -np ", config.dp,
                  " (or srun), or set parallel.dp = 0 to take whatever the launch gives");
    return g;
  }
  g.world = std::move(world);
  g.world_rank = g.world->rank();
  const int n = g.world->size();
  if (n % model_parallel != 0)
    throw_error("launched with ", n,
                " rank(s), which is not a multiple of parallel.tp x parallel.pp = ", config.tp,
                " x ", config.pp, " = ", model_parallel, ": launch dp x ", model_parallel,
                " ranks (", model_parallel, ", ", 2 * model_parallel,
                ", ...) or change parallel.tp / parallel.pp");
  if (config.dp > 0 && n != config.dp * model_parallel)
    throw_error("launched with ", n,
                " rank(s), but parallel.dp x parallel.tp x parallel.pp = ", config.dp, " x ",
                config.tp, " x ", config.pp, " = ", config.dp * model_parallel,
                ": launch mpirun -np ", config.dp * model_parallel,
                ", or set parallel.dp = 0 to take whatever the launch gives");
  if (model_parallel == 1) {
    g.dp = g.world;
  } else {
    ParallelLayout layout = config.layout();
    layout.dp = n / model_parallel;
    DeviceMesh mesh(g.world, layout.mesh_shape());
    g.dp = mesh.group({"dp"});
    if (config.tp > 1) g.tp = mesh.group({"tp"});
    if (config.pp > 1) {
      g.pp = mesh.group({"pp"});
      g.pp_rank = g.pp->rank();
      g.pp_size = g.pp->size();
      // Megatron-LM's embedding group: the two holders of the tied token embedding.
      if (config.model.tied_embeddings) {
        const bool holder = g.pp_rank == 0 || g.pp_rank == g.pp_size - 1;
        g.embedding = g.pp->split(holder ? 0 : 1, g.pp_rank, "embedding");
        if (!holder) g.embedding.reset();
      }
    }
    g.tp_size = config.tp;
  }
  g.dp_rank = g.dp->rank();
  g.dp_size = g.dp->size();
  return g;
}

}  // namespace loom
