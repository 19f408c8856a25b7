// Starts the ranks of a job on this machine and watches them, like
// `accelerate launch` / torchrun.
//
//   accel::LaunchOptions options;
//   options.num_processes = 2;
//   int exit_code = accel::Launch(options, {"/path/to/program", "--flag"});
//
// Each rank gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT), a per-run ACCEL_RUN_SECRET, a per-launch
// ACCEL_JOB_ID (so that jobs sharing an exported secret are told apart),
// and OMP_NUM_THREADS. Each rank runs in its own process group: when a rank
// fails (even while others are still starting), every rank's whole group
// gets SIGTERM and, after a grace period, SIGKILL, so that nothing is left
// behind.
//
// Stop signals to the launcher (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
// SIGUSR2: Ctrl-C, Kubernetes, an ssh hangup, SLURM's --signal) are passed
// on to the ranks (SIGHUP and SIGQUIT as SIGTERM) and said on stderr; the
// ranks get signal_grace to save and leave (see preemption.h) before
// SIGKILL, and a second signal cuts it short. When every rank exits with
// kPreemptedExitCode the launcher does too, so a requeue script can tell a
// preempted job from a failed one. The launcher survives a console that goes
// away (SIGPIPE ignored) and closed standard streams (process_setup.h).
//
// On the machine of rank 0 the launcher listens on MASTER_PORT itself from
// the moment it chooses it (--main_process_port=0 picks a free one) and
// hands the socket to rank 0 (ACCEL_STORE_LISTEN_FD), so no other process
// can take the port in between. It raises the soft limit on open files to
// the hard one (many ranks mean many connections).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace accel {

struct LaunchOptions {
  int num_processes = 1;  // In total, over all machines (as in Accelerate).
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip = "127.0.0.1";
  int main_process_port = 29500;  // 0 picks a free port (one machine only).
  // When set, passed on as --backend=NAME. "mpi" starts the ranks through
  // mpirun (accel/runtime/launch/mpirun.h) instead of forking them itself.
  std::string backend;
  int threads_per_process = 1;  // OMP_NUM_THREADS unless already set.
  // After a failure, start all ranks again up to this many times (with
  // TORCHELASTIC_RESTART_COUNT set to the try); a program that resumes from
  // its last checkpoint then carries on (see train_demo --resume).
  int max_restarts = 0;
  // Fault tolerance without restarts (accel/fault_tolerance.h): a rank
  // other than 0 that fails is replaced alone, up to max_restarts times,
  // while the others train on (ACCEL_FAULT_TOLERANCE=1 tells the ranks;
  // ACCEL_FT_REPLACEMENT=n which replacement a process is). Rank 0 hosts
  // the store and the quorum: its loss ends the attempt as usual.
  bool fault_tolerance = false;
  // After a rank fails, how long the others get to notice and report it
  // themselves (naming the failed rank) before they are stopped.
  std::chrono::milliseconds report_grace = std::chrono::seconds(4);
  // How long a rank may take to exit after SIGTERM before SIGKILL.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
  // After a stop signal to the launcher, how long the ranks get to save and
  // leave before SIGKILL.
  std::chrono::milliseconds signal_grace = std::chrono::seconds(30);
  // When set, each rank's stdout and stderr also go to
  // <log_dir>/attempt_<n>/rank_<r>/{stdout,stderr}.log (see rank_output.h).
  std::string log_dir;
  // A zygote's socket (zygote.h): the ranks are forked from the program
  // already loaded rather than exec'd, unless that fails. -1: exec them.
  int zygote_fd = -1;
  pid_t zygote_pid = 0;  // The zygote itself, a child of the launcher.
};

// Runs `command` as this machine's ranks and returns the launcher's exit
// code: 0 when every rank exited 0; otherwise the first failure's exit code
// (128 + signal for a signal). Throws UsageError for invalid options.
int Launch(const LaunchOptions& options,
           const std::vector<std::string>& command);

}  // namespace accel
