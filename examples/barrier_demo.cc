// The seed's wait_for_everyone snippet: process i sleeps i seconds, then all
// wait for each other, and leave the barrier together.
//
//   bazel run //examples:barrier_demo -- --num_processes=2
#include <chrono>
#include <thread>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"

namespace {

int Main(int argc, char** argv) {
  accel::Accelerator accelerator;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  std::this_thread::sleep_for(
      std::chrono::seconds(accelerator.process_index()));
  std::printf("Process %d reached the barrier after %.1f s\n",
              accelerator.process_index(), elapsed());
  std::fflush(stdout);
  accelerator.wait_for_everyone();
  std::printf("Process %d passed the barrier after %.1f s\n",
              accelerator.process_index(), elapsed());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
