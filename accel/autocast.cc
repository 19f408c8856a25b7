#include "accel/autocast.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <vector>

#include "accel/libtorch_compat.h"

namespace accel {
namespace {

// One open scope's setting.
struct Entry {
  uint64_t id;
  c10::DeviceType device;
  bool enabled;
  c10::ScalarType dtype;
  std::optional<bool> cache;
};

struct Floor {
  const void* owner = nullptr;
  c10::DeviceType device = c10::DeviceType::CPU;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
};

// This thread's autocast as accel manages it.
struct ThreadState {
  std::vector<Entry> open;  // Oldest first.
  std::optional<Floor> floor;
  uint64_t next_id = 1;
  // LibTorch's settings before accel first changed them, given back when
  // no scope and no floor are left.
  bool saved = false;
  bool cache = true;
  bool cpu = false, cuda = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;

  void Save() {
    if (saved) return;
    saved = true;
    cache = at::autocast::is_autocast_cache_enabled();
    cpu = compat::AutocastEnabled(c10::DeviceType::CPU);
    cuda = compat::AutocastEnabled(c10::DeviceType::CUDA);
    cpu_dtype = compat::AutocastDtype(c10::DeviceType::CPU);
    cuda_dtype = compat::AutocastDtype(c10::DeviceType::CUDA);
  }

  // Puts in force, for `device`, the newest open scope's setting, else the
  // floor's, else what LibTorch had.
  void ApplyDevice(c10::DeviceType device) {
    const bool cuda_device = device == c10::DeviceType::CUDA;
    bool enabled = cuda_device ? cuda : cpu;
    c10::ScalarType dtype = cuda_device ? cuda_dtype : cpu_dtype;
    if (floor && floor->device == device) {
      enabled = true;
      dtype = floor->dtype;
    }
    for (const Entry& entry : open) {
      if (entry.device != device) continue;
      enabled = entry.enabled;
      if (entry.enabled) dtype = entry.dtype;
    }
    compat::SetAutocastDtype(device, dtype);
    compat::SetAutocastEnabled(device, enabled);
  }

  void Apply() {
    bool cache_enabled = cache;
    if (open.empty() && floor) cache_enabled = false;
    for (const Entry& entry : open) {
      if (entry.cache) cache_enabled = *entry.cache;
    }
    at::autocast::set_autocast_cache_enabled(cache_enabled);
    ApplyDevice(c10::DeviceType::CPU);
    ApplyDevice(c10::DeviceType::CUDA);
    if (open.empty() && !floor) saved = false;  // LibTorch's again.
  }

  uint64_t Open(c10::DeviceType device, bool enabled, c10::ScalarType dtype,
                std::optional<bool> cache_enabled) {
    Save();
    const uint64_t id = next_id++;
    open.push_back({id, device, enabled, dtype, cache_enabled});
    // The cache lives while scopes that enable autocast are open.
    if (enabled) at::autocast::increment_nesting();
    Apply();
    return id;
  }

  void Close(uint64_t id) {
    const auto it = std::find_if(open.begin(), open.end(),
                                 [id](const Entry& e) { return e.id == id; });
    if (it == open.end()) return;
    const bool enabled = it->enabled;
    open.erase(it);
    if (enabled && at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    Apply();
  }
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

AutocastScope::AutocastScope(c10::DeviceType device,
                             std::optional<c10::ScalarType> dtype,
                             std::optional<bool> cache_enabled) {
  if (!dtype) return;
  id_ = State().Open(device, true, *dtype, cache_enabled);
}

AutocastScope AutocastScope::Off(c10::DeviceType device) {
  return AutocastScope(
      State().Open(device, false, c10::ScalarType::Undefined, std::nullopt));
}

AutocastScope::AutocastScope(AutocastScope&& other) noexcept : id_(other.id_) {
  other.id_ = 0;
}

AutocastScope::~AutocastScope() {
  if (id_ != 0) State().Close(id_);
}

void ThreadAutocast::Begin(const void* owner, c10::DeviceType device,
                           c10::ScalarType dtype) {
  ThreadState& state = State();
  state.Save();
  state.floor = Floor{owner, device, dtype};
  state.Apply();
}

void ThreadAutocast::End(const void* owner) {
  ThreadState& state = State();
  if (!state.floor || state.floor->owner != owner) return;
  state.floor.reset();
  // Weights cast under the floor's scopes go with it.
  if (state.open.empty()) at::autocast::clear_cache();
  state.Apply();
}

bool ThreadAutocast::Has(const void* owner) {
  const ThreadState& state = State();
  return state.floor && state.floor->owner == owner;
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
  // A step changed the weights: no cast of them may outlive it.
  if (cpu_ || cuda_) at::autocast::clear_cache();
}

}  // namespace accel
