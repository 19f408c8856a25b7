// Runs the backend conformance suite (tests/conformance.cc) on Gloo.
#include "tests/conformance.h"

const char* accel::testing::ConformanceBackend() { return "gloo"; }

accel::testing::ConformanceMemory& accel::testing::BackendMemory() {
  static HostMemory memory;
  return memory;
}
