#include "accel/runtime/launch/program.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/process_setup.h"
#include "accel/runtime/base/startup_trace.h"
#include "accel/runtime/env/environment.h"
#include "accel/runtime/launch/help.h"
#include "accel/runtime/launch/launch_config.h"
#include "accel/runtime/launch/self_launch.h"

namespace accel {

void UseLaunchConfig(int argc, char** argv) {
  RegisterProgramFlags();
  try {
    const std::string path = LaunchConfigPath(argc, argv);
    for (const auto& [name, value] : ApplyLaunchConfig(path)) {
      NoteLaunchConfigFlag(name, path);
    }
    // The ranks (and their ranks) read the same file, whatever their $HOME.
    setenv("ACCEL_CONFIG_FILE", path.c_str(), /*overwrite=*/1);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::exit(2);
  }
}

LaunchOptions LaunchOptionsFromFlags() {
  LaunchOptions options;
  options.num_processes = flags::num_processes.value();
  options.num_machines = flags::num_machines.value();
  options.machine_rank = flags::machine_rank.value();
  options.main_process_ip = flags::main_process_ip.value();
  options.main_process_port = flags::main_process_port.value();
  options.threads_per_process = flags::num_cpu_threads_per_process.value();
  options.max_restarts = flags::max_restarts.value();
  options.fault_tolerance = flags::fault_tolerance.value();
  options.signal_grace = std::chrono::seconds(flags::signal_grace_s.value());
  // MPI's ranks must be started by mpirun (the ranks get --backend from
  // their command line either way).
  if (flags::backend.value() == "mpi") options.backend = "mpi";
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

void internal::InitProgram(int* argc, char*** argv, void* program_module) {
  PrepareProcess();
  TraceStartup("main");
  std::atexit([] { TraceStartup("exit"); });
  InstallTerminateHandler();
  // Keep the original arguments: the ranks get exactly what we got.
  std::vector<std::string> command(*argv, *argv + *argc);
  RegisterProgramFlags();
  UseLaunchConfig(*argc, *argv);
  PrintHelpAndExitIfAsked(*argc, *argv);
  RejectUnknownFlags(*argc, *argv);  // With the flag it resembles.
  gflags::ParseCommandLineFlags(argc, argv, /*remove_flags=*/true);
  try {
    ApplyDecidingSettings();
    CheckProgramFlagValues();  // Before any rank starts.
  } catch (const UsageError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    std::exit(2);
  }
  // Relative paths (--output_dir=trained_model) mean the user's directory.
  try {
    EnterUserDirectory();
  } catch (const UsageError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    std::exit(2);
  }
  SelfLaunchIfAsked(std::move(command), program_module);
}

void EnterUserDirectory() {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (dir != nullptr && chdir(dir) != 0) {
    throw UsageError(std::string("cannot enter ") + dir +
                     " ($BUILD_WORKING_DIRECTORY, where bazel run started)");
  }
}

int RunAndReportErrors(int (*body)(int, char**), int argc, char** argv) {
  InstallTerminateHandler();
  // The Accelerator keeps the job while the error unwinds (see
  // ReportingScope): printed first, then the others learn why this rank
  // left, as through std::terminate.
  const ReportingScope reporting;
  try {
    return body(argc, argv);
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    ReportException(error);
    RunFatalErrorHooks(DescribeException(error));
    return ExitCodeFor(error);
  }
}

}  // namespace accel
