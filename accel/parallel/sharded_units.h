// ZeRO stage 3 (FSDP's FULL_SHARD) units: the layers whose parameters are
// gathered just before they run and freed just after. LibTorch modules have
// no forward hooks, so accel marks a unit by putting a ShardedUnit in its
// place in the Sequential that runs it; the layer itself stays registered
// where it was, so parameter names, state dicts and checkpoints are those
// of the unwrapped model.
//
//   torch::nn::Sequential net(Block(), Block(), torch::nn::Linear(64, 2));
//   auto units = accel::WrapUnits(*net, "");      // one unit per child
//   // ... ZeroOptimizer over the units' parameters, then:
//   for (size_t u = 0; u < units.size(); ++u) units[u]->Attach(runner, u);
//   net->forward(x);   // each child: gathered, run, freed
//
// Which layers become units (Accelerate's auto_wrap_policy): with a layer
// type, every child of a Sequential (anywhere in the model) whose class is
// that type (Module::name(), with or without the "Impl" suffix and
// namespace); without one, the children of each outermost Sequential. A
// unit's own Sequentials are not searched again, and children without
// trainable parameters (activations, dropout) stay as they are.
//
// A unit takes one tensor and returns one, as the Sequentials that hold
// them pass. Between uses a unit's parameters hold no values; reading them
// (or calling the layer outside its model) ends the process with a message
// saying so (released_memory.h) instead of reading freed memory.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace accel {

// What a unit asks of the sharded optimizer (zero.h) around its forward,
// and before its backward (the gradient arriving at its output).
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  virtual void BeforeForward(size_t unit) = 0;
  virtual void AfterForward(size_t unit) = 0;
  virtual void BeforeBackward(size_t unit) = 0;
};

class ShardedUnitImpl : public torch::nn::Module {
 public:
  ShardedUnitImpl(torch::nn::AnyModule layer, std::string name);

  torch::Tensor forward(torch::Tensor input);

  // From now on, forward gathers through `runner` (until it is gone).
  void Attach(std::weak_ptr<UnitRunner> runner, size_t index);
  bool attached() const { return !runner_.expired(); }
  // The wrapped layer and its name in the model ("layers.3").
  const std::shared_ptr<torch::nn::Module>& layer() const { return module_; }
  const std::string& path() const { return path_; }

 private:
  torch::nn::AnyModule layer_;
  std::shared_ptr<torch::nn::Module> module_;
  std::string path_;
  std::weak_ptr<UnitRunner> runner_;
  size_t index_ = 0;
};

// Puts a ShardedUnit in place of each layer the policy picks (see above),
// in the order the model runs them (pre-order). Returns the units; empty
// when the model holds no Sequential child with trainable parameters.
std::vector<std::shared_ptr<ShardedUnitImpl>> WrapUnits(
    torch::nn::Module& model, const std::string& layer_type);

}  // namespace accel
