// A training program in a workspace of its own, built against accel as any
// outside project would be (see WORKSPACE and BUILD.bazel beside it):
//
//   cd examples/consumer && bazel run //:hello_accel -- --num_processes=2
//
// It trains a small classifier data-parallel, gathers the predictions of
// every process and tracks the run with --report_to=jsonl,tensorboard.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>

#include "accel/accelerator.h"

namespace {

// 96 points whose label is the sign of their first feature.
struct Points {
  Points() {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
    x = torch::randn({96, 4}, generator);
    y = (x.select(1, 0) > 0).to(torch::kLong);
  }
  torch::Tensor x, y;
  torch::data::Example<> get(size_t i) { return {x[i], y[i]}; }
  size_t size() const { return 96; }
};

int Main(int argc, char** argv) {
  accel::Accelerator accelerator;  // --backend, --report_to, ... (FromFlags)
  accelerator.set_seed(3);

  torch::nn::Sequential net(torch::nn::Linear(4, 16), torch::nn::ReLU(),
                            torch::nn::Linear(16, 2));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.3));
  accel::DataLoaderOptions loader_options;
  loader_options.batch_size = 8;
  loader_options.shuffle = true;
  accel::DataLoader<Points> data(Points(), loader_options);
  auto [model, optimizer, loader] = accelerator.prepare(net, sgd, data);
  accelerator.init_trackers("hello_accel", {{"lr", 0.3}, {"batch_size", 8}});

  double accuracy = 0;
  int64_t gathered = 0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    int64_t correct = 0;
    gathered = 0;
    for (auto& batch : loader) {
      torch::Tensor outputs = model->forward(batch.data);
      torch::Tensor loss =
          torch::nn::functional::cross_entropy(outputs, batch.target);
      accelerator.backward(loss);
      optimizer.step();
      optimizer.zero_grad();
      torch::Tensor predictions =
          accelerator.gather_for_metrics(outputs.argmax(-1));
      torch::Tensor labels = accelerator.gather_for_metrics(batch.target);
      correct += predictions.eq(labels).sum().item<int64_t>();
      gathered += labels.numel();
      accelerator.log({{"loss", loss.item<double>()}}, accelerator.step());
    }
    accuracy = static_cast<double>(correct) / static_cast<double>(gathered);
    accelerator.log({{"accuracy", accuracy}}, accelerator.step());
  }
  accelerator.wait_for_everyone();
  if (accelerator.is_main_process()) {
    std::printf(
        "hello_accel: trained on %d processes (%s); accuracy %.3f over %lld "
        "gathered predictions\n",
        accelerator.num_processes(), accelerator.backend().c_str(), accuracy,
        static_cast<long long>(gathered));
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
