// Calls a function each time autograd has accumulated a parameter's
// gradient into its .grad: the moment DDP's buckets and ZeRO's sharded
// reduction start communicating during backward.
//
//   accel::GradientReadyHooks hooks(model->parameters(), [&](size_t i) {
//     // model->parameters()[i].grad() now holds this backward's gradient.
//   });
//   loss.backward();   // the function runs on autograd's thread
//
// A hook on the parameter's gradient accumulator (LibTorch has no module or
// parameter post-accumulate hook in 1.13); the destructor removes them.
// Parameters without an accumulator (not requiring a gradient) get none.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {

class GradientReadyHooks {
 public:
  GradientReadyHooks(const std::vector<torch::Tensor>& parameters,
                     std::function<void(size_t)> on_ready);
  ~GradientReadyHooks();
  GradientReadyHooks(const GradientReadyHooks&) = delete;
  GradientReadyHooks& operator=(const GradientReadyHooks&) = delete;

 private:
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>>
      hooks_;
};

// The error when a parameter's gradient arrives a second time in one
// backward after its reduction started (DDP's and ZeRO's reducers): what
// activation checkpointing's reentrant backward does to a layer run twice
// in one forward, each run's gradient handed over on its own.
UsageError GradientArrivedTwice(const torch::Tensor& parameter);

}  // namespace accel
