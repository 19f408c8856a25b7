// For tests that start mpirun jobs.
//
//   accel::testing::KeepMpiJobsApart();  // before the first mpirun
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

namespace accel::testing {

// Open MPI names its shared memory files in /dev/shm after its job id,
// which it derives from mpirun's pid: jobs of tests that run at the same
// time in separate PID namespaces (Bazel's sandboxes) would share them and
// crash. Each test's own temporary folder keeps them apart.
inline void KeepMpiJobsApart() {
  if (const char* dir = std::getenv("TEST_TMPDIR")) {
    setenv("OMPI_MCA_btl_vader_backing_directory", dir, 1);
  }
}

// Runs a function when the test program sets up, as a gtest Environment.
class CallOnSetUp : public ::testing::Environment {
 public:
  explicit CallOnSetUp(std::function<void()> fn) : fn_(std::move(fn)) {}
  void SetUp() override { fn_(); }

 private:
  std::function<void()> fn_;
};

}  // namespace accel::testing
