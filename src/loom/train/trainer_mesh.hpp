#pragma once
// The trainer's ranks on one device mesh {pp, dp, tp} (pp outermost, tp innermost:
// DeviceMesh's order) and the process groups it trains with.
#include <memory>

#include "loom/dist/process_group.hpp"
#include "loom/train/train_config.hpp"

namespace loom {

struct TrainerGroups {
  std::shared_ptr<ProcessGroup> world;   // null: one process
  std::shared_ptr<ProcessGroup> dp;      // the replicas of this rank's shard (null: one process)
  std::shared_ptr<ProcessGroup> tp, pp;  // null when that axis has size 1
  std::shared_ptr<ProcessGroup>
      embedding;  // the first and last stage, when tied embeddings span them
  int world_rank = 0, dp_rank = 0, dp_size = 1, tp_size = 1, pp_rank = 0, pp_size = 1;
};

// Lays `world` (null: one process) out as pp x dp x tp with tp = config.tp and pp = config.pp
// (the mesh of config.layout()). Throws loom::Error saying how to launch when the world size is
// not a multiple of tp x pp, not dp x tp x pp when parallel.dp is set, or when tp, pp or dp
// exceed 1 without a launcher. Collective over `world`.
TrainerGroups make_trainer_groups(const TrainConfig& config, std::shared_ptr<ProcessGroup> world);

}  // namespace loom
