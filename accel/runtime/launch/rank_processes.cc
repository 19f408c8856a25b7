#include "accel/runtime/launch/rank_processes.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel {
namespace {

std::string ProcessLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NPROC, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(limit.rlim_cur);
}

}  // namespace

void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

pid_t StartRank(const std::vector<std::string>& command,
                const ChildSetup& setup, int rank, int world) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    throw Error(std::string("launch: pipe failed: ") + std::strerror(errno));
  }
  std::vector<char*> argv;
  for (const auto& arg : command)
    argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(report[0]);
    close(report[1]);
    throw Error(
        "launch: cannot start rank " + std::to_string(rank) + " of " +
        std::to_string(world) + ": fork failed: " + std::strerror(error) +
        (error == EAGAIN
             ? " (too many processes: ulimit -u is " + ProcessLimit() + ")"
             : std::string()));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // If the launcher dies (even by SIGKILL), the rank goes too.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    for (const auto& [key, value] : setup.env) {
      setenv(key.c_str(), value.c_str(), 1);
    }
    if (setup.keep_fd >= 0) fcntl(setup.keep_fd, F_SETFD, 0);
    if (setup.pipes.out >= 0) dup2(setup.pipes.out, 1);
    if (setup.pipes.err >= 0) dup2(setup.pipes.err, 2);
    execvp(argv[0], argv.data());
    const int error = errno;
    ssize_t ignored = write(report[1], &error, sizeof(error));
    (void)ignored;
    _exit(127);
  }
  setpgid(pid, pid);
  close(report[1]);
  int error = 0;
  const ssize_t n = read(report[0], &error, sizeof(error));
  close(report[0]);
  if (n == sizeof(error)) {
    waitpid(pid, nullptr, 0);
    throw UsageError("cannot run '" + command[0] +
                     "': " + std::strerror(error));
  }
  ACCEL_VLOG(1) << "launch: started rank " << rank << "/" << world << " as pid "
                << pid;
  return pid;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) {
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    std::string text = "was killed by signal " +
                       std::to_string(WTERMSIG(status)) + " (" +
                       strsignal(WTERMSIG(status)) + ")";
    if (WTERMSIG(status) == SIGKILL) {
      text +=
          "; if nobody sent it, the kernel may have run out of memory "
          "(see dmesg)";
    }
    return text;
  }
  return "stopped with status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void SignalAll(const std::vector<RankProcess>& ranks, int signal) {
  // The whole process group: a rank's own children must not outlive it
  // (also those of a rank that has exited).
  for (const auto& r : ranks) kill(-r.pid, signal);
}

bool ReapAndCheckRunning(std::vector<RankProcess>& ranks) {
  bool running = false;
  for (auto& r : ranks) {
    if (r.running && waitpid(r.pid, &r.status, WNOHANG) == r.pid) {
      r.running = false;
    }
    running |= r.running;
  }
  return running;
}

bool WaitForExit(std::vector<RankProcess>& ranks,
                 std::chrono::milliseconds timeout,
                 const std::function<bool()>& interrupt) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ReapAndCheckRunning(ranks)) {
    if (std::chrono::steady_clock::now() >= deadline) return true;
    if (interrupt && interrupt()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void StopAll(std::vector<RankProcess>& ranks, std::chrono::milliseconds grace,
             int first_signal) {
  SignalAll(ranks, first_signal);
  WaitForExit(ranks, grace);
  SignalAll(ranks, SIGKILL);
  for (auto& r : ranks) {
    if (r.running) waitpid(r.pid, &r.status, 0);
    r.running = false;
  }
}

}  // namespace accel
