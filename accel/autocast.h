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
// modules have no forward hooks, so accel's prepare() instead gives the
// thread that prepares a model an autocast floor (ThreadAutocast), in force
// wherever no scope says otherwise, until end_training, free_memory or the
// Accelerator's end; accel's own backward, optimizer step and clipping
// pause it (AutocastPause). The loop needs no code for mixed precision, and
// the scope above is only for finer control. What runs on that thread
// between forward and backward is under autocast too: the loss, metrics,
// another model's forward; outputs stay in the lower precision (Accelerate
// converts them to float32). AutocastScope::Off (accelerator.autocast(
// handler) with enabled = false) gives a region in full precision; other
// threads are not under the floor.
//
// Scopes may end in any order: each one's setting leaves with it, and what
// is in force is the newest scope still open, else the floor, else off. The
// cache of casted weights lives while scopes are open and goes with the
// last (as torch's outermost autocast clears it); the floor never caches,
// since nothing ends it between steps and a cached cast would outlive the
// optimizer's update of its weight. AutocastPause clears it too.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>

namespace accel {

class AutocastScope {
 public:
  // No effect when `dtype` is empty (mixed precision "no"). `cache_enabled`
  // (AutocastKwargs): whether casted weights are kept for the scope;
  // empty: LibTorch's default (kept).
  AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype,
                std::optional<bool> cache_enabled = std::nullopt);
  // A scope in full precision: autocast off for `device` inside it, also
  // under the floor (Accelerate's AutocastKwargs(enabled=False)).
  static AutocastScope Off(c10::DeviceType device);
  ~AutocastScope();
  AutocastScope(AutocastScope&& other) noexcept;
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  AutocastScope& operator=(AutocastScope&&) = delete;

 private:
  explicit AutocastScope(uint64_t id) : id_(id) {}
  uint64_t id_ = 0;  // Its entry among the thread's open scopes; 0: none.
};

// The floor prepare() sets for its thread: autocast to `dtype` on `device`
// wherever no scope says otherwise, without the cache. `owner` tells
// floors apart (an Accelerator); End() only ends the owner's.
class ThreadAutocast {
 public:
  static void Begin(const void* owner, c10::DeviceType device,
                    c10::ScalarType dtype);
  static void End(const void* owner);
  // Whether `owner`'s floor is in force on this thread.
  static bool Has(const void* owner);
};

// Turns autocast off on this thread (CPU and CUDA) for the scope and back
// on after: the backward pass, the optimizer step and gradient clipping run
// in the parameters' precision whatever the program's autocast. Clears the
// cache of casted weights at its end (a step changed them). Costs two
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
