// An elementwise optimizer's per-parameter state as named tensors and
// counts, and back: what sharded checkpoints (accel/checkpoint/
// checkpoint.h) save of each parameter's state, cut like the parameter, so
// that any process count and ZeRO stage can read it back.
//
//   std::optional<accel::ParamStateValues> values =
//       accel::ReadParamState(*optimizer.state().at(key));
//   // values->tensors: {"exp_avg", t}, {"exp_avg_sq", t}; counts: {"step", 30}
//   optimizer.state()[key] = accel::MakeParamState(optimizer, *values);
//
// Known: LibTorch's Adam, AdamW, SGD, Adagrad and RMSprop (and their
// subclasses, such as accel's FusedAdamW), and accel's AdamWScheduleFree:
// every tensor of their state has the parameter's shape (an undefined one,
// such as Adam's max_exp_avg_sq without amsgrad, is left out), every other
// value is an integer count.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace accel {

struct ParamStateValues {
  std::map<std::string, torch::Tensor> tensors;  // The parameter's shape.
  std::map<std::string, int64_t> counts;         // "step".
};

// Whether the optimizer's state is one ReadParamState knows.
bool KnowsParamState(const torch::optim::Optimizer& optimizer);

// The state's values (the tensors are the state's own, not copies);
// nullopt for a state of a type it does not know.
std::optional<ParamStateValues> ReadParamState(
    const torch::optim::OptimizerParamState& state);

// A state of `optimizer`'s type holding `values` (taken as they are).
// UsageError for an optimizer it does not know; CheckpointError naming the
// key when a value the type needs is missing.
std::unique_ptr<torch::optim::OptimizerParamState> MakeParamState(
    const torch::optim::Optimizer& optimizer, const ParamStateValues& values,
    const std::string& parameter);

}  // namespace accel
