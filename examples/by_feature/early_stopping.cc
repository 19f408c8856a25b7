// Accelerate's examples/by_feature/early_stopping.py in C++: a callback
// watches each process's training loss; when it has not improved by
// min_delta for `patience` steps on any process, that process sets the
// trigger, and check_trigger() stops the training on every process at the
// same step.
//
//   bazel run //examples/by_feature:early_stopping -- --num_processes=2
#include <limits>

#include "examples/by_feature/common.h"

DEFINE_double(min_delta, 0, "The improvement of the loss that counts.");
DEFINE_int32(patience, 5, "Steps without improvement before stopping.");

namespace {

// New code: the Python script's EarlyStoppingCallback.
class EarlyStoppingCallback {
 public:
  EarlyStoppingCallback(double min_delta, int patience)
      : min_delta_(min_delta), patience_(patience) {}
  // Whether to stop, after a step of loss `loss`.
  bool check_early_stopping(double loss) {
    const double delta = lowest_loss_ - loss;
    if (delta >= min_delta_) {
      lowest_loss_ = loss;
      counter_ = 0;
      return false;
    }
    return ++counter_ >= patience_;
  }

 private:
  const double min_delta_;
  const int patience_;
  int counter_ = 0;
  double lowest_loss_ = std::numeric_limits<double>::infinity();
};

int Main(int, char**) {
  if (FLAGS_patience < 1) {
    throw accel::UsageError("--patience must be at least 1 step, found " +
                            std::to_string(FLAGS_patience));
  }
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  EarlyStoppingCallback callback(FLAGS_min_delta, FLAGS_patience);
  int64_t steps = 0;  // Not in the Python script: what the test checks.
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    bool stopped = false;
    for (auto& batch : train_loader) {
      const torch::Tensor loss =
          by_feature::TrainStep(accelerator, training, batch);
      ++steps;
      // New code: any process may ask to stop; every process then stops.
      if (callback.check_early_stopping(loss.item<double>())) {
        accelerator.set_trigger();
      }
      if (accelerator.check_trigger()) {
        stopped = true;
        break;
      }
    }
    by_feature::PrintEpoch(accelerator, epoch,
                           by_feature::Evaluate(accelerator, training));
    if (stopped) {
      // Every process reports its own step; they must all say the same.
      std::printf("process %d stopped early after step %lld\n",
                  accelerator.process_index(), static_cast<long long>(steps));
      std::fflush(stdout);
      break;
    }
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
