// Private to accel/checkpoint: what a checkpoint's save and load share
// about its shared file (accelerator_state.pt): paths, checked reads of
// archive entries, and a model's state as an archive.
//
//   torch::serialize::OutputArchive model = SaveModelArchive(*module);
//   ...
//   std::vector<torch::Tensor> values =
//       ReadModelArchive(state, /*index=*/0, *module, path);  // all checked
#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace accel::checkpoint_internal {

std::string Join(const std::string& dir, const std::string& file);
bool Exists(const std::string& path);

// The entry `key` of `archive` (read from `path`); CheckpointError naming
// both when it is missing, or (ReadInt) not an integer.
c10::IValue ReadValue(torch::serialize::InputArchive& archive,
                      const std::string& key, const std::string& path);
int64_t ReadInt(torch::serialize::InputArchive& archive, const std::string& key,
                const std::string& path);

// The model's state (state_dict.h) under the names checkpoints have always
// used: "parameter fc.weight", "buffer bn.running_mean".
std::vector<std::pair<std::string, torch::Tensor>> NamedState(
    torch::nn::Module& module);

// The model's state as saved under "model_<i>": its names and tensors.
torch::serialize::OutputArchive SaveModelArchive(torch::nn::Module& module);
// Reads and checks model `index` fully (every tensor of the model, with its
// shape and dtype), returning the tensors to copy in; CheckpointError
// naming the first difference.
std::vector<torch::Tensor> ReadModelArchive(
    torch::serialize::InputArchive& state, int64_t index,
    torch::nn::Module& module, const std::string& path);

}  // namespace accel::checkpoint_internal
