#include "accel/runtime/launch/self_launch.h"

#include <fcntl.h>
#include <gflags/gflags.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/startup_trace.h"
#include "accel/runtime/env/env_value.h"
#include "accel/runtime/env/environment.h"
#include "accel/runtime/launch/launch.h"
#include "accel/runtime/launch/program.h"
#include "accel/runtime/launch/zygote.h"

namespace accel {
namespace {

[[noreturn]] void Fail(const std::string& message, int code) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(code);
}

const char* g_launcher_image = nullptr;
size_t g_launcher_size = 0;

// The launcher's own flags (tools/launch.cc), as this process has them.
std::vector<std::string> LauncherFlags() {
  std::vector<std::string> flags;
  for (const char* name :
       {"num_processes", "num_machines", "machine_rank", "main_process_ip",
        "main_process_port", "num_cpu_threads_per_process", "max_restarts",
        "fault_tolerance", "signal_grace_s", "log_dir", "config_file",
        // Not the launcher's own, but it decides how to start the ranks
        // (--backend=mpi: through mpirun).
        "backend"}) {
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(name, &info) && !info.is_default) {
      flags.push_back("--" + info.name + "=" + info.current_value);
    }
  }
  return flags;
}

// Replaces this process with the registered launcher, which starts
// `command` as the ranks. Returns only when that could not be done (then
// this process launches them itself); ACCEL_IN_PROCESS_LAUNCH=1 asks for
// that too.
void ExecLauncher(const std::vector<std::string>& command,
                  const ZygoteStart& zygote) {
  const bool in_process = EnvSwitch("ACCEL_IN_PROCESS_LAUNCH").value_or(false);
  if (g_launcher_image == nullptr || in_process) return;
  const int fd = memfd_create("accel-launch", MFD_CLOEXEC);
  if (fd < 0) return;
  size_t written = 0;
  while (written < g_launcher_size) {
    const ssize_t n =
        write(fd, g_launcher_image + written, g_launcher_size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return;
    }
    written += static_cast<size_t>(n);
  }
  std::vector<std::string> args = {"accel-launch"};
  for (auto& flag : LauncherFlags()) args.push_back(std::move(flag));
  if (zygote.fd >= 0) {
    args.push_back("--zygote_fd=" + std::to_string(zygote.fd));
    args.push_back("--zygote_pid=" + std::to_string(zygote.pid));
  }
  args.push_back("--");
  args.insert(args.end(), command.begin(), command.end());
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  fexecve(fd, argv.data(), environ);
  close(fd);  // Still here: launch in this process instead.
}

}  // namespace

void SetLauncherImage(const char* data, size_t size) {
  g_launcher_image = data;
  g_launcher_size = size;
}

std::string ExecutablePath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "/proc/self/exe";
  const std::string resolved(path, static_cast<size_t>(n));
  // Rebuilt while running: only the open file is still this program. Not
  // "/proc/self/exe", which in the launcher run from memory is the
  // launcher: a descriptor of the file, which the launcher and the ranks it
  // execs inherit.
  const std::string deleted = " (deleted)";
  if (resolved.size() > deleted.size() &&
      resolved.compare(resolved.size() - deleted.size(), deleted.size(),
                       deleted) == 0) {
    const int fd = open("/proc/self/exe", O_RDONLY);
    return fd >= 0 ? "/proc/self/fd/" + std::to_string(fd) : "/proc/self/exe";
  }
  return resolved;
}

void SelfLaunchIfAsked(std::vector<std::string> command, void* program_module) {
  if (flags::num_processes.value() < 1) {
    Fail("--num_processes must be at least 1, found " +
             std::to_string(flags::num_processes.value()),
         2);
  }
  DistributedEnvironment env;
  try {
    env = DistributedEnvironment::FromProcess();
  } catch (const Error& e) {
    Fail(e.what(), 1);
  }
  for (const auto& warning : env.warnings) {
    ACCEL_LOG(WARNING) << warning;
  }
  const bool count_differs = env.launched && env.world_size > 1 &&
                             flags::num_processes.value() != env.world_size;
  // A launch configuration's count gives way to the engine's, as
  // Accelerate's default config does under torchrun; a command line's is a
  // mistake to report.
  if (count_differs && !flags::num_processes.from_command_line() &&
      flags::num_processes.given() && env.rank == 0) {
    ACCEL_LOG(WARNING) << "num_processes=" << flags::num_processes.value()
                       << " (" << flags::num_processes.source()
                       << ") is left aside: " << env.engine << " started "
                       << env.world_size << " processes";
  }
  if (count_differs && flags::num_processes.from_command_line()) {
    Fail("--num_processes=" + std::to_string(flags::num_processes.value()) +
             " but " + env.engine + " started " +
             std::to_string(env.world_size) +
             " processes; leave out --num_processes or make them agree",
         1);
  }
  // torchrun-style variables mean a launcher (maybe ours) started this
  // process: never launch again from inside one.
  if (env.launched && (env.world_size > 1 || env.engine == "torchrun" ||
                       env.engine == "RANK/WORLD_SIZE")) {
    return;
  }
  const bool wanted = flags::num_processes.value() > 1 ||
                      flags::num_machines.value() > 1 ||
                      flags::max_restarts.value() > 0;
  if (!wanted) return;
  // Ranks forked from here need not load the program again (zygote.h);
  // mpirun starts its own.
  ZygoteStart zygote;
  try {
    if (flags::backend.value() != "mpi") zygote = StartZygote(program_module);
  } catch (const Error& e) {
    Fail(e.what(), 2);
  }
  if (zygote.role == ZygoteStart::Role::kRank) {
    TraceStartup("main");
    return;
  }
  command[0] = ExecutablePath();
  try {
    ExecLauncher(command, zygote);
  } catch (const Error& e) {
    Fail(e.what(), 2);
  }
  try {
    LaunchOptions options = LaunchOptionsFromFlags();
    options.zygote_fd = zygote.fd;
    options.zygote_pid = zygote.pid;
    std::exit(Launch(options, command));
  } catch (const Error& e) {
    Fail(e.what(), 2);
  }
}

}  // namespace accel
