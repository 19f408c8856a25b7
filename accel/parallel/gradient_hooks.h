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

}  // namespace accel
