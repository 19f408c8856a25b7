// Private to accel launch (launch.cc): the launcher's messages (Reporter)
// and the ranks of one attempt as it watches them (RankSet): reaping, the
// root cause of a failure, stop signals passed on, preemption.
//
//   RankSet ranks(options, report);
//   ranks.Add(rank, pid);
//   if (auto stopped = ranks.CheckSignal()) return *stopped;
//   if (ranks.ReapExited(&failed, &status)) {
//     return ranks.FailWith(*failed, status, "");
//   }
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "accel/runtime/launch/launch.h"
#include "accel/runtime/launch/rank_output.h"
#include "accel/runtime/launch/rank_processes.h"

namespace accel::launch_internal {

// The stop signal the launcher got (its handler sets it), 0 for none.
extern std::atomic<int> g_forwarded_signal;

// The rank number of the one child when mpirun starts the ranks.
constexpr int kMpirun = -1;

// Where launcher messages go: through the output relay when there is one
// (it knows whether the console's line is finished), else straight to
// stderr, on a fresh line since a rank's progress bar may not have ended
// its own.
class Reporter {
 public:
  void set_output(RankOutput* output) { output_ = output; }
  void operator()(const std::string& text) const;

 private:
  RankOutput* output_ = nullptr;

  // Whether what the ranks wrote to `fd` ends a line. Known for a file (its
  // last byte); a terminal or a pipe cannot tell, and a rank's unfinished
  // progress bar may be there: a line break then starts a fresh line (a
  // blank line at worst). In a log file the launcher added a blank line
  // before each message.
  static bool AtLineStart(int fd);
};

// How one attempt (a start of every rank) ended.
struct Attempt {
  int exit_code = 0;
  bool interrupted = false;  // Stopped by a signal to the launcher.
};

// This machine's ranks of one attempt, as the launcher watches them.
class RankSet {
 public:
  RankSet(const LaunchOptions& options, const Reporter& report)
      : options_(options), report_(report) {}

  // Reaps ranks that exited; returns the first failure's status, if any.
  bool ReapExited(const RankProcess** failed, int* status);

  // After a failure: lets the others report it, then stops them. A rank
  // that ended because another failed (kPeerFailedExitCode) is not the
  // cause: the launcher waits (report_grace) for the rank whose failure it
  // followed, and names that one, as torchrun's root cause (the first to
  // exit was often the consequence).
  Attempt FailWith(const RankProcess& failed, int status, const char* when);

  static bool IsConsequence(int status);
  static std::string Name(const RankProcess& r);
  // The first rank that exited with an error of its own, if any has yet.
  const RankProcess* Cause() const;

  // After a stop signal: passes it on and gives the ranks the grace period
  // to save and leave (a second signal ends it), then stops what is left.
  std::optional<Attempt> CheckSignal();

  // A rank saved and left after a stop signal that reached the ranks
  // directly (srun --signal, torchrun's agent, kill): the others are doing
  // the same, so they get the grace period rather than SIGTERM.
  Attempt Preempted(const RankProcess& first);

  // Once every rank has exited after a stop: kPreemptedExitCode when each
  // saved and left, else `otherwise`. Never restarted.
  Attempt Stopped(int otherwise);

  void Add(int rank, pid_t pid) {
    ranks_.push_back({rank, pid});
    ++running_;
  }
  void StopAllNow() { StopAll(ranks_, options_.grace, SIGTERM); }
  // Whether the last process started for `rank` exited with code 0.
  bool FinishedCleanly(int rank) const;
  // The ranks whose last process is still running ("1, 3").
  std::string StillRunning() const;
  size_t running() const { return running_; }
  size_t started() const { return ranks_.size(); }

 private:
  const LaunchOptions& options_;
  const Reporter& report_;
  std::vector<RankProcess> ranks_;
  size_t running_ = 0;
};

}  // namespace accel::launch_internal
