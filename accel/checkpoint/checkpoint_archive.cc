// The pieces of a checkpoint's shared file that its save, its load and
// accel-merge-weights share: paths, checked reads of archive entries, and a
// model's state as an archive (checkpoint_archive.h).
#include "accel/checkpoint/checkpoint_archive.h"

#include <sys/stat.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "accel/checkpoint/checkpoint.h"
#include "accel/checkpoint/checkpoint_file.h"
#include "accel/checkpoint/checkpoint_sharded.h"
#include "accel/checkpoint/sharded_state.h"
#include "accel/checkpoint/state_dict.h"
#include "accel/checkpoint/tensor_shares.h"
#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/dtype.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

std::string ShapeText(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " ";
  try {
    out << DTypeName(ToDType(t.scalar_type()));
  } catch (const UsageError&) {
    out << c10::toString(t.scalar_type());
  }
  return out.str();
}

}  // namespace

namespace checkpoint_internal {

std::string Join(const std::string& dir, const std::string& file) {
  return dir + "/" + file;
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

c10::IValue ReadValue(torch::serialize::InputArchive& archive,
                      const std::string& key, const std::string& path) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    throw CheckpointError("'" + path + "' has no entry '" + key +
                          "': it is not a complete accel checkpoint");
  }
  return value;
}

int64_t ReadInt(torch::serialize::InputArchive& archive, const std::string& key,
                const std::string& path) {
  c10::IValue value = ReadValue(archive, key, path);
  if (!value.isInt()) {
    throw CheckpointError("'" + path + "': entry '" + key +
                          "' is not an integer");
  }
  return value.toInt();
}

std::vector<std::pair<std::string, torch::Tensor>> NamedState(
    torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const StateEntry& entry : StateDict(module)) {
    state.emplace_back(
        (entry.is_buffer ? "buffer " : "parameter ") + entry.name,
        entry.tensor);
  }
  return state;
}

torch::serialize::OutputArchive SaveModelArchive(torch::nn::Module& module) {
  torch::serialize::OutputArchive archive;
  c10::List<std::string> names;
  int64_t index = 0;
  for (const auto& [name, tensor] : NamedState(module)) {
    names.push_back(name);
    archive.write("t" + std::to_string(index++), tensor.detach().cpu());
  }
  archive.write("names", c10::IValue(names));
  return archive;
}

std::vector<torch::Tensor> ReadModelArchive(
    torch::serialize::InputArchive& state, int64_t index,
    torch::nn::Module& module, const std::string& path) {
  const std::string key = "model_" + std::to_string(index);
  torch::serialize::InputArchive archive;
  if (!state.try_read(key, archive)) {
    throw CheckpointError("'" + path + "' has no " + key);
  }
  c10::IValue names_value = ReadValue(archive, "names", path);
  if (!names_value.isList()) {
    throw CheckpointError("'" + path + "': " + key + " has no name list");
  }
  std::vector<std::string> names;
  for (const auto& name : names_value.toListRef()) {
    names.push_back(name.toStringRef());
  }
  const auto expected = NamedState(module);
  std::vector<torch::Tensor> values(expected.size());
  std::vector<bool> found(expected.size(), false);
  for (size_t i = 0; i < names.size(); ++i) {
    size_t match = expected.size();
    for (size_t j = 0; j < expected.size(); ++j) {
      if (expected[j].first == names[i]) match = j;
    }
    if (match == expected.size()) {
      throw CheckpointError("'" + path + "': " + key + " has " + names[i] +
                            ", which the model does not have: the "
                            "checkpoint belongs to another model");
    }
    torch::Tensor value;
    archive.read("t" + std::to_string(i), value);
    const torch::Tensor& target = expected[match].second;
    if (!value.defined() || value.sizes() != target.sizes() ||
        value.scalar_type() != target.scalar_type()) {
      throw CheckpointError(
          "'" + path + "': " + key + " " + names[i] + " is " +
          (value.defined() ? ShapeText(value) : std::string("missing")) +
          " in the checkpoint but " + ShapeText(target) + " in the model");
    }
    values[match] = value;
    found[match] = true;
  }
  for (size_t j = 0; j < expected.size(); ++j) {
    if (!found[j]) {
      throw CheckpointError("'" + path + "': " + key + " lacks " +
                            expected[j].first + " of the model");
    }
  }
  return values;
}

}  // namespace checkpoint_internal

std::vector<std::pair<std::string, torch::Tensor>> ReadCheckpointWeights(
    const std::string& dir, int64_t index) {
  const std::string path = checkpoint_internal::Join(dir, kStateFile);
  if (!checkpoint_internal::Exists(path)) {
    throw CheckpointError("'" + path + "' is missing: '" + dir +
                          "' is not a complete accel checkpoint");
  }
  CheckpointFileContents file = ReadCheckpointFile(path, "accelerator_state");
  const int64_t models =
      checkpoint_internal::ReadInt(*file.archive, "num_models", path);
  if (index < 0 || index >= models) {
    throw CheckpointError("'" + path + "' holds " + std::to_string(models) +
                          " model(s); there is no model " +
                          std::to_string(index));
  }
  c10::IValue shards;
  if (file.archive->try_read("sharded_tensors", shards) && shards.isBool() &&
      shards.toBool()) {
    // The weights are in the ranks' shard files.
    // Tensor-parallel shares joined.
    const ShardedStateReader reader = ShardedStateReader::Open(dir);
    const SharesReader shares(reader);
    std::vector<std::pair<std::string, torch::Tensor>> weights;
    for (const std::string& name :
         checkpoint_internal::ReadModelNames(*file.archive, index, path)) {
      const StateName tensor{"", "model_" + std::to_string(index) + "/" + name,
                             ""};
      if (!shares.Contains(tensor)) {
        throw CheckpointError("'" + dir + "': no shard holds " +
                              tensor.Whole());
      }
      weights.emplace_back(name, shares.ReadWhole(tensor));
    }
    return weights;
  }
  const std::string key = "model_" + std::to_string(index);
  torch::serialize::InputArchive archive;
  if (!file.archive->try_read(key, archive)) {
    throw CheckpointError("'" + path + "' has no " + key);
  }
  const c10::IValue names =
      checkpoint_internal::ReadValue(archive, "names", path);
  if (!names.isList()) {
    throw CheckpointError("'" + path + "': " + key + " has no name list");
  }
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  int64_t i = 0;
  for (const auto& name : names.toListRef()) {
    std::string text = name.toStringRef();
    text = text.substr(text.find(' ') + 1);  // "parameter fc.weight"
    torch::Tensor value;
    archive.read("t" + std::to_string(i++), value);
    weights.emplace_back(text, value);
  }
  return weights;
}

}  // namespace accel
