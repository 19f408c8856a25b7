#include "accel/host_memory_tracker.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>

#include "accel/libtorch_compat.h"

namespace accel {
namespace {

// Counts the bytes LibTorch holds on the CPU, and their peak.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t bytes) ACCEL_ALLOCATE_CONST final {
    c10::DataPtr inner = base_->allocate(bytes);
    if (bytes == 0) return inner;
    void* data = inner.get();
    auto* context = new Held{std::move(inner), bytes, this};
    const int64_t now = held_ += static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, context, &Release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const final { return nullptr; }
#if ACCEL_LIBTORCH_2_3
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    default_copy_data(dest, src, count);
  }
#endif

  int64_t held() const { return held_; }
  int64_t peak() const { return peak_; }
  void ResetPeak() { peak_ = held_.load(); }

 private:
  struct Held {
    c10::DataPtr inner;
    size_t bytes;
    const CountingAllocator* owner;
  };
  static void Release(void* context) {
    auto* held = static_cast<Held*>(context);
    held->owner->held_ -= static_cast<int64_t>(held->bytes);
    delete held;
  }

  c10::Allocator* base_;
  mutable std::atomic<int64_t> held_{0};
  mutable std::atomic<int64_t> peak_{0};
};

CountingAllocator* g_counter = nullptr;

}  // namespace

HostMemoryTracker& HostMemoryTracker::Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_counter = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(g_counter, /*priority=*/100);
  });
  static HostMemoryTracker tracker;
  return tracker;
}

int64_t HostMemoryTracker::held_bytes() const { return g_counter->held(); }
int64_t HostMemoryTracker::peak_bytes() const { return g_counter->peak(); }
void HostMemoryTracker::ResetPeak() { g_counter->ResetPeak(); }

}  // namespace accel
