// Accelerate's examples/by_feature/tracking.py in C++: with --with_tracking
// every tracker accel has (log_with="all": jsonl and tensorboard) records
// the configuration and, each epoch, the accuracy and the mean training
// loss, under <project_dir>/tracking.
//
//   bazel run //examples/by_feature:tracking -- --num_processes=2
//       --with_tracking --project_dir=/tmp/logs
//   bazel run //tools:plot_metrics -- /tmp/logs/tracking
#include "examples/by_feature/common.h"

DEFINE_bool(with_tracking, false, "Track the run with every tracker.");
DEFINE_string(project_dir, "logs", "Where the trackers write.");

namespace {

int Main(int, char**) {
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  if (FLAGS_with_tracking) {
    // New code: Accelerator(log_with="all", project_dir=args.project_dir).
    options.log_with = {"all"};
    options.project_dir = FLAGS_project_dir;
  }
  accel::Accelerator accelerator(options);
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  if (FLAGS_with_tracking) {
    // New code: the run is named after the script, as in Python.
    accelerator.init_trackers("tracking",
                              {{"lr", config.lr},
                               {"num_epochs", config.num_epochs},
                               {"seed", static_cast<int64_t>(config.seed)},
                               {"batch_size", config.batch_size}});
  }
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    double total_loss = 0;
    for (auto& batch : train_loader) {
      const torch::Tensor loss =
          by_feature::TrainStep(accelerator, training, batch);
      if (FLAGS_with_tracking) total_loss += loss.detach().item<double>();
    }
    const by_feature::MetricResult eval_metric =
        by_feature::Evaluate(accelerator, training);
    by_feature::PrintEpoch(accelerator, epoch, eval_metric);
    if (FLAGS_with_tracking) {
      accelerator.log({{"accuracy", eval_metric.accuracy},
                       {"train_loss",
                        total_loss / static_cast<double>(train_loader.size())},
                       {"epoch", epoch}},
                      epoch);
    }
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
