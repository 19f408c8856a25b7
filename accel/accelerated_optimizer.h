// The optimizer that Accelerator::prepare returns, as Accelerate's
// AcceleratedOptimizer: step() and zero_grad() do nothing on the micro-steps
// of gradient accumulation that do not synchronize gradients, and under fp16
// step() goes through the loss scaler (skipped when a gradient overflowed).
//
//   auto [model, optimizer] = accelerator.prepare(net, adamw);
//   accelerator.backward(loss);
//   optimizer.step();                      // or skipped, see above
//   optimizer.zero_grad();
//   optimizer->param_groups();             // the torch optimizer
//   bool skipped = optimizer.step_was_skipped();
//
// Under ZeRO stages 1-2 the torch optimizer holds this rank's pieces of the
// parameters (accel/parallel/zero.h): step() steps them and all-gathers the
// result, zero_grad() also zeroes the model's gradients.
//
// A handle: copies refer to the same optimizer, which the program keeps
// alive (as with any LibTorch optimizer passed by reference), and to what
// accel made for it (under ZeRO its flat buffers), which lives while a
// handle does.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>

#include "accel/optim/autocast.h"
#include "accel/runtime/base/errors.h"
#include "accel/training_state.h"

namespace accel {

class AcceleratedOptimizerBase {
 public:
  AcceleratedOptimizerBase(std::shared_ptr<TrainingState> state,
                           std::shared_ptr<PreparedOptimizer> prepared)
      : state_(std::move(state)), prepared_(std::move(prepared)) {}

  // `site`: where the program calls it (ZeRO's all-gather names it).
  void step(CallSite site = CallSite::Here()) {
    // In the parameters' precision, whatever the program's autocast.
    const AutocastPause full_precision;
    prepared();  // A UsageError after reset().
    if (!state_->gradients.sync_gradients()) return;
    for (GradientReducer* reducer : state_->prepared.synchronizers()) {
      reducer->CheckStepComplete("optimizer.step");
      reducer->StepEnded();
    }
    ZeroOptimizer* zero = prepared().zero.get();
    if (zero != nullptr) zero->AttachGradients();
    if (state_->clip_before_step) state_->clip_before_step(prepared(), site);
    GradScaler* scaler = state_->scaler.get();
    if (scaler != nullptr && scaler->is_enabled()) {
      prepared().step_was_skipped = !scaler->step(*prepared().optimizer);
      scaler->update();
    } else {
      prepared().optimizer->step();
      prepared().step_was_skipped = false;
    }
    // Every rank skipped or stepped alike (the scaler agrees on overflow).
    if (zero != nullptr && !prepared().step_was_skipped) {
      zero->AllGatherParameters(site);
    }
  }
  void zero_grad() {
    prepared();  // A UsageError after reset().
    if (!state_->gradients.sync_gradients()) return;
    for (GradientReducer* reducer : state_->prepared.synchronizers()) {
      reducer->StepEnded();
    }
    if (prepared().zero != nullptr) {
      prepared().zero->ZeroGrad();
    } else {
      prepared().optimizer->zero_grad();
    }
  }
  // Whether the last step() was skipped because of an inf/nan gradient.
  bool step_was_skipped() const { return prepared().step_was_skipped; }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() {
    return prepared().optimizer->param_groups();
  }

  // The torch optimizer; null after reset().
  torch::optim::Optimizer* torch_optimizer() const {
    return prepared_ == nullptr ? nullptr : prepared_->optimizer;
  }
  // Drops this handle's reference (Accelerator::free_memory(handle)); any
  // later use is a UsageError.
  void reset() {
    state_.reset();
    prepared_.reset();
  }

 protected:
  PreparedOptimizer& prepared() const {
    if (prepared_ == nullptr) {
      throw UsageError(
          "AcceleratedOptimizer: used after accelerator.free_memory() "
          "released this handle; prepare the optimizer again");
    }
    return *prepared_;
  }

  std::shared_ptr<TrainingState> state_;
  std::shared_ptr<PreparedOptimizer> prepared_;
};

template <typename Optimizer>
class AcceleratedOptimizer : public AcceleratedOptimizerBase {
 public:
  using AcceleratedOptimizerBase::AcceleratedOptimizerBase;
  Optimizer& optimizer() const {
    return static_cast<Optimizer&>(*prepared().optimizer);
  }
  Optimizer* operator->() const { return &optimizer(); }
};

}  // namespace accel
