// Where the LibTorch versions accel is tested with (1.13 from Debian
// bookworm, 2.6 from trixie) differ, and the one spelling accel uses for
// both. Nothing else in accel tests the version.
//
//   auto it = optimizer.state().find(accel::compat::StateKey(parameter));
//   accel::compat::UseTcpStoreWithoutLibuv(options);
#pragma once

#include <torch/types.h>
#include <torch/version.h>

#include <string>
#include <type_traits>

#define ACCEL_LIBTORCH_2 (TORCH_VERSION_MAJOR >= 2)

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

}  // namespace accel::compat
