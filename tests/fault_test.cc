// Fault injection: the classic distributed-training bugs and failures end
// on every rank with a clear error that names the ranks and their calls,
// long before the collective timeout, and nothing is left running.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <regex>
#include <thread>
#include <tuple>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

ProcessResult RunFault(const std::string& scenario,
                       std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {Runfile("tests/fault_worker"),
                                   "--num_processes=2", "--main_process_port=0",
                                   "--scenario=" + scenario};
  args.insert(args.end(), extra.begin(), extra.end());
  return RunProcess(args, {}, seconds(120));
}

// A port that this test process listens on until it exits.
int HeldPort() {
  static const int port = [] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd, 1);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    return static_cast<int>(ntohs(addr.sin_port));
  }();
  return port;
}

size_t Count(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return std::distance(std::sregex_iterator(text.begin(), text.end(), re),
                       std::sregex_iterator());
}

TEST(FaultTest, BarrierOnlyOnTheMainProcessIsNamedOnEveryRank) {
  const ProcessResult r = RunFault("main_only_wait");
  EXPECT_NE(r.exit_code, 0);
  // Each rank: one error naming both calls, with their call sites.
  EXPECT_EQ(Count(r.output,
                  "error: \\[gloo\\] rank [01]/2: [a-z_]+ #2 "
                  "\\(fault_worker.cc:[0-9]+\\): ranks called "
                  "different collectives"),
            2u)
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 is in gather #2 (fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("while rank 0 waits in wait_for_everyone #2 "
                                  "(fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("rank 0 is in wait_for_everyone #2"));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;  // Timeout is 300 s.
}

TEST(FaultTest, ARankThatFailsIsNamedWithItsReasonByTheOthers) {
  // Through RunAndReportErrors: the others learn that it failed.
  const ProcessResult caught = RunFault("error_on_rank1");
  EXPECT_NE(caught.exit_code, 0);
  EXPECT_THAT(caught.output,
              HasSubstr("error: [rank 1/2] cannot read 'data.bin': disk gone"));
  EXPECT_THAT(caught.output,
              HasSubstr("error: [gloo] rank 0/2: gather #2 (fault_worker.cc:"));
  EXPECT_THAT(caught.output,
              HasSubstr("rank 1 failed: cannot read 'data.bin': disk gone"));
  EXPECT_LT(caught.elapsed, seconds(30)) << caught.output;
  // Through std::terminate: the others quote its message.
  const ProcessResult uncaught = RunFault("uncaught_on_rank1");
  EXPECT_NE(uncaught.exit_code, 0);
  EXPECT_THAT(uncaught.output,
              HasSubstr("error: [rank 1/2] cannot read 'data.bin': disk gone"));
  EXPECT_THAT(uncaught.output,
              HasSubstr("rank 1 failed: cannot read 'data.bin': disk gone"));
  EXPECT_THAT(uncaught.output, ::testing::Not(HasSubstr("terminate called")));
  EXPECT_LT(uncaught.elapsed, seconds(30)) << uncaught.output;
}

// The first error line a user sees is the cause, and the launcher names
// the rank that failed, not the first to exit: the others' errors follow
// from it ("rank 1 exited with an error" came first, then the launcher
// blamed rank 1, and rank 0's own error came last, 3 of 3 tries).
TEST(FaultTest, TheCauseIsTheFirstErrorLineAndTheRankBlamed) {
  for (const auto& [scenario, cause, other] :
       std::vector<std::tuple<std::string, int, int>>{
           {"error_on_rank0", 0, 1},
           {"error_on_rank1", 1, 0},
           {"error_on_rank0", 0, 1},
           {"error_on_rank1", 1, 0}}) {
    const ProcessResult r = RunFault(scenario);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const size_t first = r.output.find("error: ");
    ASSERT_NE(first, std::string::npos) << r.output;
    const std::string cause_line =
        "error: [rank " + std::to_string(cause) + "/2] ";
    EXPECT_EQ(r.output.compare(first, cause_line.size(), cause_line), 0)
        << r.output;
    // The cause is named, whichever exited first (a rank that stopped
    // because of it, and exited first, is said to have).
    EXPECT_THAT(r.output, HasSubstr("accel launch: rank " +
                                    std::to_string(cause) + " (pid "))
        << r.output;
    EXPECT_THAT(r.output,
                ::testing::Not(HasSubstr("accel launch: rank " +
                                         std::to_string(other) + " (pid ")))
        << r.output;
    EXPECT_LT(r.elapsed, seconds(30)) << r.output;
  }
}

