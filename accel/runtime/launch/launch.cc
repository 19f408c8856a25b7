#include "accel/runtime/launch/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/net.h"
#include "accel/runtime/base/preemption.h"
#include "accel/runtime/base/process_setup.h"
#include "accel/runtime/base/random_hex.h"
#include "accel/runtime/env/env_value.h"
#include "accel/runtime/launch/launch_rank_set.h"
#include "accel/runtime/launch/mpirun.h"
#include "accel/runtime/launch/rank_output.h"
#include "accel/runtime/launch/rank_processes.h"
#include "accel/runtime/launch/zygote.h"

namespace accel {

namespace launch_internal {

std::atomic<int> g_forwarded_signal{0};

}  // namespace launch_internal

namespace {

using launch_internal::Attempt;
using launch_internal::g_forwarded_signal;
using launch_internal::kMpirun;
using launch_internal::RankSet;
using launch_internal::Reporter;

void RecordSignal(int signal) { g_forwarded_signal = signal; }

// The signals the launcher passes on to the ranks, and as what: SIGTERM for
// those whose sender means "stop" (SIGHUP: the console went away; SIGQUIT),
// SIGINT as it is (Ctrl-C), SIGUSR1/2 as they are (SLURM's --signal warns
// with them; programs may give them a meaning of their own).
constexpr int kStopSignals[] = {SIGINT,  SIGTERM, SIGHUP,
                                SIGQUIT, SIGUSR1, SIGUSR2};

// FNV-1a: the same on every machine, unlike std::hash.
std::string StableHash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx",
                static_cast<unsigned long long>(hash));
  return out;
}

