// The conformance suite every Communicator backend must pass: every
// operation, every dtype, counts 0, 1, 3, 1000 and 1M, world sizes 1 to 4,
// async operations in flight together, and the failure paths.
//
// A backend's test links //tests:conformance and defines which backend runs:
//
//   const char* accel::testing::ConformanceBackend() { return "gloo"; }
#pragma once

namespace accel::testing {

// Defined by each backend's conformance test binary.
const char* ConformanceBackend();

}  // namespace accel::testing