// ZeRO-3's gathers run inside the model's forward, where no line of the
// program is known: the unit is named instead of "(unknown)".
TEST(FaultTest, AStage3GatherIsNamedByItsUnit) {
  const ProcessResult r = RunFault("stage3_forward_alone", {"--zero_stage=3"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("forward (ZeRO-3 all-gather of unit 0 of 2) #"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("(unknown)"))) << r.output;
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
}

TEST(FaultTest, Stage3FreeMemoryAfterEndTrainingIsAUsageError) {
  const ProcessResult r = RunFault("stage3_free_after_end", {"--zero_stage=3"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("after end_training: free_memory: this process has "
                        "left the job (end_training(), or an error), and ZeRO "
                        "needs every rank for it"));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
}

TEST(FaultTest, Stage3SaveModelOnOneRankNamesItsCall) {
  const std::string dir = MakeTempDir("save_model") + "/model";
  const ProcessResult r = RunFault("stage3_save_model_main_only",
                                   {"--zero_stage=3", "--save_dir=" + dir});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              ::testing::ContainsRegex(
                  "rank 0 is in save_model \\(ZeRO-3 all-gather\\) #[0-9]+ "
                  "\\(fault_worker.cc:[0-9]+\\)"))
      << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("transport.h")));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
}

TEST(FaultTest, ASaveThatOneRankCouldNotWriteNamesThatRank) {
  const std::string dir = MakeTempDir("disk_full") + "/state";
  const ProcessResult r = RunFault("rank1_disk_full", {"--save_dir=" + dir});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1: cannot write"));
  EXPECT_THAT(r.output, HasSubstr("rank 0: save_state: rank 1 could not "
                                  "write its file(s) into '" +
                                  dir));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
}

TEST(FaultTest, RankThatSkipsAGatherIsNamed) {
  const ProcessResult r = RunFault("skip_gather");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("ranks called different collectives"));
  EXPECT_THAT(r.output, HasSubstr("rank 0 is in wait_for_everyone #2"));
  EXPECT_THAT(r.output, HasSubstr("rank 1 is in gather #2"));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
}

TEST(FaultTest, RankThatExitsWhileOthersWaitIsNamed) {
  const ProcessResult r = RunFault("main_only_wait_then_exit");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("error: [gloo] rank 0/2: wait_for_everyone #2 "
                        "(fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("rank 1 exited (its process left the job)"));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
}

TEST(FaultTest, TimeoutSaysWhatTheLateRankIsDoing) {
  const ProcessResult r = RunFault("late_rank", {"--timeout_s=2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("error: [gloo] rank 0/2: gather #2 "
                                  "(fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("timed out after 2000 ms: rank 1 is not in a "
                                  "collective (its last was gather #1 "
                                  "(fault_worker.cc:"));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
}

TEST(FaultTest, UnsupportedDtypeIsAClearErrorOnEveryRank) {
  const ProcessResult r = RunFault("wrong_device");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(
      Count(r.output,
            "error: \\[rank [01]/2\\] tensors of dtype ComplexFloat are not "
            "supported by collectives"),
      2u)
      << r.output;
}

TEST(FaultTest, UnknownFlagIsRejectedBeforeAnythingStarts) {
  const ProcessResult r = RunProcess(
      {Runfile("tests/fault_worker"), "--num_procesess=2"}, {}, seconds(60));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("fault_worker has no flag --num_procesess "
                                  "(did you mean --num_processes?)"));
}

// One rank of a 2-rank job, started by hand, with a 2 s rendezvous timeout
// unless `extra_args` say otherwise.
ProcessResult RunOneRank(int rank, const std::string& master_addr,
                         int master_port,
                         std::vector<std::string> extra_args = {},
                         std::map<std::string, std::string> extra_env = {}) {
  std::vector<std::string> args = {Runfile("tests/fault_worker"),
                                   "--rendezvous_timeout_s=2"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::map<std::string, std::string> env = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", "2"},
      {"MASTER_ADDR", master_addr},
      {"MASTER_PORT", std::to_string(master_port)}};
  env.insert(extra_env.begin(), extra_env.end());
  return RunProcess(args, env, seconds(60));
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(FaultTest, UnreachableMasterAddrFailsWithinTheRendezvousTimeout) {
  // 192.0.2.0/24 is reserved for documentation: nothing answers there.
  const ProcessResult r = RunOneRank(1, "192.0.2.1", 29500);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("rank 1/2: rendezvous failed: could not "
                                  "connect to the rendezvous store (hosted by "
                                  "rank 0) at "
                                  "192.0.2.1:29500"));
  EXPECT_LT(r.elapsed, seconds(20)) << r.output;
}

