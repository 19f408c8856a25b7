// Accelerate's examples/by_feature/gradient_accumulation.py in C++:
// nlp_example's loop with gradients accumulated over
// --gradient_accumulation_steps batches (accel's flag, read by
// AcceleratorOptions::FromFlags as Accelerator(gradient_accumulation_steps=
// args.gradient_accumulation_steps) reads it in Python).
//
//   bazel run //examples/by_feature:gradient_accumulation --
//       --num_processes=2 --gradient_accumulation_steps=2
#include "examples/by_feature/common.h"

namespace {

int Main(int, char**) {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  int64_t optimizer_steps = 0;  // Not in the Python script: for the test.
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    for (auto& batch : train_loader) {
      // New code: the optimizer and the schedule step, and the gradients
      // sync across processes, only every gradient_accumulation_steps
      // batches (and at the end of the loader).
      auto accumulate = accelerator.accumulate(model);
      by_feature::TrainStep(accelerator, training, batch);
      if (accelerator.sync_gradients()) ++optimizer_steps;
    }
    by_feature::PrintEpoch(accelerator, epoch,
                           by_feature::Evaluate(accelerator, training));
  }
  accelerator.print("optimizer steps:", optimizer_steps);
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
