// The rank processes of one machine, as the launcher runs them: each forked
// into its own process group (which dies with the launcher, even by
// SIGKILL), signalled as a group, reaped, and stopped with a grace period.
//
//   ChildSetup setup;
//   setup.env = {{"RANK", "0"}};
//   std::vector<RankProcess> ranks = {{0, StartRank({"./train"}, setup, 0,
//   1)}}; if (WaitForExit(ranks, std::chrono::seconds(5))) {
//     StopAll(ranks, std::chrono::seconds(10), SIGTERM);
//   }
//   std::cout << DescribeStatus(ranks[0].status);  // "exited with code 0"
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "accel/runtime/launch/rank_output.h"

namespace accel {

struct RankProcess {
  int rank;
  pid_t pid;
  bool running = true;
  int status = 0;  // waitpid's, once it has exited.
};

// What a rank's child process does before exec.
struct ChildSetup {
  std::map<std::string, std::string> env;
  int keep_fd = -1;  // Inherited across exec (rank 0's store socket).
  // The variable in env that names keep_fd ("ACCEL_STORE_LISTEN_FD"): a
  // rank forked by the zygote (zygote.h) gets the socket under another
  // number and the variable rewritten.
  std::string keep_fd_variable;
  RankOutput::Pipes pipes;
};

// Forks one rank running `command`. Exec failures come back through a
// close-on-exec pipe so that "no such program" is reported once, by the
// launcher, clearly (UsageError); Error when fork fails.
pid_t StartRank(const std::vector<std::string>& command,
                const ChildSetup& setup, int rank, int world);

// Raises the soft limit on open files to the hard one (many ranks mean
// many connections: rank 0's store, each rank's full mesh), as torchrun
// users do by hand.
void RaiseOpenFileLimit();

// "exited with code 3", "was killed by signal 9 (Killed); ...".
std::string DescribeStatus(int status);
// The shell's exit code for a waitpid status (128 + signal when killed).
int ExitCodeOf(int status);

// `signal` to every rank's process group.
void SignalAll(const std::vector<RankProcess>& ranks, int signal);
// Reaps the ranks that have exited; true if some are still running.
bool ReapAndCheckRunning(std::vector<RankProcess>& ranks);
// Reaps ranks that exit within `timeout`; true if some are still running.
// `interrupt` (optional) ends the wait early when it returns true.
bool WaitForExit(std::vector<RankProcess>& ranks,
                 std::chrono::milliseconds timeout,
                 const std::function<bool()>& interrupt = {});
// Sends `first_signal` to every rank's group, then SIGKILL to whatever is
// left after the grace period; reaps the ranks.
void StopAll(std::vector<RankProcess>& ranks, std::chrono::milliseconds grace,
             int first_signal);

}  // namespace accel
