#include "accel/optim/autocast.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "accel/core/libtorch_compat.h"
#include "accel/runtime/base/logging.h"

namespace accel {
namespace {

// One open scope's or floor's setting; `ended` is its Registration's.
struct Entry {
  std::shared_ptr<std::atomic<bool>> ended;
  c10::DeviceType device;
  bool enabled;
  c10::ScalarType dtype;
  std::optional<bool> cache;  // Scopes only.
};

// LibTorch's autocast settings on a thread.
struct TorchSettings {
  bool cache = true;
  bool cpu = false, cuda = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
};

// This thread's autocast as accel manages it.
struct ThreadState {
  std::vector<Entry> scopes;  // Oldest first.
  std::vector<Entry> floors;  // Oldest first.
  // LibTorch's settings before accel first changed them, given back when
  // no scope and no floor are left.
  std::optional<TorchSettings> saved;
  int pauses = 0;  // AutocastPause objects alive.
  // The switches when the outermost pause began: LibTorch's own, unless
  // accel manages them.
  bool paused_cpu = false, paused_cuda = false;

  void Save() {
    if (saved) return;
    TorchSettings settings;
    settings.cache = at::autocast::is_autocast_cache_enabled();
    settings.cpu =
        pauses > 0 ? paused_cpu : compat::AutocastEnabled(c10::DeviceType::CPU);
    settings.cuda = pauses > 0 ? paused_cuda
                               : compat::AutocastEnabled(c10::DeviceType::CUDA);
    settings.cpu_dtype = compat::AutocastDtype(c10::DeviceType::CPU);
    settings.cuda_dtype = compat::AutocastDtype(c10::DeviceType::CUDA);
    saved = settings;
  }

  // Puts in force, for `device`, the newest open scope's setting, else the
  // newest floor's, else what LibTorch had; off while paused.
  void ApplyDevice(c10::DeviceType device) const {
    const bool cuda_device = device == c10::DeviceType::CUDA;
    bool enabled = cuda_device ? saved->cuda : saved->cpu;
    c10::ScalarType dtype = cuda_device ? saved->cuda_dtype : saved->cpu_dtype;
    for (const std::vector<Entry>* entries : {&floors, &scopes}) {
      for (const Entry& entry : *entries) {
        if (entry.device != device) continue;
        enabled = entry.enabled;
        if (entry.enabled) dtype = entry.dtype;
      }
    }
    compat::SetAutocastDtype(device, dtype);
    compat::SetAutocastEnabled(device, enabled && pauses == 0);
  }

  void Apply() {
    DropEnded();
    bool cache_enabled = saved->cache;
    if (scopes.empty() && !floors.empty()) cache_enabled = false;
    for (const Entry& entry : scopes) {
      if (entry.cache) cache_enabled = *entry.cache;
    }
    at::autocast::set_autocast_cache_enabled(cache_enabled);
    ApplyDevice(c10::DeviceType::CPU);
    ApplyDevice(c10::DeviceType::CUDA);
    if (scopes.empty() && floors.empty()) {
      // LibTorch's again; a pause gives back its switches when it ends.
      paused_cpu = saved->cpu;
      paused_cuda = saved->cuda;
      saved.reset();
    }
  }

  // Adds `entry` and puts it in force; if LibTorch refuses it (a dtype it
  // cannot autocast to), takes it out again and rethrows.
  void Add(Entry entry, bool floor) {
    if (entry.device != c10::DeviceType::CPU &&
        entry.device != c10::DeviceType::CUDA) {
      throw std::invalid_argument(
          "autocast: " + c10::DeviceTypeName(entry.device) +
          " has no autocast in accel (the CPU and CUDA have)");
    }
    Save();
    std::vector<Entry>& entries = floor ? floors : scopes;
    entries.push_back(std::move(entry));
    const bool nests = !floor && entries.back().enabled;
    // The cache lives while scopes that enable autocast are open.
    if (nests) at::autocast::increment_nesting();
    try {
      Apply();
    } catch (...) {
      entries.pop_back();
      if (nests) at::autocast::decrement_nesting();
      Apply();  // What held before.
      throw;
    }
  }