TEST(FaultTest, PortInUseSaysWhichAndSuggestsPortZero) {
  // Rank 0 of a first job holds the port; a second job on it must say so.
  const ProcessResult r = RunOneRank(0, "127.0.0.1", HeldPort());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("already in use"));
  EXPECT_THAT(r.output, HasSubstr("--main_process_port=0"));
}

TEST(FaultTest, RankThatNeverStartsFailsWithinTheRendezvousTimeout) {
  // The collective timeout (300 s) must not be what rank 0 waits.
  const ProcessResult r = RunOneRank(0, "127.0.0.1", FreePort());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0/2: rendezvous failed: rank 1 did "
                                  "not join within"));
  EXPECT_THAT(r.output, HasSubstr("--rendezvous_timeout_s"));
  EXPECT_LT(r.elapsed, seconds(20)) << r.output;
}

// The refused process fails at once; rank 0 says at once what it refused
// and why, and goes on waiting for rank 1 (a stranger's hello must not end
// the job: see the next test), naming the refusal at the timeout.
TEST(FaultTest, SecretMismatchIsReportedOnBothSidesWithTheAddress) {
  const int port = FreePort();
  ProcessResult host;
  std::thread host_thread([&] {
    host = RunOneRank(0, "127.0.0.1", port, {"--rendezvous_timeout_s=5"},
                      {{"ACCEL_RUN_SECRET", "secret-a"}});
  });
  const ProcessResult guest =
      RunOneRank(1, "127.0.0.1", port, {"--rendezvous_timeout_s=5"},
                 {{"ACCEL_RUN_SECRET", "secret-b"}});
  host_thread.join();
  EXPECT_EQ(guest.exit_code, 1) << guest.output;
  EXPECT_THAT(guest.output, HasSubstr("rejected this process: it belongs to "
                                      "another run"));
  EXPECT_LT(guest.elapsed, seconds(5)) << guest.output;
  EXPECT_EQ(host.exit_code, 1) << host.output;
  const std::string refusal =
      "a process from 127.0.0.1 claiming rank 1 was refused (another run "
      "secret): export the same ACCEL_RUN_SECRET on every machine";
  EXPECT_THAT(host.output, HasSubstr("rendezvous: " + refusal +
                                     "; still waiting for rank 1"));
  EXPECT_THAT(host.output, HasSubstr("rank 1 did not join within"));
  EXPECT_THAT(host.output, HasSubstr("; " + refusal));
  EXPECT_LT(host.elapsed, seconds(20)) << host.output;
}

// A stranger's hello with a wrong secret, claiming a rank before the real
// one joined, is refused and reported, and the job goes on: it ended the
// rendezvous ("a process from 127.0.0.1 claiming rank 1 tried to join with
// another run secret", rc 1).
TEST(FaultTest, AStrangerClaimingARankCannotEndTheRendezvous) {
  const int port = FreePort();
  ProcessResult host;
  std::thread host_thread([&] {
    host = RunOneRank(
        0, "127.0.0.1", port,
        {"--rendezvous_timeout_s=30", "--scenario=late_rank", "--late_s=0"},
        {{"ACCEL_RUN_SECRET", "the-secret"}});
  });
  const ProcessResult stranger = RunOneRank(
      1, "127.0.0.1", port,
      {"--rendezvous_timeout_s=30", "--scenario=late_rank", "--late_s=0"},
      {{"ACCEL_RUN_SECRET", "not-the-secret"}});
  EXPECT_EQ(stranger.exit_code, 1) << stranger.output;
  // The real rank 1, after the stranger was refused.
  const ProcessResult real = RunOneRank(
      1, "127.0.0.1", port,
      {"--rendezvous_timeout_s=30", "--scenario=late_rank", "--late_s=0"},
      {{"ACCEL_RUN_SECRET", "the-secret"}});
  host_thread.join();
  EXPECT_EQ(real.exit_code, 0) << real.output;
  EXPECT_EQ(host.exit_code, 0) << host.output;
  EXPECT_THAT(host.output, HasSubstr("claiming rank 1 was refused (another "
                                     "run secret)"));
}

