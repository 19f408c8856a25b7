// Starts N ranks of a program on this machine, like `accelerate launch`.
//
//   bazel run //tools:launch -- --num_processes=2 -- /path/to/program --flag
//
// See accel/runtime/launch/launch.h for the environment each rank gets and how
// failures and signals are handled. The launcher accepts only the flags it
// uses, and those it passes on to the program when given (--backend,
// --timeout_s, --rendezvous_timeout_s, --collective_checks,
// --network_timeout_s); anything else is an error, not silently dropped.
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/launch/help.h"
#include "accel/runtime/launch/program.h"

// --log_dir is glog's flag (accel logs through glog), which the launcher
// reuses for the ranks' logs, as programs do.

DEFINE_int32(zygote_fd, -1,
             "Internal: the socket of the zygote that forks a self-launching "
             "program's ranks (accel/runtime/launch/zygote.h).");
DEFINE_int32(zygote_pid, 0, "Internal: that zygote's pid.");

namespace {

// Flags the launcher itself uses. Both names of the thread flag are listed
// so that either spelling works while it is being renamed.
const std::set<std::string> kUsed = {"num_processes",
                                     "num_machines",
                                     "machine_rank",
                                     "main_process_ip",
                                     "main_process_port",
                                     "num_threads",
                                     "num_cpu_threads_per_process",
                                     "max_restarts",
                                     "fault_tolerance",
                                     "signal_grace_s",
                                     "log_dir",
                                     "config_file",
                                     "zygote_fd",
                                     "zygote_pid"};

// Flags of the ranks that the launcher passes on, as `accelerate launch`
// does with its training flags.
const std::set<std::string> kForwarded = {"backend",
                                          "timeout_s",
                                          "rendezvous_timeout_s",
                                          "collective_checks",
                                          "network_timeout_s",
                                          "v",
                                          "vmodule"};

bool IsGflagsOwn(const gflags::CommandLineFlagInfo& flag) {
  return flag.filename.find("gflags") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  // What ps and top show, also when a program runs this launcher from
  // memory in its own place (self_launch.h) and the name would be "memfd:".
  prctl(PR_SET_NAME, "accel-launch");
  const std::string name = accel::ProgramName(argv[0]);
  gflags::SetUsageMessage(
      name + " --num_processes=N [--main_process_port=P] -- PROGRAM ARGS...");
  std::set<std::string> shown = kUsed;
  shown.erase("zygote_fd");
  shown.erase("zygote_pid");
  shown.insert(kForwarded.begin(), kForwarded.end());
  accel::UseLaunchConfig(argc, argv);
  accel::PrintHelpAndExitIfAsked(argc, argv, &shown);
  // A program's flag before `--` is a usage slip, not a gflags internal.
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') break;  // The program's name.
    std::string flag = arg.substr(arg.find_first_not_of('-'));
    flag = flag.substr(0, flag.find('='));
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(flag.c_str(), &info) &&
        !(flag.rfind("no", 0) == 0 &&
          gflags::GetCommandLineFlagInfo(flag.substr(2).c_str(), &info))) {
      const std::string closest = accel::ClosestFlag(flag, shown);
      std::fprintf(
          stderr,
          "error: %s has no flag --%s%s; a flag of the program goes "
          "after `--` (%s [FLAGS] -- PROGRAM [ITS FLAGS])\n",
          name.c_str(), flag.c_str(),
          closest.empty() ? "" : (" (did you mean --" + closest + "?)").c_str(),
          name.c_str());
      return 2;
    }
  }
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  std::vector<std::string> command(argv + 1, argv + argc);
  std::vector<std::string> passed_on;
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& flag : flags) {
    if (flag.is_default || IsGflagsOwn(flag) || kUsed.count(flag.name)) {
      continue;
    }
    if (kForwarded.count(flag.name) == 0) {
      std::fprintf(stderr,
                   "error: %s does not use --%s; give it to the program "
                   "after `--`\n",
                   name.c_str(), flag.name.c_str());
      return 2;
    }
    passed_on.push_back("--" + flag.name + "=" + flag.current_value);
  }
  if (command.empty()) {
    std::fprintf(stderr, "error: no program given\nusage: %s\n",
                 gflags::ProgramUsage());
    return 2;
  }
  command.insert(command.end(), passed_on.begin(), passed_on.end());
  // Under `bazel run`, a relative PROGRAM path is the user's, as the
  // program's own relative paths are.
  const char* user_dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (user_dir != nullptr && command[0].find('/') != std::string::npos &&
      command[0][0] != '/') {
    command[0] = std::string(user_dir) + "/" + command[0];
  }
  try {
    accel::LaunchOptions options = accel::LaunchOptionsFromFlags();
    options.zygote_fd = FLAGS_zygote_fd;
    options.zygote_pid = FLAGS_zygote_pid;
    return accel::Launch(options, command);
  } catch (const accel::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
