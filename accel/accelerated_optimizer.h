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
    GradScaler* scaler = state_->scaler.get();
    if (scaler != nullptr && scaler->is_enabled()) {
      prepared_->step_was_skipped = !scaler->step(*prepared_->optimizer);
      scaler->update();
    } else {
      prepared_->optimizer->step();
      prepared_->step_was_skipped = false;
    }
  }
  void zero_grad() {
    if (state_->gradients.sync_gradients()) prepared_->optimizer->zero_grad();
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
