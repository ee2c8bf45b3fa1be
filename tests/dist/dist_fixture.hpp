#pragma once
// What the multi-rank tests share: the world as a dp group, config parsing, metrics reading,
// a directory every rank of the job agrees on, and a weight comparison.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "../trainer_fixture.hpp"
#include "loom/dist/mpi_process_group.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/train/trainer.hpp"

namespace loom::test {

constexpr int64_t kGlobalBatch = 8, kSteps = 10;

inline TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides) {
  ConfigReader reader = ConfigReader::from_string(text, "dp-test.toml");
  // Several ranks share the machine's cores: one thread each keeps them from thrashing.
  reader.apply_overrides({"train.threads=1"});
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}


// A parallel run's losses (its metrics file) against one process's on the same global batch:
// the first step's to 1e-6, every step's to `tolerance`, both relative.
inline void expect_losses_follow(const std::string& reference_metrics, const std::string& parallel_metrics,
                                 double tolerance = 1e-5) {
  const auto ref = losses_of(reference_metrics);
  const auto par = losses_of(parallel_metrics);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(par.size(), ref.size());
  EXPECT_NEAR(par[0], ref[0], 1e-6 * ref[0]) << "first step";
  for (size_t s = 0; s < ref.size(); ++s) EXPECT_NEAR(par[s], ref[s], tolerance * ref[s]) << "step " << s + 1;
}

// `extra` followed by `shared`: a run's own overrides plus those every run of a test shares.
inline std::vector<std::string> plus(std::vector<std::string> extra, const std::vector<std::string>& shared) {
  extra.insert(extra.end(), shared.begin(), shared.end());
  return extra;
}

inline std::shared_ptr<ProcessGroup> world() {
  return std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD, "dp",
                                           MpiProcessGroup::CommOwnership::Borrowed);
}

// One path for the whole job (rank 0's pid in it), so every rank reads and writes the same files.
inline std::string shared_path(const std::string& name) {
  int root_pid = ::getpid();
  MPI_Bcast(&root_pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / ("loom_" + name + "_" + std::to_string(root_pid))).string();
}

// A model's parameters by name (a rank's, to match against one process's).
inline std::map<std::string, const Parameter*> by_name(const ParameterList& params) {
  std::map<std::string, const Parameter*> out;
  for (const Parameter* p : params) out[p->name] = p;
  return out;
}

// relative_weight_difference of a tensor-parallel shard against the matching shard of the
// whole tensor one process holds; `placement` is the shard's.
inline double shard_difference(const Tensor& whole, const Placement& placement, const Tensor& shard) {
  const Tensor expected = take_shard(whole, placement);
  return relative_weight_difference(expected.to_f32_vector(), shard.to_f32_vector());
}

}  // namespace loom::test
