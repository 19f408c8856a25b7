// Fault injection: the classic distributed-training bugs and failures end
// on every rank with a clear error that names the ranks and their calls,
// long before the collective timeout, and nothing is left running.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <regex>

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
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("unknown command line flag 'num_procesess'"));
}

// One rank of a 2-rank job, started by hand, with a 2 s rendezvous timeout.
ProcessResult RunOneRank(int rank, const std::string& master_addr,
                         int master_port) {
  return RunProcess({Runfile("tests/fault_worker"), "--rendezvous_timeout_s=2"},
                    {{"RANK", std::to_string(rank)},
                     {"WORLD_SIZE", "2"},
                     {"MASTER_ADDR", master_addr},
                     {"MASTER_PORT", std::to_string(master_port)}},
                    seconds(60));
}

TEST(FaultTest, UnreachableMasterAddrFailsWithinTheRendezvousTimeout) {
  // 192.0.2.0/24 is reserved for documentation: nothing answers there.
  const ProcessResult r = RunOneRank(1, "192.0.2.1", 29500);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("rank 1/2: rendezvous failed: could not "
                                  "connect to the rendezvous store at "
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

}  // namespace
}  // namespace accel::testing
