// Loss scaling for fp16 training, with torch.amp.GradScaler's semantics
// (LibTorch's C++ API has no scaler).
//
//   accel::GradScaler scaler;  // Scale 65536, x2 every 2000 clean steps.
//   for (auto& batch : loader) {
//     optimizer.zero_grad();
//     torch::Tensor loss = ...;             // Forward pass in fp16.
//     scaler.scale(loss).backward();        // Gradients are scaled up...
//     scaler.unscale_(optimizer);           // ...back down (optional here:
//     torch::nn::utils::clip_grad_norm_(    // only needed to look at the
//         model->parameters(), 1.0);        // true gradients first).
//     bool stepped = scaler.step(optimizer);  // Skipped on inf/nan.
//     scaler.update();                      // Backs off or grows the scale.
//   }
//
// Why: fp16 gradients underflow to zero below about 6e-8. Multiplying the
// loss by a large factor keeps them representable; the optimizer then sees
// the gradients divided by the same factor. When any gradient overflowed
// to inf or nan, step() skips the optimizer step (parameters and optimizer
// state stay as they were) and update() halves the scale; after
// growth_interval steps in a row without overflow it doubles the scale.
//
// In a job of several processes every rank must skip the same steps, or
// the replicas drift apart: set_agreement() installs the cross-rank OR of
// "found inf" (the Accelerator passes an allreduce). unscale_ calls it once
// per optimizer and step, so every rank must then call unscale_/step for
// the same optimizers in the same order.
//
// Differences from torch: gradients may be fp16 themselves (torch refuses
// to unscale fp16 gradients for an optimizer; pure-fp16 models need it);
// scale() returns a tensor of the loss's shape (torch returns shape [1] for
// a scalar loss), in float32 for a half-precision loss (as torch) so that
// the scaled loss cannot overflow; bad options are a UsageError at
// construction.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <unordered_map>

namespace accel {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;   // > 1.
  double backoff_factor = 0.5;  // In (0, 1).
  int64_t growth_interval = 2000;
  // A disabled scaler passes everything through (mixed precision off or
  // bf16), so a training loop can use it unconditionally.
  bool enabled = true;
};

class GradScaler {
 public:
  // UsageError on invalid options (a scale that is not a positive finite
  // float32, growth_factor <= 1, backoff_factor outside (0, 1),
  // growth_interval <= 0).
  explicit GradScaler(GradScalerOptions options = {});

  // Called to agree across ranks on whether any rank found an inf/nan:
  // given this rank's found_inf, returns the logical OR over ranks.
  // Default: identity (one process).
  void set_agreement(std::function<bool(bool)> any_rank);

  // loss * current scale, in float32 at least (identity when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;

  // Divides every gradient of `optimizer` by the scale in place and records
  // whether any was inf or nan (one host sync per device, none per tensor).
  // Once per optimizer between update()s: a second call, or a call after
  // step(), is a UsageError (as torch).
  void unscale_(torch::optim::Optimizer& optimizer);
  // Whether unscale_ ran on `optimizer` since the last update().
  bool unscaled(const torch::optim::Optimizer& optimizer) const;

  // unscale_ if not done yet; then optimizer.step() unless an inf/nan was
  // found (on any rank). Returns whether the optimizer stepped. Once per
  // optimizer between update()s.
  bool step(torch::optim::Optimizer& optimizer);

  // After the step(s): scale *= backoff_factor and growth tracker = 0 when
  // any optimizer found an inf/nan; else the tracker counts one more clean
  // step and at growth_interval the scale grows by growth_factor (unless
  // that overflows float32) and the tracker restarts. Resets the per-step
  // state. UsageError when no optimizer was unscaled since the last update.
  void update();

  // The current scale (1.0 when disabled).
  double get_scale() const;
  bool is_enabled() const { return options_.enabled; }
  // Clean steps in a row since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }
  const GradScalerOptions& options() const { return options_; }

  // Keys "enabled", "scale", "growth_tracker", "growth_factor",
  // "backoff_factor", "growth_interval".
  void save(torch::serialize::OutputArchive& archive) const;
  // Restores the scale, tracker and growth options (as torch's
  // load_state_dict). A disabled scaler ignores the state, as torch;
  // CheckpointError when the state is missing, invalid, or was saved by a
  // disabled scaler.
  void load(torch::serialize::InputArchive& archive);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    Stage stage = Stage::kReady;
    bool found_inf = false;
  };

  GradScalerOptions options_;
  float scale_;  // float32, like torch's scale tensor.
  int64_t growth_tracker_ = 0;
  std::function<bool(bool)> any_rank_;
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState>
      per_optimizer_;
};

}  // namespace accel