  // Takes out `ended`'s entry and puts what is left in force.
  void Remove(const std::atomic<bool>* ended) {
    if (!Erase(ended)) return;
    Apply();
  }

 private:
  bool Erase(const std::atomic<bool>* ended) {
    auto is_it = [ended](const Entry& e) { return e.ended.get() == ended; };
    const auto floor = std::find_if(floors.begin(), floors.end(), is_it);
    if (floor != floors.end()) {
      floors.erase(floor);
      return true;
    }
    const auto scope = std::find_if(scopes.begin(), scopes.end(), is_it);
    if (scope == scopes.end()) return false;
    const bool enabled = scope->enabled;
    scopes.erase(scope);
    if (enabled && at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    return true;
  }

  // Entries ended from another thread.
  void DropEnded() {
    for (const std::vector<Entry>* entries : {&scopes, &floors}) {
      for (size_t i = entries->size(); i-- > 0;) {
        const Entry& entry = (*entries)[i];
        if (entry.ended->load(std::memory_order_acquire)) {
          Erase(entry.ended.get());
        }
      }
    }
  }
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

autocast_internal::Registration Register(c10::DeviceType device, bool enabled,
                                         c10::ScalarType dtype,
                                         std::optional<bool> cache,
                                         bool floor) {
  auto ended = std::make_shared<std::atomic<bool>>(false);
  State().Add({ended, device, enabled, dtype, cache}, floor);
  return autocast_internal::Registration(std::move(ended),
                                         std::this_thread::get_id());
}

}  // namespace

namespace autocast_internal {

void Registration::End() noexcept {
  if (ended_ == nullptr) return;
  const std::shared_ptr<std::atomic<bool>> ended = std::move(ended_);
  ended_ = nullptr;
  ended->store(true, std::memory_order_release);
  // Another thread's state is out of reach: its thread drops the entry.
  if (thread_ != std::this_thread::get_id()) return;
  try {
    State().Remove(ended.get());
  } catch (const std::exception& e) {
    // What is left was in force before, so LibTorch accepts it.
    ACCEL_LOG(ERROR) << "autocast: restoring the thread's setting failed: "
                     << e.what();
  }
}

}  // namespace autocast_internal

AutocastScope::AutocastScope(c10::DeviceType device,
                             std::optional<c10::ScalarType> dtype,
                             std::optional<bool> cache_enabled)
    : registration_(dtype ? Register(device, true, *dtype, cache_enabled, false)
                          : autocast_internal::Registration()) {}

AutocastScope AutocastScope::Off(c10::DeviceType device) {
  return AutocastScope(
      Register(device, false, c10::ScalarType::Undefined, std::nullopt, false));
}

ThreadAutocast::ThreadAutocast(c10::DeviceType device, c10::ScalarType dtype)
    : registration_(Register(device, true, dtype, std::nullopt, true)) {}

AutocastPause::AutocastPause() {
  ThreadState& state = State();
  const bool cpu = compat::AutocastEnabled(c10::DeviceType::CPU);
  const bool cuda = compat::AutocastEnabled(c10::DeviceType::CUDA);
  if (state.pauses++ == 0) {
    state.paused_cpu = cpu;
    state.paused_cuda = cuda;
  }
  if (cpu) compat::SetAutocastEnabled(c10::DeviceType::CPU, false);
  if (cuda) compat::SetAutocastEnabled(c10::DeviceType::CUDA, false);
}

AutocastPause::~AutocastPause() {
  ThreadState& state = State();
  if (--state.pauses > 0) return;  // An outer pause still holds.
  if (state.saved) {
    try {
      state.Apply();
    } catch (const std::exception& e) {
      ACCEL_LOG(ERROR) << "autocast: restoring the thread's setting failed: "
                       << e.what();
    }
  } else {
    if (state.paused_cpu)
      compat::SetAutocastEnabled(c10::DeviceType::CPU, true);
    if (state.paused_cuda) {
      compat::SetAutocastEnabled(c10::DeviceType::CUDA, true);
    }
  }
  // A step may have changed the weights: no cast of them outlives it.
  at::autocast::clear_cache();
}

}  // namespace accel
