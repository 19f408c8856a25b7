// The MPI backend's failure paths, with real jobs under mpirun: a failed
// collective is reported on every rank that found it, with the usual
// diagnostics, and then ends the job (MPI cannot cancel it), long before the
// collective's timeout. Also: plain `mpirun -np 2 program` needs no other
// set-up, `auto` picks mpi there, and accel's launcher starts MPI jobs
// through mpirun.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "accel/runtime/launch/mpirun.h"
#include "backends/mpi/mpi_test_jobs.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

// A job that hangs is one the test failed to end: far below the workers'
// 30 s sleeps and the collectives' 300 s timeout.
constexpr auto kEndsWithin = seconds(25);

const auto* const kApart =
    ::testing::AddGlobalTestEnvironment(new CallOnSetUp(KeepMpiJobsApart));

std::string Worker() { return Runfile("backends/mpi/mpi_fault_worker"); }

ProcessResult RunJob(const std::string& scenario,
                     std::vector<std::string> flags = {"--backend=mpi"}) {
  std::vector<std::string> program = {Worker(), "--scenario=" + scenario};
  program.insert(program.end(), flags.begin(), flags.end());
  return RunProcess(MpirunCommand(2, program, {}), {}, seconds(120));
}

size_t Count(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  return static_cast<size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re),
                    std::sregex_iterator()));
}

TEST(MpiJobTest, PlainMpirunNeedsNoSetUpAndAutoPicksMpi) {
  const ProcessResult r = RunJob("sum", {"--backend=auto"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0 of 2 (mpi): sum 3"));
  EXPECT_THAT(r.output, HasSubstr("rank 1 of 2 (mpi): sum 3"));
}

TEST(MpiJobTest, ACommunicatorOnTheProgramsOwnMpiTransport) {
  const ProcessResult r = RunJob("caller_comm");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0 is rank 1 of the reversed "
                                  "communicator, which holds world ranks 1 0"));
  EXPECT_THAT(r.output, HasSubstr("rank 1 is rank 0 of the reversed "
                                  "communicator, which holds world ranks 1 0"));
}

TEST(MpiJobTest, AProgramsMpiWithoutThreadSupportIsAClearError) {
  const ProcessResult r = RunJob("thread_single");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("MPI was initialized with MPI_THREAD_SINGLE, but accel "
                        "runs collectives on a worker thread and needs "
                        "MPI_THREAD_SERIALIZED at least"));
  EXPECT_LT(r.elapsed, kEndsWithin) << r.output;
}

TEST(MpiJobTest, TheLauncherStartsMpiJobsThroughMpirun) {
  const ProcessResult launched = RunProcess(
      {Runfile("tools/launch"), "--num_processes=3", "--main_process_port=0",
       "--backend=mpi", "--", Worker(), "--scenario=sum"},
      {}, seconds(120));
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  EXPECT_EQ(Count(launched.output, "rank [012] of 3 \\(mpi\\): sum 6"), 3u)
      << launched.output;

  // A program's own --num_processes does the same.
  const ProcessResult itself =
      RunProcess({Worker(), "--num_processes=2", "--main_process_port=0",
                  "--backend=mpi", "--scenario=sum"},
                 {}, seconds(120));
  ASSERT_EQ(itself.exit_code, 0) << itself.output;
  EXPECT_EQ(Count(itself.output, "rank [01] of 2 \\(mpi\\): sum 3"), 2u)
      << itself.output;
}

TEST(MpiJobTest, ProcessesNotStartedByMpiAreToldHow) {
  // Two processes that MPI sees as two separate one-rank jobs.
  const ProcessResult r = RunProcess(
      {Runfile("tools/launch"), "--num_processes=2", "--main_process_port=0",
       "--", Worker(), "--scenario=sum", "--backend=mpi"},
      {}, seconds(120));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("MPI places this process at rank 0 of 1: "
                                  "--backend=mpi needs processes started by "
                                  "mpirun or srun"));
}

TEST(MpiJobTest, MismatchedCollectivesAreReportedOnEveryRankThenAbort) {
  const ProcessResult r = RunJob("mismatch");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.elapsed, kEndsWithin) << r.output;
  EXPECT_THAT(r.output, HasSubstr("error: [mpi] rank 0/2: wait_for_everyone #1 "
                                  "(mpi_fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("error: [mpi] rank 1/2: gather #1 "
                                  "(mpi_fault_worker.cc:"));
  // A rank whose partner failed first sees it as having left the call.
  EXPECT_EQ(Count(r.output,
                  "ranks called different collectives: rank [01] "
                  "(is in|left) (gather|wait_for_everyone) #1"),
            2u)
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("[allgather float32 x 1]"));
  EXPECT_THAT(r.output, HasSubstr("ending the job with MPI_Abort"));
}

TEST(MpiJobTest, ATimeoutNamesTheMissingRankAndEndsTheJob) {
  const ProcessResult r = RunJob("timeout");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.elapsed, kEndsWithin) << r.output;
  EXPECT_THAT(r.output, HasSubstr("error: [mpi] rank 0/2: barrier #1 "
                                  "(mpi_fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("timed out after 500 ms: rank 1 has not "
                                  "called a collective yet"));
  EXPECT_THAT(r.output, Not(HasSubstr("rank 1 finished")));
}

TEST(MpiJobTest, ARankThatLeftIsNamed) {
  const ProcessResult r = RunJob("departed");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.elapsed, kEndsWithin) << r.output;
  EXPECT_THAT(r.output, HasSubstr("error: [mpi] rank 0/2: barrier #2 "
                                  "(mpi_fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("rank 1 exited (its process left the job)"));
  EXPECT_THAT(r.output, Not(HasSubstr("rank 1 finished")));
}

TEST(MpiJobTest, AKilledRankEndsTheJob) {
  const ProcessResult r = RunJob("killed");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.elapsed, kEndsWithin) << r.output;
}

}  // namespace
}  // namespace accel::testing
