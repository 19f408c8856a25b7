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
// Accelerate wraps the prepared model's forward in autocast. LibTorch's C++
// modules have no forward hooks, so accel's prepare() instead turns autocast
// on for the thread that prepares a model (a scope that lasts until
// end_training), and accel's own backward, optimizer step and clipping
// pause it (AutocastPause): the loop needs no code for mixed precision, and
// the scope above is only for finer control. What runs between forward and
// backward (the loss, metrics) is under autocast too, as under a scope
// around the step; AutocastScope::Off (accelerator.autocast(handler) with
// enabled = false) gives a region in full precision. Scopes nest; the
// outermost one restores the previous state.
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
  // A scope in full precision: autocast off for `device` inside it, even
  // under prepare()'s (Accelerate's AutocastKwargs(enabled=False)).
  static AutocastScope Off(c10::DeviceType device);
  ~AutocastScope();
  AutocastScope(AutocastScope&& other) noexcept;
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  AutocastScope& operator=(AutocastScope&&) = delete;

  // Forgets the state to restore: for a scope whose thread is gone or is
  // not this one (the destructor then changes nothing).
  void Abandon() { active_ = false; }

 private:
  AutocastScope(c10::DeviceType device) : device_(device) {}

  bool active_ = false;
  bool turns_off_ = false;  // Off(): no nesting, no cache to clear.
  c10::DeviceType device_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
  std::optional<bool> previous_cache_enabled_;  // Set when we changed it.
};

// Turns autocast off on this thread (CPU and CUDA) for the scope and back
// on after: the backward pass, the optimizer step and gradient clipping run
// in the parameters' precision whatever the program's autocast. Costs two
// thread-local reads when autocast is off.
class AutocastPause {
 public:
  AutocastPause();
  ~AutocastPause();
  AutocastPause(const AutocastPause&) = delete;
  AutocastPause& operator=(const AutocastPause&) = delete;

 private:
  bool cpu_ = false;  // Whether it was on, and is to be turned on again.
  bool cuda_ = false;
};

}  // namespace accel
