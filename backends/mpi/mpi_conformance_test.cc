// Runs the backend conformance suite (tests/conformance.cc) on MPI. MPI
// cannot run ranks as threads, so this test starts itself under mpirun once
// per world size (1 to 4, and 5 and 6 for the subgroup tests): inside that
// job every process is one rank and
// runs the suite's tests of its world size; outside, each world size is one
// test, which passes when every rank passed the suite.
//
// The suite's failure tests are skipped here: a failed MPI collective ends
// the job (see mpi_transport.h); mpi_failure_test checks those paths with
// real jobs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/launch/mpirun.h"
#include "backends/mpi/mpi_test_jobs.h"
#include "tests/conformance.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

// The size of the mpirun job this process is a rank of, or 0 outside one.
int JobWorldSize() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size != nullptr ? std::atoi(size) : 0;
}

// Inside the job: this process is one of the ranks.
void RunAsThisRank(const std::string& backend, int world_size,
                   const std::function<void(Communicator&)>& body,
                   const RankOptions& options) {
  try {
    ProcessGroupOptions group_options;
    group_options.backend = backend;
    group_options.communicator.timeout = options.timeout;
    auto group = ProcessGroup::Join(DistributedEnvironment::FromProcess(),
                                    group_options);
    ASSERT_EQ(group->communicator().size(), world_size);
    body(group->communicator());
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

std::string Self() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path));
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "";
}

class MpiJob : public ::testing::TestWithParam<int> {};

// The number of Backends/ConformanceTest and ConformanceGroupTest tests for
// mpi at `world_size`, which each rank of the job runs.
int ConformanceTestsFor(int world_size) {
  const std::string suffix = "/mpi_world" + std::to_string(world_size);
  const auto& unit = *::testing::UnitTest::GetInstance();
  int count = 0;
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    const std::string name = suite.name();
    if (name != "Backends/ConformanceTest" &&
        name != "Backends/ConformanceGroupTest") {
      continue;
    }
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const std::string name = suite.GetTestInfo(t)->name();
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) ==
              0) {
        ++count;
      }
    }
  }
  return count;
}

TEST_P(MpiJob, EveryRankPassesTheSuite) {
  const int world_size = GetParam();
  if (JobWorldSize() != 0) GTEST_SKIP() << "already inside an mpirun job";
  const char* limit = std::getenv("ACCEL_CONFORMANCE_MAX_WORLD_SIZE");
  if (limit != nullptr && world_size > std::atoi(limit)) {
    GTEST_SKIP() << "world size above ACCEL_CONFORMANCE_MAX_WORLD_SIZE";
  }
  const std::string world = "/mpi_world" + std::to_string(world_size);
  const std::string filter = "--gtest_filter=Backends/ConformanceTest.*" +
                             world + ":Backends/ConformanceGroupTest.*" + world;
  const ProcessResult r = RunProcess(
      MpirunCommand(world_size, {Self(), filter}, {}),
      // The ranks run their whole suite, and leave Bazel's files alone.
      {{"GTEST_TOTAL_SHARDS", "1"},
       {"GTEST_SHARD_INDEX", "0"},
       {"XML_OUTPUT_FILE", ""}},
      std::chrono::minutes(8));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Every rank passes every conformance test of its world size.
  std::regex passed("\\[  PASSED  \\] " +
                    std::to_string(ConformanceTestsFor(world_size)) + " tests");
  const auto count = std::distance(
      std::sregex_iterator(r.output.begin(), r.output.end(), passed),
      std::sregex_iterator());
  EXPECT_EQ(count, world_size) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(::testing::HasSubstr("FAILED")))
      << r.output;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MpiJob,
                         ::testing::Values(1, 2, 3, 4, 5, 6),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

}  // namespace

const ConformanceSetup& GetConformanceSetup() {
  static const ConformanceSetup setup{{"mpi"},
                                      nullptr,
                                      RunAsThisRank,
                                      JobWorldSize(),
                                      /*failures_throw=*/false};
  return setup;
}

}  // namespace accel::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  accel::testing::KeepMpiJobsApart();
  if (accel::testing::JobWorldSize() == 0) {
    // Outside the job, only the tests that start it.
    ::testing::GTEST_FLAG(filter) = "WorldSizes/MpiJob.*";
  }
  return RUN_ALL_TESTS();
}
