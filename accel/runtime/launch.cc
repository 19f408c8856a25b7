#include "accel/runtime/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "accel/runtime/errors.h"
#include "accel/runtime/net.h"

namespace accel {
namespace {

std::atomic<int> g_forwarded_signal{0};

void RecordSignal(int signal) { g_forwarded_signal = signal; }

struct Rank {
  int rank;
  pid_t pid;
  bool running = true;
};

std::string RandomSecret() {
  unsigned char bytes[16] = {};
  std::ifstream random("/dev/urandom", std::ios::binary);
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    throw Error("cannot read /dev/urandom for the run secret");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string secret;
  for (unsigned char b : bytes) {
    secret += kHex[b >> 4];
    secret += kHex[b & 15];
  }
  return secret;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) {
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "stopped with status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void Validate(const LaunchOptions& o) {
  if (o.num_processes < 1) {
    throw UsageError("--num_processes must be at least 1, found " +
                     std::to_string(o.num_processes));
  }
  if (o.num_machines < 1 || o.num_processes % o.num_machines != 0) {
    throw UsageError("--num_processes (" + std::to_string(o.num_processes) +
                     ") must be a multiple of --num_machines (" +
                     std::to_string(o.num_machines) + ")");
  }
  if (o.machine_rank < 0 || o.machine_rank >= o.num_machines) {
    throw UsageError("--machine_rank must be in [0, " +
                     std::to_string(o.num_machines) + "), found " +
                     std::to_string(o.machine_rank));
  }
  if (o.main_process_port < 0 || o.main_process_port > 65535) {
    throw UsageError("--main_process_port must be in [0, 65535], found " +
                     std::to_string(o.main_process_port));
  }
  if (o.main_process_port == 0 && o.num_machines > 1) {
    throw UsageError(
        "--main_process_port=0 (pick a free port) works on one machine only; "
        "give every machine the same explicit port");
  }
  if (o.max_restarts < 0) {
    throw UsageError("--max_restarts must not be negative, found " +
                     std::to_string(o.max_restarts));
  }
  if (o.threads_per_process < 1) {
    throw UsageError("threads per process must be at least 1");
  }
}

// Forks one rank. Exec failures come back through a close-on-exec pipe so
// that "no such program" is reported once, by the launcher, clearly.
pid_t StartRank(const std::vector<std::string>& command,
                const std::map<std::string, std::string>& env) {
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
    throw Error(std::string("launch: fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // If the launcher dies (even by SIGKILL), the rank goes too.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
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
  return pid;
}

void SignalAll(const std::vector<Rank>& ranks, int signal) {
  // The whole process group: a rank's own children must not outlive it.
  for (const auto& r : ranks) kill(-r.pid, signal);
}

// Reaps ranks that exit within `timeout`; true if some are still running.
bool WaitForExit(std::vector<Rank>& ranks, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto any_running = [&] {
    bool running = false;
    for (auto& r : ranks) {
      if (r.running && waitpid(r.pid, nullptr, WNOHANG) == r.pid) {
        r.running = false;
      }
      running |= r.running;
    }
    return running;
  };
  while (any_running()) {
    if (std::chrono::steady_clock::now() >= deadline) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Sends `first_signal` to every rank's group, then SIGKILL to whatever is
// left after the grace period; reaps the ranks.
void StopAll(std::vector<Rank>& ranks, std::chrono::milliseconds grace,
             int first_signal) {
  SignalAll(ranks, first_signal);
  WaitForExit(ranks, grace);
  SignalAll(ranks, SIGKILL);
  for (auto& r : ranks) {
    if (r.running) waitpid(r.pid, nullptr, 0);
    r.running = false;
  }
}

}  // namespace

namespace {

struct Attempt {
  int exit_code = 0;
  bool interrupted = false;  // Stopped by a signal to the launcher.
};

// Starts this machine's ranks once and watches them until all have exited,
// one has failed, or the launcher got a signal.
Attempt RunRanks(const LaunchOptions& options,
                 const std::vector<std::string>& argv, int port,
                 const std::string& secret, int restart_count) {
  const int local_world_size = options.num_processes / options.num_machines;
  std::vector<Rank> ranks;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  try {
    for (int local = 0; local < local_world_size; ++local) {
      const int rank = options.machine_rank * local_world_size + local;
      std::map<std::string, std::string> env = {
          {"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(options.num_processes)},
          {"LOCAL_RANK", std::to_string(local)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
          {"GROUP_RANK", std::to_string(options.machine_rank)},
          {"MASTER_ADDR", options.main_process_ip},
          {"MASTER_PORT", std::to_string(port)},
          {"ACCEL_RUN_SECRET", secret},
          {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
          {"OMP_NUM_THREADS",
           omp ? omp : std::to_string(options.threads_per_process)},
      };
      ranks.push_back({rank, StartRank(argv, env)});
    }
  } catch (...) {
    StopAll(ranks, options.grace, SIGTERM);
    throw;
  }

  Attempt attempt;
  size_t running = ranks.size();
  while (running > 0) {
    if (const int sig = g_forwarded_signal.exchange(0)) {
      std::fprintf(stderr,
                   "accel launch: got signal %d (%s); stopping all %zu "
                   "ranks\n",
                   sig, strsignal(sig), ranks.size());
      StopAll(ranks, options.grace, sig);
      return {128 + sig, true};
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    for (auto& r : ranks) {
      if (r.pid != pid || !r.running) continue;
      r.running = false;
      --running;
      // Whatever the rank left in its group goes with it.
      kill(-r.pid, SIGKILL);
      if (ExitCodeOf(status) != 0) {
        std::fprintf(stderr,
                     "accel launch: rank %d (pid %d) %s; stopping the other "
                     "%zu rank(s)\n",
                     r.rank, static_cast<int>(pid),
                     DescribeStatus(status).c_str(), running);
        attempt.exit_code = ExitCodeOf(status);
        if (WaitForExit(ranks, options.report_grace)) {
          std::fprintf(stderr,
                       "accel launch: stopping the ranks still running\n");
        }
        StopAll(ranks, options.grace, SIGTERM);
        running = 0;
      }
    }
  }
  return attempt;
}

}  // namespace

int Launch(const LaunchOptions& options,
           const std::vector<std::string>& command) {
  Validate(options);
  if (command.empty()) throw UsageError("launch: no program to run");
  std::string secret;
  if (const char* given = std::getenv("ACCEL_RUN_SECRET")) secret = given;
  if (secret.empty()) {
    if (options.num_machines > 1) {
      throw UsageError(
          "with --num_machines > 1, set the same ACCEL_RUN_SECRET on every "
          "machine (for example `export ACCEL_RUN_SECRET=$(openssl rand -hex "
          "16)`), so that only this job's processes can join it");
    }
    secret = RandomSecret();
  }
  std::vector<std::string> argv = command;
  if (!options.backend.empty()) argv.push_back("--backend=" + options.backend);

  // Ranks must see our signals only through us.
  g_forwarded_signal = 0;
  struct sigaction action {};
  action.sa_handler = RecordSignal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  struct RestoreSignals {
    struct sigaction *old_int, *old_term;
    ~RestoreSignals() {
      sigaction(SIGINT, old_int, nullptr);
      sigaction(SIGTERM, old_term, nullptr);
    }
  } restore{&old_int, &old_term};

  for (int restart = 0;; ++restart) {
    // A fresh port for each try when we pick them: the last one's store may
    // still be closing.
    const int port = options.main_process_port == 0
                         ? net::FindFreePort(options.main_process_ip)
                         : options.main_process_port;
    const Attempt attempt = RunRanks(options, argv, port, secret, restart);
    if (attempt.exit_code == 0 || attempt.interrupted ||
        restart >= options.max_restarts) {
      if (attempt.exit_code != 0 && options.max_restarts > 0 &&
          !attempt.interrupted) {
        std::fprintf(stderr,
                     "accel launch: giving up after %d restart(s) "
                     "(--max_restarts=%d)\n",
                     restart, options.max_restarts);
      }
      return attempt.exit_code;
    }
    std::fprintf(stderr,
                 "accel launch: restarting all ranks (restart %d of %d, "
                 "TORCHELASTIC_RESTART_COUNT=%d)\n",
                 restart + 1, options.max_restarts, restart + 1);
  }
}

}  // namespace accel
