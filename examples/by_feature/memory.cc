// Accelerate's examples/by_feature/memory.py in C++: the training runs
// inside find_executable_batch_size, which starts at the configuration's
// batch size and, when a process runs out of memory, runs it again on every
// process with a smaller one (int(0.9 * size)) until it fits.
//
//   bazel run //examples/by_feature:memory -- --num_processes=2
//   bazel run //examples/by_feature:memory -- --num_processes=2
//       --simulated_memory_limit=12   (the last process fits 12 samples)
#include "accel/memory.h"

#include "examples/by_feature/common.h"

DEFINE_int64(simulated_memory_limit, 0,
             "Not in the Python script: the largest batch the last process "
             "has memory for (0: any), to see the search work on a CPU.");

namespace {

int Main(int, char**) {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  // New code: everything below runs once per batch size tried.
  const int64_t batch_size = accel::find_executable_batch_size(
      accelerator,
      [&](int64_t batch_size) {
        // What the last try prepared goes, before anything is made again.
        accelerator.free_memory();
        accelerator.print("Trying batch size", batch_size);
        by_feature::Training training(accelerator, config, batch_size);
        by_feature::TrainAndEvaluate(accelerator, config, training, batch_size,
                                     FLAGS_simulated_memory_limit);
        return batch_size;
      },
      config.batch_size);
  accelerator.print("Trained with batch size", batch_size);
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
