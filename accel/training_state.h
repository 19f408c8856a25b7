// The state that the Accelerator shares with what it prepared: the gradient
// state (accumulation, active data loader), the fp16 loss scaler, and the
// registry of prepared objects, whose optimizers' skipped steps prepared
// schedulers respect.
#pragma once

#include <functional>
#include <memory>

#include "accel/data/gradient_state.h"
#include "accel/optim/grad_scaler.h"
#include "accel/prepared_objects.h"
#include "accel/runtime/comm/device_mesh.h"

namespace accel {

struct TrainingState {
  GradientState gradients;
  std::shared_ptr<GradScaler> scaler;  // Only with mixed precision fp16.
  PreparedObjects prepared;
  // The device mesh (AcceleratorOptions::parallelism_config), or null: here
  // rather than in the Accelerator, because prepared ZeRO optimizers use
  // its groups and may outlive the Accelerator.
  std::shared_ptr<DeviceMesh> mesh;
  // Processes that see different batches (the data-parallel ranks).
  int num_processes = 1;
  // Whether the prepared data loaders split each batch across processes
  // (then a scheduler steps once per optimizer step, else once per process).
  bool split_batches = false;
  // One value every rank agrees on from each rank's `metric` (a prepared
  // ReduceLROnPlateau's step); set by the Accelerator while it lives.
  std::function<double(double metric)> agree_metric;
  // AcceleratorOptions::gradient_clipping: clips the gradients of a
  // prepared optimizer's parameters before its step (set by the
  // Accelerator while it lives, when clipping is on).
  std::function<void(PreparedOptimizer& optimizer, CallSite site)>
      clip_before_step;
};

}  // namespace accel
