// The launcher's messages and the ranks of one attempt as it watches them
// (launch_rank_set.h): reaping, the root cause of a failure, stop signals
// passed on, preemption.
#include "accel/runtime/launch/launch_rank_set.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/preemption.h"

namespace accel::launch_internal {
namespace {

// What the launcher passes a stop signal on to the ranks as (see
// kStopSignals, launch.cc): SIGTERM for SIGHUP and SIGQUIT, the others as
// they are.
int ForwardedAs(int signal_number) {
  return signal_number == SIGHUP || signal_number == SIGQUIT ? SIGTERM
                                                             : signal_number;
}

}  // namespace

void Reporter::operator()(const std::string& text) const {
  if (output_ != nullptr) {
    output_->Message("accel launch: " + text);
    return;
  }
  std::fflush(stderr);
  const std::string line = (AtLineStart(STDERR_FILENO) ? "" : "\n") +
                           ("accel launch: " + text) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

bool Reporter::AtLineStart(int fd) {
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) return false;
  if (info.st_size == 0) return true;
  // A shell's 2>file opens it write-only: read it through a second open.
  const int reader =
      open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY);
  if (reader < 0) return false;
  char last = 0;
  const bool ended =
      pread(reader, &last, 1, info.st_size - 1) == 1 && last == '\n';
  close(reader);
  return ended;
}

bool RankSet::ReapExited(const RankProcess** failed, int* status) {
  while (true) {
    int s = 0;
    const pid_t pid = waitpid(-1, &s, WNOHANG);
    if (pid <= 0) return false;
    for (auto& r : ranks_) {
      if (r.pid != pid || !r.running) continue;
      r.running = false;
      r.status = s;
      --running_;
      ACCEL_VLOG(1) << "launch: rank " << r.rank << " (pid " << r.pid << ") "
                    << DescribeStatus(s);
      // Whatever the rank left in its group goes with it.
      kill(-r.pid, SIGKILL);
      if (ExitCodeOf(s) != 0) {
        *failed = &r;
        *status = s;
        return true;
      }
    }
  }
}

Attempt RankSet::FailWith(const RankProcess& failed, int status,
                          const char* when) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == kPreemptedExitCode) {
    return Preempted(failed);
  }
  const RankProcess* cause = &failed;
  if (IsConsequence(status)) {
    WaitForExit(ranks_, options_.report_grace,
                [&] { return Cause() != nullptr; });
    if (Cause() != nullptr) cause = Cause();
  }
  const int cause_status = cause == &failed ? status : cause->status;
  size_t running = 0;
  for (const RankProcess& r : ranks_) running += r.running ? 1 : 0;
  report_(Name(*cause) + " (pid " + std::to_string(cause->pid) + ") " +
          DescribeStatus(cause_status) + when +
          (cause != &failed
               ? "; " + Name(failed) + " stopped because of it (exit code " +
                     std::to_string(kPeerFailedExitCode) + ")"
               : std::string()) +
          (running > 0
               ? "; stopping the other " + std::to_string(running) + " rank(s)"
               : std::string()));
  if (WaitForExit(ranks_, options_.report_grace)) {
    report_("stopping the ranks still running");
  }
  StopAll(ranks_, options_.grace, SIGTERM);
  running_ = 0;
  return {ExitCodeOf(cause_status), false};
}

bool RankSet::IsConsequence(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == kPeerFailedExitCode;
}

std::string RankSet::Name(const RankProcess& r) {
  return r.rank == kMpirun ? std::string("mpirun")
                           : "rank " + std::to_string(r.rank);
}

bool RankSet::FinishedCleanly(int rank) const {
  for (auto it = ranks_.rbegin(); it != ranks_.rend(); ++it) {
    if (it->rank == rank) return !it->running && ExitCodeOf(it->status) == 0;
  }
  return false;
}

std::string RankSet::StillRunning() const {
  std::string text;
  for (const RankProcess& r : ranks_) {
    if (!r.running) continue;
    text += (text.empty() ? "" : ", ") + Name(r) + " (pid " +
            std::to_string(r.pid) + ")";
  }
  return text;
}

const RankProcess* RankSet::Cause() const {
  for (const RankProcess& r : ranks_) {
    if (!r.running && ExitCodeOf(r.status) != 0 && !IsConsequence(r.status)) {
      return &r;
    }
  }
  return nullptr;
}

std::optional<Attempt> RankSet::CheckSignal() {
  const int sig = g_forwarded_signal.exchange(0);
  if (sig == 0) return std::nullopt;
  const int forwarded = ForwardedAs(sig);
  const auto grace =
      std::chrono::duration_cast<std::chrono::seconds>(options_.signal_grace);
  report_("got " + std::string(SignalName(sig)) + " (" + strsignal(sig) +
          "); passing " + SignalName(forwarded) + " to the " +
          std::to_string(running_) + " running rank(s), which get " +
          std::to_string(grace.count()) +
          " s to save and leave (--signal_grace_s; another signal stops "
          "them at once)");
  SignalAll(ranks_, forwarded);
  int second = 0;
  if (WaitForExit(ranks_, options_.signal_grace, [&] {
        second = g_forwarded_signal.exchange(0);
        return second != 0;
      })) {
    report_(second != 0
                ? "got " + std::string(SignalName(second)) +
                      " again: stopping the ranks now"
                : "ranks still running after " + std::to_string(grace.count()) +
                      " s: stopping them");
    StopAll(ranks_, std::chrono::milliseconds(0), SIGKILL);
  }
  return Stopped(128 + sig);
}

Attempt RankSet::Preempted(const RankProcess& first) {
  report_("rank " + std::to_string(first.rank) + " exited with code " +
          std::to_string(kPreemptedExitCode) +
          ", accel's code for a rank that saved and left after a stop "
          "signal" +
          (running_ > 0
               ? "; the other " + std::to_string(running_) + " rank(s) get " +
                     std::to_string(options_.signal_grace.count() / 1000) +
                     " s to do the same"
               : std::string()));
  if (WaitForExit(ranks_, options_.signal_grace,
                  [] { return g_forwarded_signal.load() != 0; })) {
    report_("stopping the ranks still running");
    StopAll(ranks_, std::chrono::milliseconds(0), SIGKILL);
  }
  return Stopped(kPreemptedExitCode);
}

Attempt RankSet::Stopped(int otherwise) {
  running_ = 0;
  size_t saved = 0;
  for (const RankProcess& r : ranks_) {
    saved += WIFEXITED(r.status) && WEXITSTATUS(r.status) == kPreemptedExitCode;
  }
  if (!ranks_.empty() && saved == ranks_.size()) {
    report_("all " + std::to_string(saved) +
            " rank(s) saved and left (exit code " +
            std::to_string(kPreemptedExitCode) +
            "); a run with --resume continues from their checkpoint");
    return Attempt{kPreemptedExitCode, true};
  }
  return Attempt{otherwise == kPreemptedExitCode ? 1 : otherwise, true};
}

}  // namespace accel::launch_internal