TEST(FaultTest, StoppedRank0IsReportedAsNotRespondingWithinTheTimeout) {
  const ProcessResult r = RunFault("stop_main", {"--timeout_s=3"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("error: [gloo] rank 1/2: gather #2 "
                                  "(fault_worker.cc:"));
  EXPECT_THAT(r.output, HasSubstr("timed out after 3000 ms"));
  EXPECT_THAT(r.output, HasSubstr("rank 0's process is stopped or overloaded"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("crashed")));
  // 3 s timeout + 2 s diagnosis, then the launcher's grace periods (a
  // stopped process only goes with SIGKILL); not the store's 30 s.
  EXPECT_LT(r.elapsed, seconds(28)) << r.output;
}

TEST(FaultTest, TimeoutNamesTheActualLastCallOfAStoppedRank) {
  const ProcessResult r = RunFault("burst_then_stop", {"--timeout_s=4"});
  EXPECT_NE(r.exit_code, 0);
  // Rank 1 made 51 gathers, then stopped before it could publish them all.
  EXPECT_THAT(r.output, HasSubstr("error: [gloo] rank 0/2: gather #52 "));
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "rank 1 (is not in a collective \\(its last was|is "
                            "not responding .*its last call was) gather #51 "
                            "\\(fault_worker.cc:"))
      << r.output;
}

TEST(FaultTest, ShapeMismatchCarriesTheCallsNumberAndSite) {
  const ProcessResult r = RunFault("shape_mismatch");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(Count(r.output,
                  "error: \\[gloo\\] rank [01]/2: gather #2 "
                  "\\(fault_worker.cc:[0-9]+\\): tensors differ across ranks"),
            2u)
      << r.output;
}

// Raises this process's open-file limit to what is allowed, for tests that
// play a stranger holding many connections.
rlim_t RaiseOpenFileLimit() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

TEST(FaultTest, JobFinishesWhileAStrangerHoldsManyIdleConnections) {
  if (RaiseOpenFileLimit() < 1200) GTEST_SKIP() << "needs ulimit -n >= 1200";
  const int port = FreePort();
  const std::string save_dir = MakeTempDir("crowded");
  std::vector<int> held;
  std::atomic<bool> done{false};
  std::thread stranger([&] {
    // Waits for the store, then opens 1,020 connections and says nothing.
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    for (int tries = 0; held.size() < 1020 && tries < 20000 && !done; ++tries) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        held.push_back(fd);
      } else {
        close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  });
  // Rank 0 may hold 1,024 files in all, as under a default `ulimit -n`.
  const ProcessResult r = RunProcess(
      {"/bin/sh", "-c", "ulimit -n 1024 && exec \"$0\" \"$@\"",
       Runfile("tests/fault_worker"), "--num_processes=2",
       "--main_process_port=" + std::to_string(port),
       "--scenario=idle_then_save", "--idle_s=6", "--save_dir=" + save_dir},
      {}, seconds(120));
  done = true;
  stranger.join();
  const size_t opened = held.size();
  for (int fd : held) close(fd);
  EXPECT_GE(opened, 1000u) << "the stranger could not connect";
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("saved"));
}

TEST(FaultTest, ASecondJobSharingTheSecretAndPortCannotDisturbTheFirst) {
  const int port = FreePort();
  const std::map<std::string, std::string> shared = {
      {"ACCEL_RUN_SECRET", "exported-by-the-user"}};
  // The first job: rank 0 waits ~15 s in a gather for a late rank 1, its
  // watchdog looking for ranks that left all the while.
  ProcessResult first;
  std::thread first_thread([&] {
    first = RunProcess({Runfile("tests/fault_worker"), "--num_processes=2",
                        "--main_process_port=" + std::to_string(port),
                        "--scenario=late_rank", "--late_s=15"},
                       shared, seconds(90));
  });
  std::this_thread::sleep_for(seconds(3));
  // A second launch on the same port, and a rank 1 started by hand with the
  // same secret: both reach the first job's port, then go away.
  const ProcessResult second =
      RunProcess({Runfile("tests/fault_worker"), "--num_processes=2",
                  "--main_process_port=" + std::to_string(port),
                  "--scenario=main_only_wait"},
                 shared, seconds(60));
  const ProcessResult impostor = RunOneRank(1, "127.0.0.1", port, {}, shared);
  first_thread.join();
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_EQ(impostor.exit_code, 1) << impostor.output;
  EXPECT_EQ(first.exit_code, 0) << first.output;
  EXPECT_THAT(first.output, HasSubstr("no error"));
}

// Accelerate's state is one per process; so is accel's job: Accelerators
// made one after another, or side by side, share it (a second one used to
// join again and fail: "already has a rank 1", or "the listening socket
// handed over (fd 3) is not a socket").
TEST(FaultTest, AcceleratorsInTurnShareTheJob) {
  const ProcessResult r = RunFault("accelerators_in_turn");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("second gathered 2"));
  EXPECT_THAT(r.output, HasSubstr("third gathered 2"));
  EXPECT_THAT(r.output,
              HasSubstr("late: an Accelerator was made after end_training()"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("error")));
}

}  // namespace
}  // namespace accel::testing
