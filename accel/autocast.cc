#include "accel/autocast.h"

#include <ATen/autocast_mode.h>

namespace accel {

AutocastScope::AutocastScope(c10::DeviceType device,
                             std::optional<c10::ScalarType> dtype)
    : device_(device) {
  if (!dtype) return;
  active_ = true;
  if (device_ == c10::DeviceType::CUDA) {
    was_enabled_ = at::autocast::is_enabled();
    previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(*dtype);
    at::autocast::set_enabled(true);
  } else {
    was_enabled_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(*dtype);
    at::autocast::set_cpu_enabled(true);
  }
  at::autocast::increment_nesting();
}

AutocastScope::AutocastScope(AutocastScope&& other) noexcept
    : active_(other.active_),
      device_(other.device_),
      was_enabled_(other.was_enabled_),
      previous_dtype_(other.previous_dtype_) {
  other.active_ = false;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // The cache of casted weights lives as long as the outermost scope.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (device_ == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(was_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }
}

}  // namespace accel
