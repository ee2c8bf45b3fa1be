#pragma once
// The trainer's ranks on one device mesh {pp, dp, cp, ep, tp} (pp outermost, tp innermost:
// DeviceMesh's order) and the process groups it trains with. Expert parallelism is carved out
// of data parallelism: the ep ranks read different data, hold the same dense parameters and
// different experts.
#include <memory>

#include "loom/dist/process_group.hpp"
#include "loom/train/train_config.hpp"

namespace loom {

struct TrainerGroups {
  std::shared_ptr<ProcessGroup> world;   // null: one process
  std::shared_ptr<ProcessGroup> dp;      // the ranks that read different data, dp (ep included)
                                         // (null: one process)
  // The ranks that hold the same parameters and average their gradients: dp x cp (a cp rank
  // saw other tokens of the same sequences), = dp without context parallelism. ZeRO shards
  // over it (null: one process). Under expert parallelism, the dense parameters' replicas.
  std::shared_ptr<ProcessGroup> replicas;
  // Expert parallelism: the ranks that hold other experts of the same layers (ep), and those
  // that hold the same experts (dp x cp without the ep axis), over which the experts' gradients
  // are averaged and their ZeRO state sharded. Null when ep = 1.
  std::shared_ptr<ProcessGroup> ep, expert_replicas;
  std::shared_ptr<ProcessGroup> tp, pp, cp;  // null when that axis has size 1
  std::shared_ptr<ProcessGroup>
      embedding;  // the first and last stage, when tied embeddings span them
  int world_rank = 0, dp_rank = 0, dp_size = 1, tp_size = 1, pp_rank = 0, pp_size = 1, cp_size = 1;
  int replica_rank = 0, replica_size = 1;
  int ep_size = 1, expert_replica_rank = 0;
};

// Lays `world` (null: one process) out as pp x dp x cp x ep x tp with tp, pp, cp and ep from
// the config (the mesh of config.layout()). Throws loom::Error saying how to launch when the
// world size is not a multiple of tp x pp x cp (x ep), not dp x tp x pp x cp when parallel.dp is
// set, or when any axis exceeds 1 without a launcher. Collective over `world`.
TrainerGroups make_trainer_groups(const TrainConfig& config, std::shared_ptr<ProcessGroup> world);

}  // namespace loom
