#include "accel/checkpoint/state_dict.h"

namespace accel {
namespace {

void Collect(const torch::nn::Module& module, const std::string& prefix,
             std::vector<StateEntry>* out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (item.value().defined()) {
      out->push_back({prefix + item.key(), item.value(), false});
    }
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (item.value().defined()) {
      out->push_back({prefix + item.key(), item.value(), true});
    }
  }
  for (const auto& child : module.named_children()) {
    Collect(*child.value(), prefix + child.key() + ".", out);
  }
}

}  // namespace

std::vector<StateEntry> StateDict(const torch::nn::Module& module) {
  std::vector<StateEntry> entries;
  Collect(module, "", &entries);
  return entries;
}

std::map<std::string, torch::Tensor> StateDictOnCpu(
    const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> state;
  for (const StateEntry& entry : StateDict(module)) {
    state[entry.name] = entry.tensor.detach().cpu();
  }
  return state;
}

}  // namespace accel
