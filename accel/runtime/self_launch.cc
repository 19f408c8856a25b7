#include "accel/runtime/self_launch.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "accel/runtime/environment.h"
#include "accel/runtime/errors.h"
#include "accel/runtime/launch.h"
#include "accel/runtime/program.h"

namespace accel {
namespace {

[[noreturn]] void Fail(const std::string& message, int code) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(code);
}

}  // namespace

std::string ExecutablePath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "/proc/self/exe";
  const std::string resolved(path, static_cast<size_t>(n));
  // Rebuilt while running: only the open file is still this program.
  const std::string deleted = " (deleted)";
  if (resolved.size() > deleted.size() &&
      resolved.compare(resolved.size() - deleted.size(), deleted.size(),
                       deleted) == 0) {
    return "/proc/self/exe";
  }
  return resolved;
}

void SelfLaunchIfAsked(std::vector<std::string> command) {
  if (FLAGS_num_processes < 1) {
    Fail("--num_processes must be at least 1, found " +
             std::to_string(FLAGS_num_processes),
         2);
  }
  DistributedEnvironment env;
  try {
    env = DistributedEnvironment::FromProcess();
  } catch (const Error& e) {
    Fail(e.what(), 1);
  }
  for (const auto& warning : env.warnings) {
    std::fprintf(stderr, "warning: %s\n", warning.c_str());
  }
  const bool explicit_count =
      !gflags::GetCommandLineFlagInfoOrDie("num_processes").is_default;
  if (env.launched && explicit_count && FLAGS_num_processes != env.world_size &&
      env.world_size > 1) {
    Fail("--num_processes=" + std::to_string(FLAGS_num_processes) + " but " +
             env.engine + " started " + std::to_string(env.world_size) +
             " processes; leave out --num_processes or make them agree",
         1);
  }
  // torchrun-style variables mean a launcher (maybe ours) started this
  // process: never launch again from inside one.
  if (env.launched && (env.world_size > 1 || env.engine == "torchrun" ||
                       env.engine == "RANK/WORLD_SIZE")) {
    return;
  }
  const bool wanted = FLAGS_num_processes > 1 || FLAGS_num_machines > 1 ||
                      FLAGS_max_restarts > 0;
  if (!wanted) return;
  command[0] = ExecutablePath();
  try {
    std::exit(Launch(LaunchOptionsFromFlags(), command));
  } catch (const Error& e) {
    Fail(e.what(), 2);
  }
}

}  // namespace accel
