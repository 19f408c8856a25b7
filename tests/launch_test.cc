// End-to-end tests: real processes through the launcher, on free ports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

const auto kTimeout = seconds(60);

std::string Launcher() { return Runfile("tools/launch"); }
std::string Worker() { return Runfile("tests/mp_worker"); }

void ExpectNoneAlive(const std::string& pid_dir, size_t expected_pids) {
  const std::vector<pid_t> pids = ReadPidFiles(pid_dir);
  EXPECT_EQ(pids.size(), expected_pids);
  // Reparented grandchildren are reaped asynchronously: allow a moment.
  for (int i = 0; i < 100; ++i) {
    bool any = false;
    for (pid_t pid : pids) any |= ProcessAlive(pid);
    if (!any) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << "pid " << pid;
}

class LaunchTest : public ::testing::TestWithParam<int> {};

TEST_P(LaunchTest, RanksRunEveryCollective) {
  const int n = GetParam();
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=" + std::to_string(n),
       "--main_process_port=0", "--", Worker(), "--scenario=collectives"},
      {}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double sum = n * (n + 1) / 2.0;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_THAT(r.output, HasSubstr("rank " + std::to_string(rank) + "/" +
                                    std::to_string(n) + " ok: sum=" +
                                    ::testing::PrintToString(sum)));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LaunchTest, ::testing::Values(1, 2, 3));

TEST(LaunchTest, ProgramLaunchesItselfWithNumProcesses) {
  const ProcessResult r = RunProcess(
      {Worker(), "--num_processes=2", "--main_process_port=0"}, {}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0/2 ok"));
  EXPECT_THAT(r.output, HasSubstr("rank 1/2 ok"));
}

TEST(LaunchTest, RankKilledMidCollectiveIsNamedByEveryoneAndNothingSurvives) {
  const std::string pid_dir = MakeTempDir("die");
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=3", "--main_process_port=0", "--", Worker(),
       "--scenario=die", "--die_rank=1", "--pid_dir=" + pid_dir},
      {}, kTimeout);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("accel launch: rank 1 (pid"));
  EXPECT_THAT(r.output, HasSubstr("killed by signal 9"));
  // Both survivors report the dead rank themselves, as peer errors.
  for (const char* survivor : {"rank 0/3", "rank 2/3"}) {
    EXPECT_THAT(r.output,
                HasSubstr(std::string("[gloo] ") + survivor + ": allreduce #"))
        << r.output;
  }
  EXPECT_THAT(r.output, HasSubstr("rank 1 crashed (its process left the job)"));
  EXPECT_LT(r.elapsed, seconds(15)) << r.output;
  ExpectNoneAlive(pid_dir, 6);
}

TEST(LaunchTest, SigtermToTheLauncherReachesEveryRankAndGrandchild) {
  const std::string pid_dir = MakeTempDir("term");
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=2", "--main_process_port=0", "--", Worker(),
       "--scenario=sleep", "--pid_dir=" + pid_dir},
      {}, kTimeout, [&](pid_t launcher) {
        // Wait until both ranks have written their pids, then stop the job.
        for (int i = 0; i < 1000 && ReadPidFiles(pid_dir).size() < 4; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        kill(launcher, SIGTERM);
      });
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_THAT(r.output, HasSubstr("got signal 15"));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
  ExpectNoneAlive(pid_dir, 4);
}

TEST(LaunchTest, UnknownBackendListsTheAvailableOnes) {
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--backend=nope", "--", Worker()},
                 {}, kTimeout);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("unknown backend 'nope'; available backends: gloo"));
  EXPECT_LT(r.elapsed, seconds(15)) << r.output;
}

TEST(LaunchTest, MissingProgramIsAClearError) {
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=2", "--", "/no/such/program"},
                 {}, kTimeout);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("cannot run '/no/such/program': No such file "
                                  "or directory"));
}

TEST(LaunchTest, BadEnvironmentIsAClearErrorNotAHang) {
  const ProcessResult r = RunProcess({Worker()},
                                     {{"RANK", "2"},
                                      {"WORLD_SIZE", "2"},
                                      {"MASTER_ADDR", "127.0.0.1"},
                                      {"MASTER_PORT", "29500"}},
                                     kTimeout);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr("error: RANK must be in [0, WORLD_SIZE) = [0, 2), "
                        "found 2"));
}

TEST(LaunchTest, MissingRankTimesOutNamingTheRendezvous) {
  // Rank 1 of 2 alone: rank 0 never comes, so the store is unreachable.
  const ProcessResult r = RunProcess({Worker(), "--timeout_ms=1500"},
                                     {{"RANK", "1"},
                                      {"WORLD_SIZE", "2"},
                                      {"MASTER_ADDR", "127.0.0.1"},
                                      {"MASTER_PORT", "1"}},
                                     kTimeout);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("rank 1/2: rendezvous failed: could not "
                                  "connect to the rendezvous store at "
                                  "127.0.0.1:1"));
  EXPECT_LT(r.elapsed, seconds(10));
}

}  // namespace
}  // namespace accel::testing
