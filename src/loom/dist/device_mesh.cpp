#include "loom/dist/device_mesh.hpp"

#include <charconv>
#include <cstdint>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/core/key_values.hpp"

namespace loom {
namespace {

std::string valid_axes() {
  std::string names;
  for (std::string_view name : kMeshAxisNames) {
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

}  // namespace

int mesh_axis_index(std::string_view axis) {
  for (int i = 0; i < kMeshAxisCount; ++i)
    if (kMeshAxisNames[i] == axis) return i;
  throw_error("unknown mesh axis '", axis, "', expected one of ", valid_axes());
}

int MeshShape::product() const {
  int ranks = 1;
  for (int size : sizes()) ranks *= size;
  return ranks;
}

std::string MeshShape::to_string() const {
  std::ostringstream out;
  const auto axis_sizes = sizes();
  for (int i = 0; i < kMeshAxisCount; ++i)
    out << (i ? "," : "") << kMeshAxisNames[i] << '=' << axis_sizes[i];
  return out.str();
}

MeshShape MeshShape::parse(std::string_view spec) {
  std::array<int, kMeshAxisCount> axis_sizes{1, 1, 1, 1, 1};
  std::array<bool, kMeshAxisCount> seen{};
  for (const KeyValueItem& item : split_key_values(spec, "mesh shape")) {
    if (item.bare)
      throw_error("mesh shape '", spec, "': item '", item.key,
                  "' is not axis=size (e.g. dp=2,tp=2)");
    int index = 0;
    try {
      index = mesh_axis_index(item.key);
    } catch (const Error& e) {
      throw_error("mesh shape '", spec, "': ", e.what());
    }
    if (seen[index]) throw_error("mesh shape '", spec, "': axis '", item.key, "' is given twice");
    seen[index] = true;
    int size = 0;
    const std::string& value = item.value;
    const auto [end, status] = std::from_chars(value.data(), value.data() + value.size(), size);
    if (status != std::errc() || end != value.data() + value.size() || size < 1)
      throw_error("mesh shape '", spec, "': axis '", item.key, "' has size '", value,
                  "', expected a positive integer");
    axis_sizes[index] = size;
  }
  return MeshShape{axis_sizes[0], axis_sizes[1], axis_sizes[2], axis_sizes[3], axis_sizes[4]};
}

void MeshShape::validate(int world_size) const {
  const auto axis_sizes = sizes();
  for (int i = 0; i < kMeshAxisCount; ++i)
    if (axis_sizes[i] < 1)
      throw_error("mesh axis '", kMeshAxisNames[i], "' has size ", axis_sizes[i], " in ",
                  to_string(), ", expected >= 1");
  int64_t ranks = 1;  // in 64 bits: a mistyped shape must be reported, not overflow
  for (int size : axis_sizes) ranks *= size;
  if (ranks != world_size)
    throw_error("mesh ", to_string(), " has ", ranks, " ranks but the world size is ", world_size,
                "; the axis sizes must multiply to the world size");
}

DeviceMesh::DeviceMesh(const DistRuntime& runtime, const MeshShape& shape)
    : DeviceMesh(runtime.world(), shape) {}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, const MeshShape& shape)
    : world_(std::move(world)), shape_(shape), sizes_(shape.sizes()) {
  if (!world_) throw_error("device mesh ", shape.to_string(), ": the world process group is null");
  shape_.validate(world_->size());
  int remaining = world_->rank();  // row-major: the last axis varies fastest
  for (int i = kMeshAxisCount - 1; i >= 0; --i) {
    coordinates_[i] = remaining % sizes_[i];
    remaining /= sizes_[i];
  }
}

int DeviceMesh::rank_at(const std::array<int, kMeshAxisCount>& coordinates) const {
  int rank = 0;
  for (int i = 0; i < kMeshAxisCount; ++i) {
    if (coordinates[i] < 0 || coordinates[i] >= sizes_[i])
      throw_error("mesh ", shape_.to_string(), ": coordinate ", coordinates[i], " on axis '",
                  kMeshAxisNames[i], "' is outside [0, ", sizes_[i] - 1, "]");
    rank = rank * sizes_[i] + coordinates[i];
  }
  return rank;
}

std::shared_ptr<ProcessGroup> DeviceMesh::group(std::initializer_list<std::string_view> axes) {
  if (axes.size() == 0)
    throw_error("mesh ", shape_.to_string(), ": a process group needs at least one axis");
  std::array<bool, kMeshAxisCount> selected{};
  for (std::string_view axis : axes) {
    const int index = mesh_axis_index(axis);
    if (selected[index])
      throw_error("mesh ", shape_.to_string(), ": axis '", axis, "' is named twice in a group");
    selected[index] = true;
  }
  std::string name;
  for (int i = 0; i < kMeshAxisCount; ++i) {
    if (!selected[i]) continue;
    if (!name.empty()) name += '+';
    name += kMeshAxisNames[i];
  }
  if (auto cached = groups_.find(name); cached != groups_.end()) return cached->second;

  // color: position among the other axes (same for every member); key: position along `axes`.
  int color = 0;
  int key = 0;
  for (int i = 0; i < kMeshAxisCount; ++i) {
    if (selected[i])
      key = key * sizes_[i] + coordinates_[i];
    else
      color = color * sizes_[i] + coordinates_[i];
  }
  auto group = world_->split(color, key, name);
  groups_.emplace(name, group);
  return group;
}

}  // namespace loom
