#pragma once
// The trainer's ranks on one device mesh {pp, dp, cp, tp} (pp outermost, tp innermost:
// DeviceMesh's order) and the process groups it trains with.
#include <memory>

#include "loom/dist/process_group.hpp"
#include "loom/train/train_config.hpp"

namespace loom {

struct TrainerGroups {
  std::shared_ptr<ProcessGroup> world;   // null: one process
  std::shared_ptr<ProcessGroup> dp;      // the ranks that read different data (null: one process)
  // The ranks that hold the same parameters and average their gradients: dp x cp (a cp rank
  // saw other tokens of the same sequences), = dp without context parallelism. ZeRO shards
  // over it (null: one process).
  std::shared_ptr<ProcessGroup> replicas;
  std::shared_ptr<ProcessGroup> tp, pp, cp;  // null when that axis has size 1
  std::shared_ptr<ProcessGroup>
      embedding;  // the first and last stage, when tied embeddings span them
  int world_rank = 0, dp_rank = 0, dp_size = 1, tp_size = 1, pp_rank = 0, pp_size = 1, cp_size = 1;
  int replica_rank = 0, replica_size = 1;
};

// Lays `world` (null: one process) out as pp x dp x cp x tp with tp, pp and cp from the config
// (the mesh of config.layout()). Throws loom::Error saying how to launch when the world size is
// not a multiple of tp x pp x cp, not dp x tp x pp x cp when parallel.dp is set, or when any
// axis exceeds 1 without a launcher. Collective over `world`.
TrainerGroups make_trainer_groups(const TrainConfig& config, std::shared_ptr<ProcessGroup> world);

}  // namespace loom
