#include "accel/optim/grad_scaler.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "accel/core/state_archive.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

void Validate(const GradScalerOptions& options, float scale,
              const std::function<void(const std::string&)>& fail) {
  if (!(scale > 0) || !std::isfinite(scale)) {
    fail("the scale must be a positive finite float32, found " +
         std::to_string(options.init_scale));
  }
  if (!(options.growth_factor > 1) || !std::isfinite(options.growth_factor)) {
    fail("growth_factor must be finite and > 1, found " +
         std::to_string(options.growth_factor));
  }
  if (!(options.backoff_factor > 0 && options.backoff_factor < 1)) {
    fail("backoff_factor must be in (0, 1), found " +
         std::to_string(options.backoff_factor));
  }
  if (options.growth_interval <= 0) {
    fail("growth_interval must be > 0, found " +
         std::to_string(options.growth_interval));
  }
}

// Whether any of `grads` (all on one CUDA device) holds an inf or nan;
// divides them by the scale in place. Torch's own fused kernel: one launch
// per dtype and a single host sync.
bool UnscaleOnCuda(const std::vector<torch::Tensor>& grads, float inv_scale) {
  std::unordered_map<int, std::vector<torch::Tensor>> by_dtype;
  for (const torch::Tensor& grad : grads) {
    by_dtype[static_cast<int>(grad.scalar_type())].push_back(grad);
  }
  const auto options =
      torch::TensorOptions().dtype(torch::kFloat).device(grads[0].device());
  torch::Tensor found_inf = torch::zeros({1}, options);
  const torch::Tensor inv = torch::full({1}, inv_scale, options);
  for (auto& [dtype, group] : by_dtype) {
    at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv);
  }
  return found_inf.item<float>() != 0;
}

// The same on any other device, with plain tensor operations: the checks
// stay on the device and are combined there, so the host waits once.
bool UnscaleGeneric(const std::vector<torch::Tensor>& grads, float inv_scale) {
  std::vector<torch::Tensor> all_finite;
  all_finite.reserve(grads.size());
  for (const torch::Tensor& grad : grads) {
    // Checked before scaling, as torch does: dividing by a scale below 1
    // could itself overflow, which is not a gradient overflow.
    all_finite.push_back(torch::isfinite(grad).all());
    grad.mul_(static_cast<double>(inv_scale));
  }
  return !torch::stack(all_finite).all().item<bool>();
}

// Whether any gradient of `optimizer` holds an inf or nan; divides every
// gradient by the scale in place.
bool UnscaleGradients(torch::optim::Optimizer& optimizer, float inv_scale) {
  std::unordered_map<c10::Device, std::vector<torch::Tensor>> by_device;
  for (auto& group : optimizer.param_groups()) {
    for (torch::Tensor& param : group.params()) {
      if (!param.grad().defined()) continue;
      torch::Tensor grad = param.grad();
      if (grad.is_sparse()) {
        // Duplicate indices are summed first, as torch does, so that the
        // check sees the values the optimizer will apply.
        param.mutable_grad() = grad.coalesce();
        grad = param.grad()._values();
      }
      by_device[grad.device()].push_back(grad);
    }
  }
  bool found_inf = false;
  for (auto& [device, grads] : by_device) {
    const bool found = device.is_cuda() ? UnscaleOnCuda(grads, inv_scale)
                                        : UnscaleGeneric(grads, inv_scale);
    found_inf = found_inf || found;
  }
  return found_inf;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options),
      scale_(static_cast<float>(options.init_scale)),
      any_rank_([](bool found_inf) { return found_inf; }) {
  Validate(options_, scale_, [](const std::string& message) {
    throw UsageError("GradScaler: " + message);
  });
}

void GradScaler::set_agreement(std::function<bool(bool)> any_rank) {
  if (!any_rank) throw UsageError("GradScaler::set_agreement: empty function");
  any_rank_ = std::move(any_rank);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  if (!loss.defined()) {
    throw UsageError("GradScaler::scale: the loss is an undefined tensor");
  }
  const auto type = c10::promoteTypes(loss.scalar_type(), torch::kFloat);
  return loss.to(type) * static_cast<double>(scale_);
}

bool GradScaler::unscaled(const torch::optim::Optimizer& optimizer) const {
  const auto it = per_optimizer_.find(&optimizer);
  return it != per_optimizer_.end() && it->second.stage == Stage::kUnscaled;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled) {
    throw UsageError(
        "GradScaler::unscale_: already called on this optimizer since the "
        "last update()");
  }
  if (state.stage == Stage::kStepped) {
    throw UsageError(
        "GradScaler::unscale_: called after step() on this optimizer; "
        "unscale_ before step(), then update()");
  }
  // As torch: the reciprocal in double, rounded once to float32.
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  const bool found_here = UnscaleGradients(optimizer, inv_scale);
  state.found_inf = any_rank_(found_here);
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kStepped) {
    throw UsageError(
        "GradScaler::step: already called on this optimizer since the last "
        "update(); call update() once per iteration");
  }
  if (state.stage == Stage::kReady) unscale_(optimizer);
  state.stage = Stage::kStepped;  // Map references survive insertions.
  if (state.found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (per_optimizer_.empty()) {
    throw UsageError(
        "GradScaler::update: no unscale_() or step() since the last update(), "
        "so there is no inf/nan check to act on");
  }
  bool found_inf = false;
  for (const auto& [optimizer, state] : per_optimizer_) {
    found_inf = found_inf || state.found_inf;
  }
  // The arithmetic of torch's _amp_update_scale_: double, stored as float.
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (growth_tracker_ + 1 == options_.growth_interval) {
    const float grown = static_cast<float>(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    ++growth_tracker_;
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  return options_.enabled ? static_cast<double>(scale_) : 1.0;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("enabled", c10::IValue(options_.enabled));
  archive.write("scale", c10::IValue(static_cast<double>(scale_)));
  archive.write("growth_tracker", c10::IValue(growth_tracker_));
  archive.write("growth_factor", c10::IValue(options_.growth_factor));
  archive.write("backoff_factor", c10::IValue(options_.backoff_factor));
  archive.write("growth_interval", c10::IValue(options_.growth_interval));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  if (!options_.enabled) return;
  if (!ReadArchiveValue<bool>(archive, "GradScaler", "enabled")) {
    throw CheckpointError(
        "GradScaler state was saved by a disabled scaler (mixed precision "
        "other than fp16?) and cannot restore an enabled one");
  }
  GradScalerOptions options = options_;
  const double scale = ReadArchiveValue<double>(archive, "GradScaler", "scale");
  options.init_scale = scale;
  options.growth_factor =
      ReadArchiveValue<double>(archive, "GradScaler", "growth_factor");
  options.backoff_factor =
      ReadArchiveValue<double>(archive, "GradScaler", "backoff_factor");
  options.growth_interval =
      ReadArchiveValue<int64_t>(archive, "GradScaler", "growth_interval");
  const int64_t tracker =
      ReadArchiveValue<int64_t>(archive, "GradScaler", "growth_tracker");
  Validate(options, static_cast<float>(scale), [](const std::string& message) {
    throw CheckpointError("GradScaler state is invalid: " + message);
  });
  if (tracker < 0 || tracker >= options.growth_interval) {
    throw CheckpointError("GradScaler state is invalid: growth_tracker " +
                          std::to_string(tracker) + " outside [0, " +
                          std::to_string(options.growth_interval) + ")");
  }
  options.init_scale = options_.init_scale;
  options_ = options;
  scale_ = static_cast<float>(scale);
  growth_tracker_ = tracker;
  per_optimizer_.clear();
}

}  // namespace accel
