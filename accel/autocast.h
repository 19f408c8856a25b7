// Mixed precision's autocast as a scope: inside it, LibTorch runs eligible
// operations (matmul, linear, convolutions) in the lower precision and the
// rest in float32, on the CPU (bfloat16) or the GPU (bfloat16 or float16).
//
//   {
//     auto autocast = accelerator.autocast();   // --mixed_precision=bf16
//     torch::Tensor outputs = model->forward(batch.data);
//     loss = torch::nn::functional::cross_entropy(outputs, batch.target);
//   }
//   accelerator.backward(loss);                 // outside the scope
//
// Accelerate wraps the prepared model's forward in autocast; LibTorch's C++
// modules have no forward hooks, so accel asks for the scope around forward
// instead. Scopes nest; the outermost one restores the previous state.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace accel {

class AutocastScope {
 public:
  // No effect when `dtype` is empty (mixed precision "no"). `cache_enabled`
  // (AutocastKwargs): whether casted weights are kept for the scope;
  // empty leaves LibTorch's setting (on by default).
  AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype,
                std::optional<bool> cache_enabled = std::nullopt);
  ~AutocastScope();
  AutocastScope(AutocastScope&& other) noexcept;
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  AutocastScope& operator=(AutocastScope&&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
  std::optional<bool> previous_cache_enabled_;  // Set when we changed it.
};

}  // namespace accel
