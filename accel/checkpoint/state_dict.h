// A module's state, walked one way for everything that reads it: save_model
// (safetensors names), get_state_dict, checkpoints and prepare's broadcast.
// The order is torch's state_dict: for each module in pre-order, its
// parameters then its buffers; names are dotted ("encoder.0.weight").
// Undefined tensors (an absent bias) are left out.
//
//   for (const accel::StateEntry& entry : accel::StateDict(*model)) {
//     std::cout << entry.name << (entry.is_buffer ? " (buffer)" : "") << "\n";
//   }
//   std::map<std::string, torch::Tensor> weights =
//   accel::StateDictOnCpu(*model);
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace accel {

struct StateEntry {
  std::string name;
  torch::Tensor tensor;  // The module's own tensor (not a copy).
  bool is_buffer = false;
};

std::vector<StateEntry> StateDict(const torch::nn::Module& module);

// Detached CPU copies by name (Accelerator::get_state_dict).
std::map<std::string, torch::Tensor> StateDictOnCpu(
    const torch::nn::Module& module);

}  // namespace accel
