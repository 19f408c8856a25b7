// Local SGD, as Accelerate's `LocalSGD`: each process steps its own copy of
// the model with gradients that are not synced, and every local_sgd_steps
// calls of step() (and when the scope ends) the parameters are averaged
// across processes.
//
//   {
//     accel::LocalSGD local_sgd(accelerator, model, /*local_sgd_steps=*/8);
//     for (auto& batch : loader) {
//       auto accumulate = accelerator.accumulate(model);
//       accelerator.backward(loss_of(batch));
//       optimizer.step();
//       optimizer.zero_grad();
//       local_sgd.step();
//     }
//   }  // The last average, on every process.
//
// Differences from Accelerate: the parameters are averaged in one
// collective per dtype, not one per parameter; under ZeRO (zero_stage > 0)
// it is refused, since each rank steps only its share of the parameters
// with gradients that must be reduced every step.
#pragma once

#include <torch/types.h>

#include <vector>

#include "accel/accelerator.h"
#include "accel/parallel/gradient_sync.h"

namespace accel {

class [[nodiscard]] LocalSGD {
 public:
  // Turns the model's gradient sync off for the scope (where enabled and
  // several processes run). local_sgd_steps must be at least 1.
  template <typename Model>
  LocalSGD(Accelerator& accelerator, Model& model, int local_sgd_steps,
           bool enabled = true)
      : LocalSGD(accelerator, detail::ModulePointer(model)->parameters(),
                 local_sgd_steps, enabled) {
    if (active()) no_sync_ = accelerator.no_sync(model);
  }
  // Averages the parameters one last time, unless the scope is left by an
  // exception (the other processes then learn of the failure from this one,
  // not from a collective it never joins).
  ~LocalSGD() noexcept(false);
  LocalSGD(const LocalSGD&) = delete;
  LocalSGD& operator=(const LocalSGD&) = delete;

  // Counts a step; on every local_sgd_steps-th one, averages the parameters.
  void step();
  // How many times the parameters were averaged so far.
  int averages() const { return averages_; }

 private:
  LocalSGD(Accelerator& accelerator, std::vector<torch::Tensor> parameters,
           int local_sgd_steps, bool enabled);
  bool active() const { return enabled_ && accelerator_.use_distributed(); }
  void AverageParameters();

  Accelerator& accelerator_;
  std::vector<torch::Tensor> parameters_;
  int local_sgd_steps_;
  bool enabled_;
  int exceptions_;
  int steps_ = 0;
  int averages_ = 0;
  NoSyncScope no_sync_;
};

}  // namespace accel
