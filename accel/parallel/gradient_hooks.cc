#include "accel/parallel/gradient_hooks.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace accel {
namespace {

class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradientReadyHook(std::shared_ptr<std::function<void(size_t)>> on_ready,
                    size_t index)
      : on_ready_(std::move(on_ready)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    (*on_ready_)(index_);
    return outputs;
  }

 private:
  std::shared_ptr<std::function<void(size_t)>> on_ready_;
  size_t index_;
};

}  // namespace

GradientReadyHooks::GradientReadyHooks(
    const std::vector<torch::Tensor>& parameters,
    std::function<void(size_t)> on_ready) {
  auto shared =
      std::make_shared<std::function<void(size_t)>>(std::move(on_ready));
  for (size_t index = 0; index < parameters.size(); ++index) {
    auto accumulator =
        torch::autograd::impl::grad_accumulator(parameters[index]);
    if (!accumulator) continue;
    const uintptr_t key = accumulator->add_post_hook(
        std::make_unique<GradientReadyHook>(shared, index));
    hooks_.emplace_back(accumulator, key);
  }
}

GradientReadyHooks::~GradientReadyHooks() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
}

UsageError GradientArrivedTwice(const torch::Tensor& parameter) {
  return UsageError(
      "backward: a parameter of shape " + c10::str(parameter.sizes()) +
      " got a second gradient in one backward after its reduction had "
      "started: a layer run twice in one forward inside activation "
      "checkpointing (accel::checkpoint, or fully_shard's "
      "activation_checkpointing), whose backward hands each run's gradient "
      "over on its own. accel's DDP and ZeRO reduce each gradient once per "
      "backward, as torch's DDP does: run such a layer once per forward, or "
      "leave it out of activation checkpointing");
}

}  // namespace accel
