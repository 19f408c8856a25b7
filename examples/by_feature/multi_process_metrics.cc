// Accelerate's examples/by_feature/multi_process_metrics.py in C++: the
// evaluation gathers with gather() and drops, by hand, the samples that
// the last batch repeats to fill every process's share (what
// gather_for_metrics does by itself, as the other examples use it).
//
//   bazel run //examples/by_feature:multi_process_metrics --
//       --num_processes=2
#include "examples/by_feature/common.h"

namespace {

// The evaluation loop of the Python script.
by_feature::MetricResult EvaluateWithGather(accel::Accelerator& accelerator,
                                            by_feature::Training& training) {
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  model->eval();
  by_feature::Metric metric;
  const int64_t batches = static_cast<int64_t>(eval_loader.size());
  const int64_t dataset_size = static_cast<int64_t>(eval_loader.dataset_size());
  int64_t samples_seen = 0;
  int64_t step = 0;
  for (auto& batch : eval_loader) {
    torch::Tensor predictions;
    {
      torch::NoGradGuard no_grad;
      predictions = model->forward(batch).logits.argmax(-1);
    }
    auto [all_predictions, references] =
        accelerator.gather({predictions, batch.target});
    // New code: on several processes the last batch holds samples from
    // the start of the data set again, to give every process a batch.
    if (accelerator.use_distributed()) {
      if (step == batches - 1) {
        all_predictions =
            all_predictions.slice(0, 0, dataset_size - samples_seen);
        references = references.slice(0, 0, dataset_size - samples_seen);
      } else {
        samples_seen += references.size(0);
      }
    }
    metric.add_batch(all_predictions, references);
    ++step;
  }
  return metric.compute();
}

int Main(int, char**) {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    for (auto& batch : train_loader) {
      by_feature::TrainStep(accelerator, training, batch);
    }
    const by_feature::MetricResult by_hand =
        EvaluateWithGather(accelerator, training);
    by_feature::PrintEpoch(accelerator, epoch, by_hand);
    // Not in the Python script: gather_for_metrics counts the same.
    const by_feature::MetricResult automatic =
        by_feature::Evaluate(accelerator, training);
    accelerator.print("gather_for_metrics:", automatic.ToString());
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
