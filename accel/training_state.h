// The state that the Accelerator shares with what it prepared: the gradient
// state (accumulation, active data loader), the fp16 loss scaler, and the
// prepared optimizers, whose skipped steps prepared schedulers respect.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "accel/grad_scaler.h"
#include "accel/gradient_state.h"

namespace accel {

// What the Accelerator knows of a prepared optimizer.
struct PreparedOptimizer {
  torch::optim::Optimizer* optimizer = nullptr;
  bool step_was_skipped = false;
};

struct TrainingState {
  GradientState gradients;
  std::shared_ptr<GradScaler> scaler;  // Only with mixed precision fp16.
  std::vector<std::shared_ptr<PreparedOptimizer>> optimizers;
  int num_processes = 1;
  // Whether the prepared data loaders split each batch across processes
  // (then a scheduler steps once per optimizer step, else once per process).
  bool split_batches = false;
};

}  // namespace accel
