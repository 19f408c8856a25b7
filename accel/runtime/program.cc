#include "accel/runtime/program.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "accel/runtime/environment.h"
#include "accel/runtime/error_report.h"
#include "accel/runtime/errors.h"
#include "accel/runtime/help.h"
#include "accel/runtime/launch_config.h"
#include "accel/runtime/process_setup.h"
#include "accel/runtime/self_launch.h"
#include "accel/runtime/startup_trace.h"

DEFINE_int32(num_processes, 1,
             "Total number of processes (ranks) to run, over all machines.");
DEFINE_int32(num_machines, 1, "Number of machines taking part.");
DEFINE_int32(machine_rank, 0, "This machine's index in [0, num_machines).");
DEFINE_string(main_process_ip, "127.0.0.1",
              "Address of the machine that runs rank 0.");
DEFINE_int32(main_process_port, 29500,
             "Port of rank 0's rendezvous store; 0 picks a free port.");
DEFINE_string(backend, "auto",
              "Communication backend: gloo, nccl, mpi, or auto (nccl when a "
              "GPU is visible, mpi when started by mpirun or srun with MPI, "
              "else gloo).");
DEFINE_int32(timeout_s, 300,
             "Default timeout of each collective, in seconds. Mismatched "
             "collectives and departed ranks are reported long before it.");
DEFINE_int32(rendezvous_timeout_s, 60,
             "How long ranks wait for each other (and for rank 0's store) at "
             "start-up, in seconds.");
DEFINE_bool(collective_checks, true,
            "Compare each collective across ranks and report mismatched "
            "calls within about a second (ranks that left are reported "
            "either way).");
DEFINE_int32(max_restarts, 0,
             "Restart the whole job up to this many times after a rank "
             "fails (TORCHELASTIC_RESTART_COUNT tells the ranks which try "
             "they are).");
DEFINE_int32(signal_grace_s, 30,
             "After a stop signal to the launcher (SIGTERM, SIGINT, SIGHUP, "
             "SIGQUIT, SIGUSR1, SIGUSR2), how long the ranks get to save and "
             "leave before they are killed, in seconds (see "
             "Accelerator::check_preemption).");
DEFINE_int32(num_cpu_threads_per_process, 1,
             "Intra-op threads per rank (OMP_NUM_THREADS, unless set).");
DEFINE_string(mixed_precision, "no",
              "Mixed precision: no, bf16 (autocast to bfloat16, CPU or GPU) "
              "or fp16 (float16 with loss scaling).");
DEFINE_int32(gradient_accumulation_steps, 1,
             "Micro-batches whose gradients are accumulated before each "
             "optimizer step (inside accelerator.accumulate(model)).");
DEFINE_string(report_to, "",
              "Experiment trackers for init_trackers/log: a comma-separated "
              "list of jsonl, tensorboard (or any tracker the program "
              "registers), all, or none.");
DEFINE_string(logging_dir, "",
              "Where trackers write: <logging_dir>/<project_name>/ (default: "
              "the program's project directory, if it has one).");

DEFINE_string(config_file, "",
              "Launch configuration to read before the command line (written "
              "by accel config); default: $ACCEL_CONFIG_FILE, else "
              "~/.config/accel/default_config.flags when it exists. Empty "
              "with =: none.");

DEFINE_bool(reuse_host_memory, true,
            "Keep memory that tensors free in the process for reuse, rather "
            "than returning each large block to the system (which costs a "
            "page fault per 4 KiB page the next time; see "
            "accel/runtime/host_memory.h).");

DEFINE_int32(network_timeout_s, 20,
             "How long a machine may stop answering on the network before "
             "its ranks are reported unreachable, in seconds.");

namespace accel {

void UseLaunchConfig(int argc, char** argv) {
  try {
    const std::string path = LaunchConfigPath(argc, argv);
    ApplyLaunchConfig(path);
    // The ranks (and their ranks) read the same file, whatever their $HOME.
    setenv("ACCEL_CONFIG_FILE", path.c_str(), /*overwrite=*/1);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::exit(2);
  }
}

LaunchOptions LaunchOptionsFromFlags() {
  LaunchOptions options;
  options.num_processes = FLAGS_num_processes;
  options.num_machines = FLAGS_num_machines;
  options.machine_rank = FLAGS_machine_rank;
  options.main_process_ip = FLAGS_main_process_ip;
  options.main_process_port = FLAGS_main_process_port;
  options.threads_per_process = FLAGS_num_cpu_threads_per_process;
  options.max_restarts = FLAGS_max_restarts;
  options.signal_grace = std::chrono::seconds(FLAGS_signal_grace_s);
  // MPI's ranks must be started by mpirun (the ranks get --backend from
  // their command line either way).
  if (FLAGS_backend == "mpi") options.backend = FLAGS_backend;
  // --log_dir is glog's flag in programs that link LibTorch (which links
  // glog), and the launcher's own in tools/launch: reuse whichever exists,
  // when the user set it (glog's default is $TEST_TMPDIR under bazel test).
  gflags::CommandLineFlagInfo log_dir;
  if (gflags::GetCommandLineFlagInfo("log_dir", &log_dir) &&
      !log_dir.is_default) {
    options.log_dir = log_dir.current_value;
  }
  return options;
}

void InitProgram(int* argc, char*** argv) {
  PrepareProcess();
  TraceStartup("main");
  std::atexit([] { TraceStartup("exit"); });
  InstallTerminateHandler();
  // Keep the original arguments: the ranks get exactly what we got.
  std::vector<std::string> command(*argv, *argv + *argc);
  UseLaunchConfig(*argc, *argv);
  PrintHelpAndExitIfAsked(*argc, *argv);
  gflags::ParseCommandLineFlags(argc, argv, /*remove_flags=*/true);
  // Under `bazel run`, relative paths (--output_dir=trained_model) mean the
  // user's directory, not Bazel's runfiles tree.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY")) {
    if (chdir(dir) != 0) {
      std::fprintf(stderr, "error: cannot enter %s\n", dir);
      std::exit(2);
    }
  }
  SelfLaunchIfAsked(std::move(command));
}

int RunAndReportErrors(int (*body)(int, char**), int argc, char** argv) {
  InstallTerminateHandler();
  try {
    return body(argc, argv);
  } catch (...) {
    ReportException(std::current_exception());
    return 1;
  }
}

}  // namespace accel
