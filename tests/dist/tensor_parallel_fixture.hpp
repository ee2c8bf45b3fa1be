// Shared by the tensor-parallel layer tests: tensor- and sequence-parallel layers against their unsharded twins (the shape of nanotron's
// and torchtitan's TP tests). Every rank builds the same seeded full weights, inputs and output
// gradients, runs the plain layer on them locally, and runs the parallel layer on its shards;
// its outputs and gradients must equal the matching slices of the plain layer's. Layouts: tp =
// world size, and at 4 ranks also dp = 2 x tp = 2; each with and without sequence parallelism,
// GPT-2 style (biases) and Llama style (none).
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "loom/core/rng.hpp"
#include "loom/dist/device_mesh.hpp"
#include "loom/dist/mpi_process_group.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cpu/embedding.hpp"
#include "loom/model/linear.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_linear.hpp"
#include "loom/parallel/vocab_parallel.hpp"

namespace loom::test {

// Largest difference over the largest reference value. f32 sums taken in another order (a
// GEMM over a shard, then a reduction over ranks) differ from one process by a few ulp of
// the sum, ~1e-7 here; a wrong slice or a missing or doubled term is off by O(1).
constexpr double kTolerance = 1e-5;
constexpr double kCommTimeoutSeconds = 20.0;  // a rank stuck after a failure ends the job soon
constexpr uint64_t kSeed = 1234;

// Small enough for seconds at 4 ranks; every split dimension divides by 4, and rows = 2 x 4
// (batch x sequence).
constexpr int64_t kRows = 8, kIn = 12, kOut = 16, kFfn = 16, kVocab = 16, kEmbDim = 8;

struct Layout {
  std::string label;
  std::shared_ptr<ProcessGroup> tp;
};

// tp = world, and dp=2 x tp=2 at 4 ranks. Mesh groups are collective to make: every rank
// calls this at the same point of every test.
inline std::vector<Layout> layouts(std::shared_ptr<ProcessGroup> world) {
  const int n = world->size();
  std::vector<MeshShape> shapes = {MeshShape{.tp = n}};
  if (n == 4) shapes.push_back(MeshShape{.dp = 2, .tp = 2});
  std::vector<Layout> out;
  for (const MeshShape& shape : shapes) {
    DeviceMesh mesh(world, shape);
    out.push_back({shape.to_string(), mesh.group({"tp"})});
  }
  return out;
}

inline std::vector<float> random_values(int64_t count, uint64_t stream, double scale = 1.0) {
  const CounterRng rng(kSeed, stream);
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>(scale * rng.normal(i));
  return v;
}

inline Tensor tensor_of(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

// Rows [r0, r1) of a row-major matrix with `cols` columns.
inline std::vector<float> row_block(const float* m, int64_t cols, int64_t r0, int64_t r1) {
  return std::vector<float>(m + r0 * cols, m + r1 * cols);
}

// For each row, rank `rank`'s columns of every segment, side by side. Written out here
// rather than through the library's shard helpers, so a wrong slice there cannot hide.
inline std::vector<float> segment_columns(const float* m, int64_t rows,
                                   const std::vector<int64_t>& segments, int rank, int ranks) {
  const int64_t cols = std::accumulate(segments.begin(), segments.end(), int64_t{0});
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0;
    for (int64_t seg : segments) {
      const int64_t share = seg / ranks, begin = offset + rank * share;
      for (int64_t c = begin; c < begin + share; ++c) out.push_back(m[r * cols + c]);
      offset += seg;
    }
  }
  return out;
}

// Rank `rank`'s rows of every segment, concatenated (a [sum(segments), cols] matrix).
inline std::vector<float> segment_rows(const float* m, int64_t cols, const std::vector<int64_t>& segments,
                                int rank, int ranks) {
  std::vector<float> out;
  int64_t offset = 0;
  for (int64_t seg : segments) {
    const int64_t share = seg / ranks;
    const std::vector<float> block =
        row_block(m, cols, offset + rank * share, offset + (rank + 1) * share);
    out.insert(out.end(), block.begin(), block.end());
    offset += seg;
  }
  return out;
}

inline std::vector<float> scaled(std::vector<float> v, float factor) {
  for (float& x : v) x *= factor;
  return v;
}

class TensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD, "world",
                                               MpiProcessGroup::CommOwnership::Borrowed);
    world_->set_timeout_seconds(kCommTimeoutSeconds);
  }
  // With LOOM_TP_REPORT set, rank 0 prints each check's worst relative difference over all
  // ranks and layouts.
  // The maximum over ranks is a collective, hence only on request.
  void TearDown() override {
    if (std::getenv("LOOM_TP_REPORT") == nullptr) return;
    std::vector<double> values;
    for (const auto& entry : worst_) values.push_back(entry.second);
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX,
                  MPI_COMM_WORLD);
    if (world_->rank() != 0) return;
    size_t i = 0;
    for (const auto& entry : worst_)
      std::printf("  worst relative difference over ranks: %-36s %.3g\n", entry.first.c_str(),
                  values[i++]);
  }

  // Fails unless max|got - expected| <= kTolerance * max|expected|.
  void expect_close(const std::string& what, const float* got, const std::vector<float>& expected) {
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - expected[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(expected[i])));
    }
    EXPECT_GT(max_ref, 0.0) << what << ": an all-zero reference proves nothing";
    const double relative = max_diff / std::max(max_ref, 1e-30);
    EXPECT_LE(relative, kTolerance) << what << " on rank " << world_->rank();
    double& w = worst_[what];
    w = std::max(w, relative);
  }
  void expect_close(const std::string& what, const std::vector<float>& got,
                    const std::vector<float>& expected) {
    ASSERT_EQ(got.size(), expected.size()) << what;
    expect_close(what, got.data(), expected);
  }

  std::shared_ptr<ProcessGroup> world_;
  std::map<std::string, double> worst_;
};


}  // namespace loom::test
