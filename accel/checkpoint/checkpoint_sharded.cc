#include "accel/checkpoint/checkpoint_sharded.h"

#include <cstdio>
#include <memory>
#include <utility>

#include "accel/checkpoint/checkpoint_archive.h"
#include "accel/checkpoint/sharded_state.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel::checkpoint_internal {

bool IsShardFileName(const std::string& name) {
  const std::string suffix = ".safetensors";
  return name.rfind("rank-", 0) == 0 && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) ==
             0 &&
         name.find("-of-") != std::string::npos;
}

bool HoldsShardedTensors(const std::string& dir) {
  if (Exists(Join(dir, kShardIndexName))) return true;
  // Shard files without their index: a damaged sharded checkpoint, which
  // the reader names as such (not as a folder of missing rank files).
  for (const std::string& name : ListFolder(dir)) {
    if (name.rfind("rank-", 0) == 0 && name.find("-of-") != std::string::npos &&
        name.size() > 12 &&
        name.compare(name.size() - 12, 12, ".safetensors") == 0) {
      return true;
    }
  }
  return false;
}

bool SavesShardedTensors(const CheckpointContents& contents, int world_size) {
  // DDP (stage 0) too: each rank writes 1/N of the state rather than the
  // main process all of it, and the checkpoint then loads at any count and
  // stage, ZeRO's included.
  return contents.sharded_tensors.has_value() && !contents.optimizers.empty();
}

std::string WriteRankShards(const std::string& dir, int rank, int world_size,
                            const CheckpointContents& contents) {
  const std::string mine = ShardFileName(rank, world_size);
  // "-of-00004.safetensors": this save's process count.
  const std::string ours = mine.substr(mine.find("-of-"));
  for (const std::string& name : ListFolder(dir)) {
    if (IsShardFileName(name) && name.find(ours) == std::string::npos) {
      std::remove(Join(dir, name).c_str());
    }
  }
  WriteShardFile(dir, rank, world_size, contents.run_id,
                 contents.sharded_tensors->pieces(),
                 contents.sharded_tensors->metadata);
  return Join(dir, mine);
}

std::string WriteShardsIndex(const std::string& dir, int world_size,
                             const std::string& run_id) {
  WriteShardIndex(dir, world_size, run_id);
  return Join(dir, kShardIndexName);
}

void SaveOptimizerOptions(const torch::optim::Optimizer& optimizer,
                          torch::serialize::OutputArchive& groups) {
  const auto& param_groups = optimizer.param_groups();
  groups.write("size", c10::IValue(int64_t(param_groups.size())));
  for (size_t i = 0; i < param_groups.size(); ++i) {
    torch::serialize::OutputArchive options;
    param_groups[i].options().serialize(options);
    groups.write(std::to_string(i), options);
  }
}

void LoadOptimizerOptions(torch::optim::Optimizer& optimizer,
                          torch::serialize::InputArchive& groups,
                          const std::string& path) {
  auto& param_groups = optimizer.param_groups();
  const int64_t size = ReadInt(groups, "size", path);
  if (size != static_cast<int64_t>(param_groups.size())) {
    throw CheckpointError("'" + path + "' holds an optimizer of " +
                          std::to_string(size) +
                          " param group(s), but this program's has " +
                          std::to_string(param_groups.size()));
  }
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> restored;
  for (size_t i = 0; i < param_groups.size(); ++i) {
    torch::serialize::InputArchive options;
    groups.read(std::to_string(i), options);
    restored.push_back(param_groups[i].options().clone());
    restored.back()->serialize(options);
  }
  for (size_t i = 0; i < param_groups.size(); ++i) {
    param_groups[i].set_options(std::move(restored[i]));
  }
}

std::vector<std::string> ReadModelNames(torch::serialize::InputArchive& state,
                                        int64_t index,
                                        const std::string& path) {
  const c10::IValue value =
      ReadValue(state, "model_names_" + std::to_string(index), path);
  if (!value.isList()) {
    throw CheckpointError("'" + path + "': model_names_" +
                          std::to_string(index) + " is not a list");
  }
  std::vector<std::string> names;
  for (const auto& name : value.toListRef()) {
    names.push_back(name.toStringRef());
  }
  return names;
}

void WriteModelNames(torch::serialize::OutputArchive& state, int64_t index,
                     const std::vector<std::string>& names) {
  c10::List<std::string> list;
  for (const std::string& name : names) list.push_back(name);
  state.write("model_names_" + std::to_string(index), c10::IValue(list));
}

}  // namespace accel::checkpoint_internal
