#include "loom/train/trainer_mesh.hpp"

#include <numeric>

#include "loom/core/error.hpp"
#include "loom/dist/device_mesh.hpp"

namespace loom {

TrainerGroups make_trainer_groups(const TrainConfig& config, std::shared_ptr<ProcessGroup> world) {
  TrainerGroups g;
  const int model_parallel = config.tp * config.pp * config.cp;  // the ranks of one data-parallel replica
  const std::string axes = config.cp > 1 ? "parallel.tp x parallel.pp x parallel.cp" : "parallel.tp x parallel.pp";
  const std::string degrees = config.cp > 1 ? std::to_string(config.tp) + " x " + std::to_string(config.pp) + " x " +
                                                  std::to_string(config.cp)
                                            : std::to_string(config.tp) + " x " + std::to_string(config.pp);
  if (!world) {
    if (model_parallel > 1)
      throw_error("parallel.tp = ", config.tp, config.cp > 1 ? ", " : " and ", "parallel.pp = ", config.pp,
                  config.cp > 1 ? " and parallel.cp = " + std::to_string(config.cp) : "", " need ", model_parallel,
                  " ranks: launch under mpirun -np ", model_parallel, " (or srun)");
    if (config.ep > 1)
      throw_error("parallel.ep = ", config.ep, " places the experts on ", config.ep,
                  " data-parallel ranks: launch under mpirun -np ", config.ep, " (or srun)");
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
    throw_error("launched with ", n, " rank(s), which is not a multiple of ", axes, " = ", degrees, " = ",
                model_parallel, ": launch dp x ", model_parallel, " ranks (", model_parallel, ", ", 2 * model_parallel,
                ", ...) or change ", config.cp > 1 ? "parallel.tp / parallel.pp / parallel.cp" : "parallel.tp / parallel.pp");
  if (config.dp > 0 && n != config.dp * model_parallel)
    throw_error("launched with ", n, " rank(s), but parallel.dp x ", axes, " = ", config.dp, " x ", degrees, " = ",
                config.dp * model_parallel, ": launch mpirun -np ", config.dp * model_parallel,
                ", or set parallel.dp = 0 to take whatever the launch gives");
  if ((n / model_parallel * config.cp) % config.ep != 0)
    throw_error(
        "launched with ", n, " rank(s), which gives dp = ", n / model_parallel,
        " data-parallel rank(s)",
        model_parallel > 1 ? " of " + axes + " = " + std::to_string(model_parallel) : std::string(),
        config.cp > 1 ? " and dp x cp = " + std::to_string(n / model_parallel * config.cp)
                      : std::string(),
        ", not a multiple of parallel.ep = ", config.ep,
        " (expert parallelism shards the experts over "
        "data- and context-parallel ranks): launch a multiple of ",
        config.ep / std::gcd(config.ep, config.cp) * model_parallel, " ranks");
  if (model_parallel == 1 && config.ep == 1) {
    g.dp = g.replicas = g.world;
  } else {
    ParallelLayout layout = config.layout();
    layout.dp = n / model_parallel;
    DeviceMesh mesh(g.world, layout.mesh_shape());
    if (config.ep > 1 && layout.ep_spans_cp()) {
      // ep divides dp x cp only: the replicas, cp fastest, in consecutive groups of ep (an ep
      // group spans context-parallel ranks, which hold other tokens of the same sequences);
      // the ranks at the same place in each group hold the same experts.
      g.dp = mesh.group({"dp"});
      g.replicas = mesh.group({"dp", "cp"});
      const int r = g.replicas->rank();
      g.ep = g.replicas->split(r / config.ep, r % config.ep, "ep");
      g.expert_replicas = g.replicas->split(r % config.ep, r / config.ep, "expert_replicas");
      g.ep_size = config.ep;
      g.expert_replica_rank = g.expert_replicas->rank();
    } else if (config.ep > 1) {
      g.dp = mesh.group({"dp", "ep"});
      g.replicas = mesh.group({"dp", "cp", "ep"});
      g.ep = mesh.group({"ep"});
      g.expert_replicas = mesh.group({"dp", "cp"});
      g.ep_size = config.ep;
      g.expert_replica_rank = g.expert_replicas->rank();
    } else {
      g.dp = mesh.group({"dp"});
      g.replicas = config.cp > 1 ? mesh.group({"dp", "cp"}) : g.dp;
    }
    if (config.cp > 1) g.cp = mesh.group({"cp"});
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
  g.replica_rank = g.replicas->rank();
  g.replica_size = g.replicas->size();
  g.cp_size = config.cp;
  return g;
}

}  // namespace loom
