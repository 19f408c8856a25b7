// The conformance suite every Communicator backend must pass: every
// operation, every dtype, counts 0, 1, 3, 1000 and 1M, world sizes 1 to 4,
// async operations in flight together, and the failure paths.
//
// A backend's test links //tests:conformance and defines which backend runs
// and where its buffers live:
//
//   const char* accel::testing::ConformanceBackend() { return "gloo"; }
//   accel::testing::ConformanceMemory& accel::testing::BackendMemory() {
//     static accel::testing::HostMemory memory;
//     return memory;
//   }
//
// World sizes above ACCEL_CONFORMANCE_MAX_WORLD_SIZE (default 4) are skipped.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace accel::testing {

// Buffers for the backend's collectives: host memory, or device memory with
// copies to and from the host, where the test prepares and checks values.
class ConformanceMemory {
 public:
  virtual ~ConformanceMemory() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* buffer) = 0;
  virtual void CopyIn(void* buffer, const void* host, size_t bytes) = 0;
  virtual void CopyOut(void* host, const void* buffer, size_t bytes) = 0;
};

class HostMemory : public ConformanceMemory {
 public:
  void* Allocate(size_t bytes) override { return std::malloc(bytes + 1); }
  void Free(void* buffer) override { std::free(buffer); }
  void CopyIn(void* buffer, const void* host, size_t bytes) override {
    std::memcpy(buffer, host, bytes);
  }
  void CopyOut(void* host, const void* buffer, size_t bytes) override {
    std::memcpy(host, buffer, bytes);
  }
};

// Defined by each backend's conformance test binary.
const char* ConformanceBackend();
ConformanceMemory& BackendMemory();

}  // namespace accel::testing