// The job id the ranks present to the store. One launcher picks a random
// one; the launchers of a multi-machine job cannot agree on a random value
// without talking, so they derive it from what they share (a second job
// with all of it the same is still refused by the store's one-connection-
// per-rank rule).
std::string JobId(const LaunchOptions& options, const std::string& secret) {
  if (const char* given = std::getenv("ACCEL_JOB_ID")) return given;
  if (options.num_machines == 1) return "launch-" + RandomHex(8);
  return "launch-" + StableHash(secret + "\n" + options.main_process_ip + "\n" +
                                std::to_string(options.main_process_port) +
                                "\n" + std::to_string(options.num_processes));
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
  // Beyond this a typo (2147483647) would start processes until the
  // machine stops; a machine with more cores is not in sight.
  constexpr int kMaxLocalProcesses = 4096;
  if (o.num_processes / o.num_machines > kMaxLocalProcesses) {
    throw UsageError("--num_processes=" + std::to_string(o.num_processes) +
                     " over " + std::to_string(o.num_machines) +
                     " machine(s) is " +
                     std::to_string(o.num_processes / o.num_machines) +
                     " processes on each; accel starts at most " +
                     std::to_string(kMaxLocalProcesses) + " per machine");
  }
  if (o.machine_rank < 0 || o.machine_rank >= o.num_machines) {
    throw UsageError("--machine_rank must be in [0, " +
                     std::to_string(o.num_machines) + "), found " +
                     std::to_string(o.machine_rank));
  }
  if (o.main_process_ip.empty()) {
    throw UsageError(
        "--main_process_ip is empty; give the address of rank 0's machine");
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
  if (o.backend == "mpi" && o.num_machines > 1) {
    throw UsageError(
        "--backend=mpi with --num_machines > 1: start multi-machine MPI jobs "
        "with mpirun (a hostfile) or srun, which place the ranks themselves");
  }
  if (o.max_restarts < 0) {
    throw UsageError("--max_restarts must not be negative, found " +
                     std::to_string(o.max_restarts));
  }
  if (o.signal_grace.count() < 0) {
    throw UsageError("--signal_grace_s must not be negative, found " +
                     std::to_string(o.signal_grace.count() / 1000));
  }
  if (o.threads_per_process < 1) {
    throw UsageError("threads per process must be at least 1, found " +
                     std::to_string(o.threads_per_process));
  }
}

int CoresAvailable() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

// The socket rank 0 will serve its store on, listening from now on.
struct HeldPort {
  int fd = -1;
  int port = 0;
  ~HeldPort() {
    if (fd >= 0) close(fd);
  }
};

// The zygote that forks the ranks (zygote.h); ended however Launch returns.
struct Zygote {
  int fd = -1;  // -1: none; ranks are exec'd.
  pid_t pid = 0;
  void End() {
    EndZygote(fd, pid);
    fd = -1;
    pid = 0;
  }
  ~Zygote() { End(); }
};

// A rank from the zygote when there is one, else exec'd; a zygote that
// fails once is ended and not asked again. 0: a stop signal came while the
// zygote was forking it, and there is no rank.
pid_t StartOneRank(const std::vector<std::string>& argv,
                   const ChildSetup& setup, int rank, int world,
                   Zygote* zygote) {
  if (zygote->fd >= 0) {
    try {
      return StartRankFromZygote(zygote->fd, setup, rank, world,
                                 [] { return g_forwarded_signal != 0; });
    } catch (const ZygoteInterrupted&) {
      zygote->End();
      return 0;
    } catch (const Error& e) {
      ACCEL_LOG(WARNING) << e.what() << "; exec'ing the ranks instead";
      zygote->End();
    }
  }
  return StartRank(argv, setup, rank, world);
}

// The exit code of a program refusing its flags (gflags', accel's
// InitProgram): every process of the rank would refuse them again.
constexpr int kUsageExitCode = 2;

// Whether a fault-tolerant job goes on without the rank that ended with
// `status` (replacing it while --max_restarts allows): not rank 0 (the
// store and the quorum live there), not a rank that ended because another
// failed (the cause decides), not a usage error (exit code 2: every rank
// would hit it again), not a preempted one, and not after a stop signal.
bool LostReplica(const LaunchOptions& options, const RankProcess& failed,
                 int status) {
  if (!options.fault_tolerance || failed.rank <= 0) return false;
  if (WIFEXITED(status) && (WEXITSTATUS(status) == kPeerFailedExitCode ||
                            WEXITSTATUS(status) == kPreemptedExitCode ||
                            WEXITSTATUS(status) == kUsageExitCode)) {
    return false;
  }
  return g_forwarded_signal == 0;
}

// Starts this machine's ranks once and watches them until all have exited,
// one has failed, or the launcher got a signal.
Attempt RunRanks(const LaunchOptions& options,
                 const std::vector<std::string>& argv, HeldPort& held,
                 const std::string& secret, const std::string& job_id,
                 int restart_count, Zygote* zygote, Reporter& report) {
  const int local_world_size = options.num_processes / options.num_machines;
  const auto attempt_started = std::chrono::steady_clock::now();
  std::unique_ptr<RankOutput> output;
  if (!options.log_dir.empty()) {
    output = std::make_unique<RankOutput>(options.log_dir, restart_count);
    report.set_output(output.get());
  }
  struct ClearOutput {
    Reporter& report;
    ~ClearOutput() { report.set_output(nullptr); }
  } clear_output{report};
  RankSet ranks(options, report);
  const char* omp = std::getenv("OMP_NUM_THREADS");
  // What every rank gets; each rank's own numbers come on top.
  const std::map<std::string, std::string> job_env = {
      {"MASTER_ADDR", options.main_process_ip},
      {"MASTER_PORT", std::to_string(held.port)},
      {"ACCEL_RUN_SECRET", secret},
      {"ACCEL_JOB_ID", job_id},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"OMP_NUM_THREADS",
       omp ? omp : std::to_string(options.threads_per_process)},
      {"ACCEL_FAULT_TOLERANCE", options.fault_tolerance ? "1" : "0"},
  };
  std::map<int, ChildSetup> setups;  // Each rank's, for its replacements.
  try {
    if (options.backend == "mpi") {
      // mpirun starts and numbers the ranks (the backend learns them from
      // MPI): one child to watch, which passes the job's variables on. The
      // port cannot travel through mpirun: rank 0 binds it again.
      ChildSetup setup;
      setup.env = job_env;
      // A port this launcher picked would be free again by the time rank 0
      // binds it: without one the ranks agree on a port through MPI, rank 0
      // choosing it as it binds.
      if (options.main_process_port == 0) setup.env.erase("MASTER_PORT");
      std::vector<std::string> names;
      for (const auto& entry : setup.env) names.push_back(entry.first);
      if (held.fd >= 0) {
        close(held.fd);
        held.fd = -1;
      }
      ranks.Add(kMpirun, StartRank(MpirunCommand(local_world_size, argv, names),
                                   setup, kMpirun, options.num_processes));
    }
    for (int local = 0; local < local_world_size && options.backend != "mpi";
         ++local) {
      if (auto stopped = ranks.CheckSignal()) return *stopped;
      const int rank = options.machine_rank * local_world_size + local;
      ChildSetup setup;
      setup.env = job_env;
      setup.env.insert({
          {"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(options.num_processes)},
          {"LOCAL_RANK", std::to_string(local)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
          {"GROUP_RANK", std::to_string(options.machine_rank)},
          // This machine's clock: the rendezvous timeout counts from here.
          {"ACCEL_LAUNCH_STEADY_NS",
           std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              attempt_started.time_since_epoch())
                              .count())},
      });
      if (rank == 0 && held.fd >= 0) {
        setup.env["ACCEL_STORE_LISTEN_FD"] = std::to_string(held.fd);
        setup.keep_fd = held.fd;
        setup.keep_fd_variable = "ACCEL_STORE_LISTEN_FD";
      }
      if (options.fault_tolerance) setups[rank] = setup;
      if (output) setup.pipes = output->Add(rank);
      const pid_t pid =
          StartOneRank(argv, setup, rank, options.num_processes, zygote);
      if (pid == 0) return ranks.CheckSignal().value_or(Attempt{1, true});
      ranks.Add(rank, pid);
      if (output) output->StartedRank(rank);
      if (rank == 0 && held.fd >= 0) {
        close(held.fd);  // Rank 0 has it now.
        held.fd = -1;
      }
      // A rank that fails while others start need not wait for all of them.
      const RankProcess* failed = nullptr;
      int status = 0;
      if (ranks.ReapExited(&failed, &status)) {
        const std::string when = " while ranks were starting (" +
                                 std::to_string(ranks.started()) + " of " +
                                 std::to_string(local_world_size) + " started)";
        const Attempt attempt = ranks.FailWith(*failed, status, when.c_str());
        if (output) output->Finish();
        return attempt;
      }
    }
  } catch (const Error& e) {
    if (ranks.started() > 0) {
      report(std::string(e.what()) + "; stopping the " +
             std::to_string(ranks.started()) + " rank(s) already started");
    }
    ranks.StopAllNow();
    throw;
  }

  Attempt attempt;
  int replacements = 0;
  std::optional<std::chrono::steady_clock::time_point> finished_at;
  while (ranks.running() > 0) {
    if (auto stopped = ranks.CheckSignal()) {
      attempt = *stopped;
      break;
    }
    const RankProcess* failed = nullptr;
    int status = 0;
    if (ranks.ReapExited(&failed, &status)) {
      if (LostReplica(options, *failed, status)) {
        const std::string lost =
            RankSet::Name(*failed) + " (pid " + std::to_string(failed->pid) +
            ") " + DescribeStatus(status) + "; the others train on";
        if (replacements >= options.max_restarts) {
          report(lost + " without it (no replacements left: --max_restarts=" +
                 std::to_string(options.max_restarts) + ")");
          continue;
        }
        ++replacements;
        const int rank = failed->rank;
        ChildSetup setup = setups.at(rank);
        setup.env["ACCEL_FT_REPLACEMENT"] = std::to_string(replacements);
        report(lost + "; starting a replacement (" +
               std::to_string(replacements) + " of " +
               std::to_string(options.max_restarts) + ")");
        const pid_t pid =
            StartOneRank(argv, setup, rank, options.num_processes, zygote);
        if (pid == 0) {
          attempt = ranks.CheckSignal().value_or(Attempt{1, true});
          break;
        }
        ranks.Add(rank, pid);
        continue;
      }
      attempt = ranks.FailWith(*failed, status, "");
      break;
    }
    // Once rank 0 has finished, the others get the grace period to finish
    // too: a member the quorum dropped and that never came back (a stopped
    // process) would hold the launcher forever.
    if (options.fault_tolerance && ranks.FinishedCleanly(0)) {
      const auto now = std::chrono::steady_clock::now();
      if (!finished_at) finished_at = now;
      if (now - *finished_at > options.grace) {
        report("rank 0 finished the training " +
               std::to_string(options.grace.count() / 1000) +
               " s ago; stopping the ranks still running: " +
               ranks.StillRunning());
        ranks.StopAllNow();
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (output) output->Finish();
  return attempt;
}

// Binds rank 0's port now and keeps it until rank 0 serves on it, when rank
// 0 runs on this machine; else only says which port the ranks dial.
void HoldPort(const LaunchOptions& options, HeldPort* held) {
  if (options.machine_rank != 0) {
    held->port = options.main_process_port;
    return;
  }
  held->fd = net::Listen(options.main_process_ip, options.main_process_port,
                         &held->port);
}

}  // namespace

int Launch(const LaunchOptions& options,
           const std::vector<std::string>& command) {
  PrepareProcess();
  Validate(options);
  if (command.empty()) throw UsageError("launch: no program to run");
  Reporter report;
  std::string secret;
  if (const char* given = std::getenv("ACCEL_RUN_SECRET")) secret = given;
  CheckEnvLength("ACCEL_RUN_SECRET", secret, kMaxRunSecretBytes);
  if (const char* job = std::getenv("ACCEL_JOB_ID")) {
    CheckEnvLength("ACCEL_JOB_ID", job, kMaxJobIdBytes);
  }
  CheckOmpNumThreads(std::getenv("OMP_NUM_THREADS"));
  if (secret.empty()) {
    if (options.num_machines > 1) {
      throw UsageError(
          "with --num_machines > 1, set the same ACCEL_RUN_SECRET on every "
          "machine (for example `export ACCEL_RUN_SECRET=$(openssl rand -hex "
          "16)`), so that only this job's processes can join it");
    }
    secret = RandomHex(16);
  }
  const std::string job_id = JobId(options, secret);
  const int local_world_size = options.num_processes / options.num_machines;
  const int cores = CoresAvailable();
  if (local_world_size > cores) {
    report("warning: " + std::to_string(local_world_size) +
           " processes on this machine's " + std::to_string(cores) +
           " cores: they will share them (OMP_NUM_THREADS=" +
           (std::getenv("OMP_NUM_THREADS")
                ? std::string(std::getenv("OMP_NUM_THREADS"))
                : std::to_string(options.threads_per_process)) +
           " each)");
  }
  RaiseOpenFileLimit();
  // The zygote's ranks are orphaned on purpose, to become ours.
  Zygote zygote{options.zygote_fd, options.zygote_pid};
  if (zygote.fd >= 0 && (options.backend == "mpi" || !AdoptZygoteRanks())) {
    zygote.End();
  }
  // Not for exec'd ranks (or mpirun) to inherit.
  if (zygote.fd >= 0) fcntl(zygote.fd, F_SETFD, FD_CLOEXEC);
  std::vector<std::string> argv = command;
  if (!options.backend.empty()) argv.push_back("--backend=" + options.backend);

  // Ranks must see our signals only through us. A signal that is ignored
  // when we start (nohup's SIGHUP) stays ignored.
  g_forwarded_signal = 0;
  struct sigaction action {};
  action.sa_handler = RecordSignal;
  sigemptyset(&action.sa_mask);
  std::vector<std::pair<int, struct sigaction>> previous;
  for (int signal_number : kStopSignals) {
    struct sigaction old {};
    sigaction(signal_number, nullptr, &old);
    if (signal_number == SIGHUP && old.sa_handler == SIG_IGN) continue;
    sigaction(signal_number, &action, &old);
    previous.emplace_back(signal_number, old);
  }
  struct RestoreSignals {
    std::vector<std::pair<int, struct sigaction>>& previous;
    ~RestoreSignals() {
      for (auto& [signal_number, old] : previous) {
        sigaction(signal_number, &old, nullptr);
      }
    }
  } restore{previous};

  for (int restart = 0;; ++restart) {
    // A fresh socket for each try (and a fresh port when we pick it): the
    // last try's store may still be closing.
    HeldPort held;
    HoldPort(options, &held);
    const Attempt attempt =
        RunRanks(options, argv, held, secret, job_id, restart, &zygote, report);
    if (attempt.exit_code == 0 || attempt.interrupted ||
        restart >= options.max_restarts) {
      if (attempt.exit_code != 0 && options.max_restarts > 0 &&
          !attempt.interrupted) {
        report("giving up after " + std::to_string(restart) +
               " restart(s) (--max_restarts=" +
               std::to_string(options.max_restarts) + ")");
      }
      return attempt.exit_code;
    }
    report("restarting all ranks (restart " + std::to_string(restart + 1) +
           " of " + std::to_string(options.max_restarts) +
           ", TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart + 1) + ")");
  }
}

}  // namespace accel
