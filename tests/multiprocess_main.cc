#include "tests/multiprocess_main.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "accel/runtime/env/environment.h"
#include "accel/runtime/launch/launch.h"

namespace accel::testing {
namespace {

Accelerator* g_accelerator = nullptr;

std::vector<int> WorldSizes() {
  const char* text = std::getenv("ACCEL_TEST_WORLD_SIZES");
  std::stringstream in(text ? text : "1,2,3");
  std::vector<int> sizes;
  std::string item;
  while (std::getline(in, item, ',')) sizes.push_back(std::stoi(item));
  return sizes;
}

}  // namespace

Accelerator& SharedAccelerator() { return *g_accelerator; }

// ACCEL_TEST_BACKEND: the backend the ranks use ("gloo" unless set; "mpi"
// starts them through mpirun).
std::string TestBackend() {
  const char* backend = std::getenv("ACCEL_TEST_BACKEND");
  return backend != nullptr && *backend != '\0' ? backend : "gloo";
}

__attribute__((weak)) AcceleratorOptions TestAcceleratorOptions() {
  AcceleratorOptions options;
  options.backend = TestBackend();
  options.timeout = std::chrono::seconds(20);
  options.seed = 1234;
  return options;
}

}  // namespace accel::testing

int main(int argc, char** argv) {
  std::vector<std::string> command(argv, argv + argc);
  ::testing::InitGoogleTest(&argc, argv);
  const accel::DistributedEnvironment env =
      accel::DistributedEnvironment::FromProcess();
  if (!env.launched) {
    // This binary by its real path: under mpirun "/proc/self/exe" would
    // name mpirun.
    char self[4096] = {};
    const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
    command[0] = length > 0 ? std::string(self, length) : "/proc/self/exe";
    // Bazel's per-test files are the launcher's: ranks must not race on them.
    for (const char* name :
         {"TEST_PREMATURE_EXIT_FILE", "XML_OUTPUT_FILE", "GTEST_OUTPUT"}) {
      unsetenv(name);
    }
    int failures = 0;
    for (int world_size : accel::testing::WorldSizes()) {
      std::printf("=== %d process(es) ===\n", world_size);
      std::fflush(stdout);
      accel::LaunchOptions options;
      options.num_processes = world_size;
      options.main_process_port = 0;
      options.backend = accel::testing::TestBackend();
      if (options.backend == "mpi") {
        // Open MPI's files of concurrent tests' jobs kept apart (see
        // backends/mpi/mpi_test_jobs.h).
        if (const char* dir = std::getenv("TEST_TMPDIR")) {
          setenv("OMPI_MCA_btl_vader_backing_directory", dir, 1);
        }
      }
      const int code = accel::Launch(options, command);
      if (code != 0) {
        std::printf("=== %d process(es): FAILED (exit code %d) ===\n",
                    world_size, code);
        ++failures;
      }
    }
    return failures == 0 ? 0 : 1;
  }
  if (env.rank != 0) ::testing::GTEST_FLAG(brief) = true;
  accel::testing::g_accelerator =
      new accel::Accelerator(accel::testing::TestAcceleratorOptions());
  const int result = RUN_ALL_TESTS();
  delete accel::testing::g_accelerator;
  return result;
}
