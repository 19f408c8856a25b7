// Where the LibTorch versions accel is tested with (1.13 from Debian
// bookworm, 2.6 from trixie) differ, and the one spelling accel uses for
// both. Nothing else in accel tests the version.
//
//   auto it = optimizer.state().find(accel::compat::StateKey(parameter));
//   accel::compat::UseTcpStoreWithoutLibuv(options);
//   accel::compat::SetAutocastEnabled(c10::DeviceType::CPU, true);
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/types.h>
#include <torch/version.h>

#include <string>
#include <type_traits>

#define ACCEL_LIBTORCH_2 (TORCH_VERSION_MAJOR >= 2)
// 2.4 and later: autocast's state per device type.
#define ACCEL_LIBTORCH_2_4    \
  (TORCH_VERSION_MAJOR > 2 || \
   (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))
// 2.3 and later: c10::Allocator::allocate is not const, and allocators
// implement copy_data.
#define ACCEL_LIBTORCH_2_3    \
  (TORCH_VERSION_MAJOR > 2 || \
   (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
#if ACCEL_LIBTORCH_2_3
#define ACCEL_ALLOCATE_CONST
#else
#define ACCEL_ALLOCATE_CONST const
#endif

namespace accel::compat {

// The key of a parameter in Optimizer::state(): the string of its
// TensorImpl's address in 1.13, the address itself in 2.x
// (c10::guts::to_string is gone there).
inline auto StateKey(const torch::Tensor& parameter) {
#if ACCEL_LIBTORCH_2
  return static_cast<void*>(parameter.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#endif
}

template <typename Options, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename Options>
struct HasUseLibUV<Options, std::void_t<decltype(Options::useLibUV)>>
    : std::true_type {};

// c10d::TCPStoreOptions gained useLibUV (default true) in 2.4; Debian's
// LibTorch is built without libuv, so a client asking for it throws
// "use_libuv was requested but PyTorch was build without libuv support".
template <typename Options>
void UseTcpStoreWithoutLibuv(Options& options) {
  if constexpr (HasUseLibUV<Options>::value) options.useLibUV = false;
}

// Autocast's switch and dtype for CPU or CUDA: one function per device in
// 1.13 (set_cpu_enabled, get_autocast_gpu_dtype, ...), deprecated in 2.4
// for functions that take the device type.
inline bool AutocastEnabled(c10::DeviceType device) {
#if ACCEL_LIBTORCH_2_4
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
#endif
}

inline void SetAutocastEnabled(c10::DeviceType device, bool enabled) {
#if ACCEL_LIBTORCH_2_4
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

inline c10::ScalarType AutocastDtype(c10::DeviceType device) {
#if ACCEL_LIBTORCH_2_4
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA
             ? at::autocast::get_autocast_gpu_dtype()
             : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void SetAutocastDtype(c10::DeviceType device, c10::ScalarType dtype) {
#if ACCEL_LIBTORCH_2_4
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

}  // namespace accel::compat
