// Counts the bytes LibTorch holds in host memory, and their peak, by
// wrapping its CPU allocator: what Accelerate's examples measure on a GPU
// with torch.cuda.max_memory_allocated (their TorchTracemalloc), for the
// CPU, where the process's RSS says little (freed memory is kept for
// reuse, see accel/runtime/base/host_memory.h).
//
//   accel::HostMemoryTracker& memory = accel::HostMemoryTracker::Install();
//   memory.ResetPeak();
//   ... train an epoch ...
//   std::printf("peak %.0f MB\n", memory.peak_bytes() / 1e6);
//
// Install it before the tensors it should count: memory allocated before
// is neither counted nor, when freed, subtracted.
#pragma once

#include <cstdint>

namespace accel {

class HostMemoryTracker {
 public:
  // Installs the counting allocator once per process (later calls return
  // the same tracker).
  static HostMemoryTracker& Install();

  // Bytes LibTorch holds now, and the most it held since the last
  // ResetPeak() (or since Install()).
  int64_t held_bytes() const;
  int64_t peak_bytes() const;
  void ResetPeak();

 private:
  HostMemoryTracker() = default;
};

}  // namespace accel
