// Accelerate's examples/by_feature/local_sgd.py in C++: each process
// trains its own copy of the model without syncing gradients, and every
// --local_sgd_steps optimizer steps (and when the scope ends, each epoch)
// the processes average their parameters.
//
//   bazel run //examples/by_feature:local_sgd -- --num_processes=2
//       --local_sgd_steps=4 --gradient_accumulation_steps=1
#include "accel/local_sgd.h"

#include "examples/by_feature/common.h"

DEFINE_int32(local_sgd_steps, 8,
             "Optimizer steps between averages of the parameters; 0 turns "
             "LocalSGD off (plain data parallelism).");

namespace {

int Main(int, char**) {
  if (FLAGS_local_sgd_steps < 0) {
    throw accel::UsageError(
        "--local_sgd_steps must be 0 (off) or a number of steps, found " +
        std::to_string(FLAGS_local_sgd_steps));
  }
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  int averages = 0;  // Not in the Python script: what the test checks.
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    {
      // New code: the scope of Python's `with LocalSGD(...) as local_sgd:`.
      accel::LocalSGD local_sgd(accelerator, model,
                                std::max(FLAGS_local_sgd_steps, 1),
                                /*enabled=*/FLAGS_local_sgd_steps > 0);
      for (auto& batch : train_loader) {
        auto accumulate = accelerator.accumulate(model);
        by_feature::TrainStep(accelerator, training, batch);
        local_sgd.step();  // New code.
      }
      averages += local_sgd.averages();
    }  // The last average of the epoch.
    by_feature::PrintEpoch(accelerator, epoch,
                           by_feature::Evaluate(accelerator, training));
  }
  accelerator.print("parameters averaged", averages, "times within the epochs",
                    FLAGS_local_sgd_steps > 0 ? "(and at each epoch's end)"
                                              : "(LocalSGD off)");
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
