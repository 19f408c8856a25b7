#include "accel/autocast.h"

#include <ATen/autocast_mode.h>

#include "accel/libtorch_compat.h"

namespace accel {

AutocastScope::AutocastScope(c10::DeviceType device,
                             std::optional<c10::ScalarType> dtype,
                             std::optional<bool> cache_enabled)
    : device_(device) {
  if (!dtype) return;
  active_ = true;
  if (cache_enabled) {
    previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(*cache_enabled);
  }
  was_enabled_ = compat::AutocastEnabled(device_);
  previous_dtype_ = compat::AutocastDtype(device_);
  compat::SetAutocastDtype(device_, *dtype);
  compat::SetAutocastEnabled(device_, true);
  at::autocast::increment_nesting();
}

AutocastScope AutocastScope::Off(c10::DeviceType device) {
  AutocastScope scope(device);
  scope.active_ = true;
  scope.turns_off_ = true;
  scope.was_enabled_ = compat::AutocastEnabled(device);
  scope.previous_dtype_ = compat::AutocastDtype(device);
  compat::SetAutocastEnabled(device, false);
  return scope;
}

AutocastScope::AutocastScope(AutocastScope&& other) noexcept
    : active_(other.active_),
      turns_off_(other.turns_off_),
      device_(other.device_),
      was_enabled_(other.was_enabled_),
      previous_dtype_(other.previous_dtype_),
      previous_cache_enabled_(other.previous_cache_enabled_) {
  other.active_ = false;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // The cache of casted weights lives as long as the outermost scope.
  if (!turns_off_ && at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  compat::SetAutocastEnabled(device_, was_enabled_);
  compat::SetAutocastDtype(device_, previous_dtype_);
  if (previous_cache_enabled_) {
    at::autocast::set_autocast_cache_enabled(*previous_cache_enabled_);
  }
}

AutocastPause::AutocastPause()
    : cpu_(compat::AutocastEnabled(c10::DeviceType::CPU)),
      cuda_(compat::AutocastEnabled(c10::DeviceType::CUDA)) {
  if (cpu_) compat::SetAutocastEnabled(c10::DeviceType::CPU, false);
  if (cuda_) compat::SetAutocastEnabled(c10::DeviceType::CUDA, false);
}

AutocastPause::~AutocastPause() {
  if (cpu_) compat::SetAutocastEnabled(c10::DeviceType::CPU, true);
  if (cuda_) compat::SetAutocastEnabled(c10::DeviceType::CUDA, true);
}

}  // namespace accel
