#pragma once
// The job's ranks as a grid over the five parallelism axes, and the process group along any
// set of them. The layout is row-major over (pp, dp, cp, ep, tp) with tp innermost, so the
// ranks of one tp group are consecutive (one node's fast links) and pp, the axis that moves
// the least data, varies slowest (Megatron-LM's order, with cp and ep between dp and tp).
#include <array>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "loom/dist/process_group.hpp"
#include "loom/dist/runtime.hpp"

namespace loom {

constexpr int kMeshAxisCount = 5;
// Slowest- to fastest-varying.
constexpr std::array<std::string_view, kMeshAxisCount> kMeshAxisNames = {"pp", "dp", "cp", "ep",
                                                                         "tp"};

// Position of `axis` in kMeshAxisNames; throws loom::Error naming the valid axes.
int mesh_axis_index(std::string_view axis);

struct MeshShape {
  int pp = 1, dp = 1, cp = 1, ep = 1, tp = 1;

  int product() const;
  std::array<int, kMeshAxisCount> sizes() const { return {pp, dp, cp, ep, tp}; }
  std::string to_string() const;  // "pp=1,dp=2,cp=1,ep=1,tp=2"

  // "dp=2,tp=2" or "dp=2 tp=2": axis=size items (core/key_values) in any order; axes not named
  // have size 1.
  static MeshShape parse(std::string_view spec);
  // Every axis at least 1 and their product equal to the world size, else loom::Error naming
  // every axis size and the world size.
  void validate(int world_size) const;
};

class DeviceMesh {
 public:
  // Validates `shape` against the world. Construction is local; group() is collective.
  DeviceMesh(const DistRuntime& runtime, const MeshShape& shape);
  DeviceMesh(std::shared_ptr<ProcessGroup> world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  int rank() const { return world_->rank(); }  // in the world group
  int coordinate(std::string_view axis) const { return coordinates_[mesh_axis_index(axis)]; }
  int size(std::string_view axis) const { return sizes_[mesh_axis_index(axis)]; }
  // World rank of the process at `coordinates` (kMeshAxisNames order).
  int rank_at(const std::array<int, kMeshAxisCount>& coordinates) const;

  // The ranks that share every coordinate except those on `axes`, ranked row-major over
  // `axes` (so in a one-axis group, group rank == coordinate). Named by the axes in mesh order
  // joined with '+' ("dp+tp") and cached by that name. The first request for an axis set is
  // collective over the whole world (MPI_Comm_split): every rank must make it, in the same
  // order. An axis of size 1 gives a one-rank group whose collectives return at once.
  std::shared_ptr<ProcessGroup> group(std::initializer_list<std::string_view> axes);

 private:
  std::shared_ptr<ProcessGroup> world_;
  MeshShape shape_;
  std::array<int, kMeshAxisCount> sizes_{};
  std::array<int, kMeshAxisCount> coordinates_{};
  std::map<std::string, std::shared_ptr<ProcessGroup>, std::less<>> groups_;
};

}  // namespace loom
