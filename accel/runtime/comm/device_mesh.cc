#include "accel/runtime/comm/device_mesh.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// A whole number from the environment, or `fallback` when unset.
int EnvironmentSize(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < -1000000 || value > 1000000) {
    throw UsageError(std::string(name) + " must be a whole number, found '" +
                     text + "'");
  }
  return static_cast<int>(value);
}

void RequirePositive(const char* name, int size) {
  if (size < 1) {
    throw UsageError(std::string("parallelism config: ") + name +
                     " must be at least 1, found " + std::to_string(size));
  }
}

}  // namespace

ParallelismConfig ParallelismConfig::FromEnvironment(ParallelismConfig base) {
  base.dp_replicate_size = EnvironmentSize(
      "PARALLELISM_CONFIG_DP_REPLICATE_SIZE", base.dp_replicate_size);
  base.dp_shard_size =
      EnvironmentSize("PARALLELISM_CONFIG_DP_SHARD_SIZE", base.dp_shard_size);
  base.tp_size = EnvironmentSize("PARALLELISM_CONFIG_TP_SIZE", base.tp_size);
  base.cp_size = EnvironmentSize("PARALLELISM_CONFIG_CP_SIZE", base.cp_size);
  return base;
}

ParallelismConfig ParallelismConfig::FromEnvironment() {
  return FromEnvironment(ParallelismConfig());
}

ParallelismConfig ParallelismConfig::Resolved(int num_processes) const {
  RequirePositive("dp_replicate_size", dp_replicate_size);
  RequirePositive("dp_shard_size", dp_shard_size);
  RequirePositive("tp_size", tp_size);
  RequirePositive("cp_size", cp_size);
  if ((tp_size > 1 || cp_size > 1) && dp_replicate_size > 1 &&
      dp_shard_size == 1) {
    throw UsageError(
        "parallelism config: tensor or context parallelism (tp_size or "
        "cp_size above 1) with pure replication (dp_replicate_size " +
        std::to_string(dp_replicate_size) +
        ", dp_shard_size 1) is not supported, as in Accelerate: shard the "
        "data-parallel ranks instead (dp_shard_size " +
        std::to_string(dp_replicate_size) +
        ", dp_replicate_size 1), or both (HSDP)");
  }
  ParallelismConfig resolved = *this;
  if (total_size() == 1 && num_processes > 1) {
    resolved.dp_replicate_size = num_processes;  // Plain DDP.
  }
  if (resolved.total_size() != num_processes) {
    throw UsageError("parallelism config: " + resolved.ToString() + " is " +
                     std::to_string(resolved.total_size()) +
                     " processes, but the job has " +
                     std::to_string(num_processes) +
                     "; make the product of the sizes the number of "
                     "processes");
  }
  return resolved;
}

std::string ParallelismConfig::ToString() const {
  return "dp_replicate " + std::to_string(dp_replicate_size) + " x dp_shard " +
         std::to_string(dp_shard_size) + " x cp " + std::to_string(cp_size) +
         " x tp " + std::to_string(tp_size);
}

const std::vector<std::string>& DeviceMesh::Dimensions() {
  static const std::vector<std::string> names = {"dp_replicate", "dp_shard",
                                                 "cp", "tp"};
  return names;
}

DeviceMesh::DeviceMesh(Communicator& job, const ParallelismConfig& config)
    : job_(job),
      config_(config),
      sizes_{config.dp_replicate_size, config.dp_shard_size, config.cp_size,
             config.tp_size} {
  if (config.total_size() != job.size()) {
    throw UsageError("DeviceMesh: " + config.ToString() + " is " +
                     std::to_string(config.total_size()) +
                     " processes, but the job has " +
                     std::to_string(job.size()) +
                     " (pass ParallelismConfig::Resolved(job.size()))");
  }
  int rest = job.rank();
  coordinates_.assign(sizes_.size(), 0);
  for (int d = static_cast<int>(sizes_.size()) - 1; d >= 0; --d) {
    coordinates_[d] = rest % sizes_[d];
    rest /= sizes_[d];
  }
  axes_ = {{"dp_replicate", {0}}, {"dp_shard", {1}}, {"cp", {2}},
           {"tp", {3}},           {"dp", {0, 1}},    {"dp_shard_cp", {1, 2}},
           {"dp_cp", {0, 1, 2}}};
  // In a fixed order: Split is collective.
  for (const char* name :
       {"dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp"}) {
    const std::vector<int>& axes = axes_.at(name);
    // Ranks that agree on every other dimension share a group; within it,
    // the row-major index over the group's own dimensions.
    int color = 0, key = 0;
    for (size_t d = 0; d < sizes_.size(); ++d) {
      const bool inside = std::find(axes.begin(), axes.end(),
                                    static_cast<int>(d)) != axes.end();
      (inside ? key : color) =
          (inside ? key : color) * sizes_[d] + coordinates_[d];
    }
    groups_[name] = job.Split(color, key, name);
  }
}

DeviceMesh::~DeviceMesh() = default;

const std::vector<int>& DeviceMesh::Axes(const std::string& dimension) const {
  auto it = axes_.find(dimension);
  if (it == axes_.end()) {
    std::string names;
    for (const auto& [name, axes] : axes_) {
      names += (names.empty() ? "" : ", ") + name;
    }
    throw UsageError("DeviceMesh: no dimension '" + dimension +
                     "' (there are " + names + ")");
  }
  return it->second;
}

int DeviceMesh::coordinate(const std::string& dimension) const {
  int index = 0;
  for (int d : Axes(dimension)) index = index * sizes_[d] + coordinates_[d];
  return index;
}

int DeviceMesh::size(const std::string& dimension) const {
  int product = 1;
  for (int d : Axes(dimension)) product *= sizes_[d];
  return product;
}

Communicator& DeviceMesh::group(const std::string& dimension) {
  Axes(dimension);  // Names the dimensions for an unknown one.
  return *groups_.at(dimension);
}

int DeviceMesh::RankAt(const std::vector<int>& coordinates) const {
  if (coordinates.size() != sizes_.size()) {
    throw UsageError("DeviceMesh::RankAt: expected " +
                     std::to_string(sizes_.size()) + " coordinates, found " +
                     std::to_string(coordinates.size()));
  }
  int rank = 0;
  for (size_t d = 0; d < sizes_.size(); ++d) {
    if (coordinates[d] < 0 || coordinates[d] >= sizes_[d]) {
      throw UsageError("DeviceMesh::RankAt: " + Dimensions()[d] + " " +
                       std::to_string(coordinates[d]) + " is outside [0, " +
                       std::to_string(sizes_[d]) + ")");
    }
    rank = rank * sizes_[d] + coordinates[d];
  }
  return rank;
}

}  // namespace accel
