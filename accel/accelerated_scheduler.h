// The learning-rate scheduler that Accelerator::prepare returns, stepping as
// Accelerate's AcceleratedScheduler does:
//   - not at all on micro-steps that do not synchronize gradients (gradient
//     accumulation), nor when the optimizer's step was skipped (an fp16
//     overflow);
//   - once per process otherwise, because a schedule written for one process
//     counts batches, and N processes take N batches per step; with
//     split_batches (one batch split across processes) once;
//   - never past the end of a schedule that has one (OneCycleLR's
//     total_steps), as Accelerate guards torch's OneCycleLR.
// A ReduceLROnPlateau (reduce_lr_on_plateau.h) steps with its metric
// instead, step(metric), once per call: the ranks first agree on the
// metric, so that they all reduce their lrs at the same evaluation.
//
//   auto scheduler = accelerator.prepare(
//       accel::get_linear_schedule_with_warmup(optimizer, 100, 1000));
//   optimizer.step();
//   scheduler.step();
//   double lr = scheduler.get_last_lr()[0];
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "accel/optim/reduce_lr_on_plateau.h"
#include "accel/optim/scheduler.h"
#include "accel/runtime/base/errors.h"
#include "accel/training_state.h"

namespace accel {

class AcceleratedScheduler {
 public:
  AcceleratedScheduler(std::shared_ptr<TrainingState> state,
                       std::shared_ptr<LRScheduler> scheduler)
      : state_(std::move(state)), scheduler_(std::move(scheduler)) {}

  void step() {
    scheduler();  // A UsageError after reset().
    if (!state_->gradients.sync_gradients()) return;
    for (const auto& prepared : state_->prepared.optimizers()) {
      if (prepared->optimizer == &scheduler().optimizer() &&
          prepared->step_was_skipped) {
        return;
      }
    }
    const int steps = state_->split_batches ? 1 : state_->num_processes;
    const std::optional<int64_t> total = scheduler().total_steps();
    for (int i = 0; i < steps; ++i) {
      // N steps at once can overshoot a schedule that has an end (the
      // program counted steps at another N): stop at its end.
      if (total && scheduler().last_epoch() >= *total) break;
      scheduler().step();
    }
  }
  // A ReduceLROnPlateau's evaluation: the ranks' metrics agreed (one value
  // on every rank: the same one as it is, different ones averaged), then one
  // step. UsageError for a scheduler that takes no metric.
  void step(double metric) {
    auto* plateau = dynamic_cast<ReduceLROnPlateau*>(&scheduler());
    if (plateau == nullptr) {
      throw UsageError(
          "AcceleratedScheduler::step(metric): only a ReduceLROnPlateau "
          "steps with a metric; call step() for this scheduler");
    }
    if (!state_->agree_metric) {
      throw UsageError(
          "AcceleratedScheduler::step(metric): the Accelerator that "
          "prepared this scheduler is gone");
    }
    plateau->step(state_->agree_metric(metric));
  }
  std::vector<double> get_last_lr() const { return scheduler().get_last_lr(); }
  LRScheduler& scheduler() const {
    if (scheduler_ == nullptr) {
      throw UsageError(
          "AcceleratedScheduler: used after accelerator.free_memory() "
          "released this handle; prepare the scheduler again");
    }
    return *scheduler_;
  }
  LRScheduler* operator->() const { return &scheduler(); }
  // Drops this handle's reference (Accelerator::free_memory(handle)); any
  // later use is a UsageError.
  void reset() {
    state_.reset();
    scheduler_.reset();
  }

 private:
  std::shared_ptr<TrainingState> state_;
  std::shared_ptr<LRScheduler> scheduler_;
};

}  // namespace accel
