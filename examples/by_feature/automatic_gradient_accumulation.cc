// Accelerate's examples/by_feature/automatic_gradient_accumulation.py in
// C++: find_executable_batch_size looks for a batch that fits, and the
// gradients accumulate over observed_batch_size / batch_size batches, so
// the optimizer still steps on batches of the size the run asked for.
//
//   bazel run //examples/by_feature:automatic_gradient_accumulation --
//       --num_processes=2 --simulated_memory_limit=8
#include "accel/memory.h"
#include "examples/by_feature/common.h"

DEFINE_int64(simulated_memory_limit, 0,
             "Not in the Python script: the largest batch the last process "
             "has memory for (0: any), to see the search work on a CPU.");

namespace {

int Main(int, char**) {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  // New code: the batch size the optimizer steps on.
  const int64_t observed_batch_size = config.batch_size;
  const int64_t batch_size = accel::find_executable_batch_size(
      accelerator,
      [&](int64_t batch_size) {
        // New code: accumulate up to the observed batch size.
        accelerator.set_gradient_accumulation_steps(
            static_cast<int>(observed_batch_size / batch_size));
        accelerator.free_memory();
        accelerator.print("Trying batch size", batch_size,
                          "with gradient accumulation steps",
                          accelerator.gradient_accumulation_steps());
        by_feature::Training training(accelerator, config, batch_size);
        by_feature::TrainAndEvaluate(accelerator, config, training, batch_size,
                                     FLAGS_simulated_memory_limit);
        return batch_size;
      },
      observed_batch_size);
  accelerator.print("Trained with batch size", batch_size, "and",
                    accelerator.gradient_accumulation_steps(),
                    "gradient accumulation steps");
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
