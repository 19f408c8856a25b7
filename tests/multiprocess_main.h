// A GoogleTest main for tests whose every rank is a real process running
// the same tests, with collectives between them.
//
//   // In the test's BUILD rule: deps = ["//tests:multiprocess_main"].
//   TEST(MyTest, Gather) {
//     accel::Accelerator& accelerator = accel::testing::SharedAccelerator();
//     ...
//   }
//
// Run by Bazel (no launch environment), the binary launches itself once per
// world size in ACCEL_TEST_WORLD_SIZES (default "1,2,3") on a free port
// (over ACCEL_TEST_BACKEND, default gloo; "mpi" runs mpirun) and
// fails if any rank fails. Inside a rank it creates one Accelerator, with
// short timeouts so that a failing test cannot hang CI, and runs the tests;
// ranks other than 0 print failures only.
#pragma once

#include "accel/accelerator.h"

namespace accel::testing {

Accelerator& SharedAccelerator();

std::string TestBackend();

// The options of the shared Accelerator: TestBackend(), 20 s timeouts,
// seed 1234. A
// test binary may define its own (a strong symbol replaces this weak one).
AcceleratorOptions TestAcceleratorOptions();

}  // namespace accel::testing
