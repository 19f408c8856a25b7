// Starts N ranks of a program on this machine, like `accelerate launch`.
//
//   bazel run //tools:launch -- --num_processes=2 -- /path/to/program --flag
//
// See accel/launch.h for the environment each rank gets and how failures
// and signals are handled.
#include <cstdio>
#include <string>
#include <vector>

#include "accel/runtime/errors.h"
#include "accel/runtime/program.h"

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "launch --num_processes=N [--main_process_port=P] -- PROGRAM ARGS...");
  // A backend given here is passed on to the program.
  const bool backend_given = [&] {
    for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
      if (std::string(argv[i]).rfind("--backend", 0) == 0) return true;
    }
    return false;
  }();
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  std::vector<std::string> command(argv + 1, argv + argc);
  if (command.empty()) {
    std::fprintf(stderr, "error: no program given\nusage: %s\n",
                 gflags::ProgramUsage());
    return 2;
  }
  accel::LaunchOptions options = accel::LaunchOptionsFromFlags();
  if (backend_given) options.backend = FLAGS_backend;
  try {
    return accel::Launch(options, command);
  } catch (const accel::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
