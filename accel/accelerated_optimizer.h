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
// parameters (accel/zero.h): step() steps them and all-gathers the result,
// zero_grad() also zeroes the model's gradients.
//
// A handle: copies refer to the same optimizer, which the program keeps
// alive (as with any LibTorch optimizer passed by reference).
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>

#include "accel/training_state.h"

namespace accel {

class AcceleratedOptimizerBase {
 public:
  AcceleratedOptimizerBase(std::shared_ptr<TrainingState> state,
                           std::shared_ptr<PreparedOptimizer> prepared)
      : state_(std::move(state)), prepared_(std::move(prepared)) {}

  void step() {
    if (!state_->gradients.sync_gradients()) return;
    ZeroOptimizer* zero = prepared_->zero.get();
    if (zero != nullptr) zero->AttachGradients();
    GradScaler* scaler = state_->scaler.get();
    if (scaler != nullptr && scaler->is_enabled()) {
      prepared_->step_was_skipped = !scaler->step(*prepared_->optimizer);
      scaler->update();
    } else {
      prepared_->optimizer->step();
      prepared_->step_was_skipped = false;
    }
    // Every rank skipped or stepped alike (the scaler agrees on overflow).
    if (zero != nullptr && !prepared_->step_was_skipped) {
      zero->AllGatherParameters();
    }
  }
  void zero_grad() {
    if (!state_->gradients.sync_gradients()) return;
    if (prepared_->zero != nullptr) {
      prepared_->zero->ZeroGrad();
    } else {
      prepared_->optimizer->zero_grad();
    }
  }
  // Whether the last step() was skipped because of an inf/nan gradient.
  bool step_was_skipped() const { return prepared_->step_was_skipped; }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() {
    return prepared_->optimizer->param_groups();
  }

 protected:
  std::shared_ptr<TrainingState> state_;
  std::shared_ptr<PreparedOptimizer> prepared_;
};

template <typename Optimizer>
class AcceleratedOptimizer : public AcceleratedOptimizerBase {
 public:
  using AcceleratedOptimizerBase::AcceleratedOptimizerBase;
  Optimizer& optimizer() const {
    return static_cast<Optimizer&>(*prepared_->optimizer);
  }
  Optimizer* operator->() const { return &optimizer(); }
};

}  // namespace accel
