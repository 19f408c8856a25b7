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
//
// A scope or floor belongs to the thread that opened it, as autocast is
// LibTorch's per-thread state. Ending one from another thread (a scope
// moved there, an Accelerator destroyed there) cannot reach that state: the
// owning thread drops it at its next autocast change (a scope opening or
// ending, accel's backward or step).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

namespace accel {
namespace autocast_internal {

// A scope's or floor's place in its thread's autocast: ends once, from any
// thread (see above).
class Registration {
 public:
  Registration() = default;
  Registration(std::shared_ptr<std::atomic<bool>> ended, std::thread::id thread)
      : ended_(std::move(ended)), thread_(thread) {}
  Registration(Registration&& other) noexcept = default;
  Registration& operator=(Registration&&) = delete;
  ~Registration() { End(); }
  void End() noexcept;

 private:
  std::shared_ptr<std::atomic<bool>> ended_;  // Null: nothing to end.
  std::thread::id thread_;
};

}  // namespace autocast_internal

class AutocastScope {
 public:
  // No effect when `dtype` is empty (mixed precision "no"). `cache_enabled`
  // (AutocastKwargs): whether casted weights are kept for the scope;
  // empty: LibTorch's default (kept). Throws std::invalid_argument for a
  // device other than the CPU or CUDA, and LibTorch's error for a dtype it
  // cannot autocast to there (float16 on the CPU in 1.13), leaving the
  // thread's autocast as it was.
  AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype,
                std::optional<bool> cache_enabled = std::nullopt);
  // A scope in full precision: autocast off for `device` inside it, also
  // under the floor (Accelerate's AutocastKwargs(enabled=False)).
  static AutocastScope Off(c10::DeviceType device);
  AutocastScope(AutocastScope&& other) noexcept = default;
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  AutocastScope& operator=(AutocastScope&&) = delete;

 private:
  explicit AutocastScope(autocast_internal::Registration registration)
      : registration_(std::move(registration)) {}
  autocast_internal::Registration registration_;
};

// The floor prepare() sets for its thread: autocast to `dtype` on `device`
// wherever no scope says otherwise, without the cache, until the object
// ends. Floors of several owners (two Accelerators) stack: the newest still
// alive is in force.
class ThreadAutocast {
 public:
  ThreadAutocast(c10::DeviceType device, c10::ScalarType dtype);
  ThreadAutocast(const ThreadAutocast&) = delete;
  ThreadAutocast& operator=(const ThreadAutocast&) = delete;

 private:
  autocast_internal::Registration registration_;
};

// Turns autocast off on this thread (CPU and CUDA) for the scope and back
// on after: the backward pass, the optimizer step and gradient clipping run
// in the parameters' precision whatever the program's autocast; scopes that
// open or end inside it (a hook) do not turn it back on. Clears the cache
// of casted weights at its end (a step changed them).
class AutocastPause {
 public:
  AutocastPause();
  ~AutocastPause();
  AutocastPause(const AutocastPause&) = delete;
  AutocastPause& operator=(const AutocastPause&) = delete;
};

}  // namespace accel
