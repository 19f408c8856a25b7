// The conformance suite every Communicator backend must pass: every
// operation, every dtype, counts 0, 1, 3, 1000 and 1M, world sizes 1 to 4,
// async operations in flight together, and the failure paths.
//
// A backend's test links //tests:conformance (and a gtest main) and says
// which backends run it, where their buffers live and how their ranks run:
//
//   const accel::testing::ConformanceSetup&
//   accel::testing::GetConformanceSetup() {
//     static const ConformanceSetup setup{{"gloo", "gloo_tcp"}};
//     return setup;
//   }
//
// Every test runs on every listed backend (tests are named
// "<backend>_world<N>"), as Gloo's own tests run over every transport.
// World sizes above ACCEL_CONFORMANCE_MAX_WORLD_SIZE (default 4) are skipped;
// ACCEL_CONFORMANCE_LARGE_COUNT replaces the 1M count (the sanitizer runs).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/thread_ranks.h"

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

struct ConformanceSetup {
  // Registered backend names; the whole suite runs on each.
  std::vector<std::string> backends;
  // Where buffers live; null: host memory.
  ConformanceMemory* memory = nullptr;
  // Runs a function on every rank; null: ranks as threads (RunRanks). MPI
  // runs each rank as a process of an mpirun job instead.
  RankRunner run_ranks = nullptr;
  // Nonzero: the only world size this process can run (an mpirun job's);
  // tests of other sizes are skipped.
  int only_world_size = 0;
  // False where a failed collective ends the job instead of throwing (MPI
  // cannot cancel a collective): the backend then tests its failures with
  // real processes itself, and the suite's failure tests are skipped.
  bool failures_throw = true;
};

// Defined by each backend's conformance test binary.
const ConformanceSetup& GetConformanceSetup();

}  // namespace accel::testing
