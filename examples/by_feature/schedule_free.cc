// Accelerate's examples/by_feature/schedule_free.py in C++: schedule-free
// AdamW (accel::AdamWScheduleFree, accel/optim/schedule_free.h; the
// schedulefree package's in Python) instead of AdamW with a learning-rate
// schedule. The optimizer switches the parameters between the point it takes
// gradients at (train()) and the average it evaluates (eval()), beside the
// model's own train() and eval().
//
//   bazel run //examples/by_feature:schedule_free -- --num_processes=2
#include "accel/optim/schedule_free.h"

#include "examples/by_feature/common.h"

namespace {

int Main(int, char**) {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  accelerator.set_seed(config.seed);
  auto [train_data, eval_data] =
      by_feature::GetDataloaders(accelerator, config.batch_size, config.seed);
  by_feature::Classifier net;
  // New code: no schedule; a short linear warmup inside the optimizer.
  accel::AdamWScheduleFree schedule_free(
      net->parameters(),
      accel::AdamWScheduleFreeOptions(config.lr).warmup_steps(
          config.num_warmup_steps));
  auto [model, optimizer, train_loader, eval_loader] =
      accelerator.prepare(net, schedule_free, train_data, eval_data);
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    schedule_free.train();  // New code.
    for (auto& batch : train_loader) {
      auto accumulate = accelerator.accumulate(model);
      accelerator.backward(model->forward(batch).loss);
      optimizer.step();
      optimizer.zero_grad();
    }
    schedule_free.eval();  // New code: evaluate the average.
    by_feature::PrintEpoch(
        accelerator, epoch,
        by_feature::Evaluate(accelerator, model, eval_loader));
  }
  accelerator.print("parameter checksum:",
                    by_feature::ParameterChecksum(model));
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
