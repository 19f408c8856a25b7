#include "accel/memory/host_memory_tracker.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "accel/core/libtorch_compat.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// Bytes in front of each block, where its size is kept: c10's alignment of
// CPU memory (gAlignment), so that the data stays as aligned as before.
constexpr size_t kHeader = 64;

// Counts the bytes LibTorch holds on the CPU, and their peak. Kernels
// (oneDNN's gelu, bfloat16 matmul) allocate and free through
// raw_allocate / raw_deallocate, which need a DataPtr whose context is its
// data and a raw deleter that frees from the data pointer alone; wrapping
// the base allocator's DataPtr in a context of our own broke both ("d
// INTERNAL ASSERT FAILED", "dptr.get() == dptr.get_context()"). So each
// block carries its size in a header, and is freed through the base
// allocator's own raw deleter.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t bytes) ACCEL_ALLOCATE_CONST final {
    auto* block = static_cast<char*>(base_->raw_allocate(bytes + kHeader));
    std::memcpy(block, &bytes, sizeof(bytes));
    void* data = block + kHeader;
    const int64_t now = held_ += static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &Release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const final { return &Release; }
#if ACCEL_LIBTORCH_2_3
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    default_copy_data(dest, src, count);
  }
#endif

  int64_t held() const { return held_; }
  int64_t peak() const { return peak_; }
  void ResetPeak() { peak_ = held_.load(); }
  c10::Allocator* base() const { return base_; }
  void Released(size_t bytes) { held_ -= static_cast<int64_t>(bytes); }

 private:
  static void Release(void* data);

  c10::Allocator* base_;
  mutable std::atomic<int64_t> held_{0};
  mutable std::atomic<int64_t> peak_{0};
};

CountingAllocator* g_counter = nullptr;

void CountingAllocator::Release(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  size_t bytes = 0;
  std::memcpy(&bytes, block, sizeof(bytes));
  g_counter->Released(bytes);
  g_counter->base()->raw_deallocate(block);
}

}  // namespace

HostMemoryTracker& HostMemoryTracker::Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    if (base->raw_deleter() == nullptr) {
      // Every CPU allocator LibTorch ships has one; a program's own may not.
      throw UsageError(
          "HostMemoryTracker: the CPU allocator in place has no raw "
          "deleter, so the tracker could not free what kernels allocate "
          "raw; install the tracker before the program's own allocator");
    }
    g_counter = new CountingAllocator(base);
    c10::SetCPUAllocator(g_counter, /*priority=*/100);
  });
  static HostMemoryTracker tracker;
  return tracker;
}

int64_t HostMemoryTracker::held_bytes() const { return g_counter->held(); }
int64_t HostMemoryTracker::peak_bytes() const { return g_counter->peak(); }
void HostMemoryTracker::ResetPeak() { g_counter->ResetPeak(); }

}  // namespace accel
