// The README's first loop, built by CMake against an installed accel:
// prepare, backward, gather_for_metrics, wait_for_everyone, save_state.
#include <torch/torch.h>

#include <string>

#include "accel/accelerator.h"

// 64 samples whose label is the sign of their first feature.
struct SignDataset {
  SignDataset() {
    torch::manual_seed(0);
    inputs = torch::randn({64, 10});
    labels = (inputs.select(1, 0) > 0).to(torch::kLong);
  }
  torch::Tensor inputs, labels;
  torch::data::Example<> get(size_t i) { return {inputs[i], labels[i]}; }
  size_t size() const { return 64; }
};

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);  // --num_processes=N starts N processes
  accel::Accelerator accelerator;
  torch::nn::Sequential model(torch::nn::Linear(10, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 2));
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(1e-2));
  accel::DataLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  accel::DataLoader<SignDataset> data(SignDataset(), options);
  auto [ddp_model, ddp_optimizer, loader] =
      accelerator.prepare(model, optimizer, data);
  int64_t correct = 0, counted = 0;
  for (int epoch = 0; epoch < 20; ++epoch) {
    correct = counted = 0;
    for (auto& batch : loader) {
      auto outputs = ddp_model->forward(batch.data);
      auto loss = torch::nn::functional::cross_entropy(outputs, batch.target);
      accelerator.backward(loss);
      ddp_optimizer.step();
      ddp_optimizer.zero_grad();
      auto [predictions, targets] =
          accelerator.gather_for_metrics({outputs.argmax(-1), batch.target});
      correct += predictions.eq(targets).sum().item<int64_t>();
      counted += targets.numel();
    }
  }
  accelerator.wait_for_everyone();
  accelerator.save_state("trained_model");
  accelerator.print(
      "cmake consumer: " + std::to_string(accelerator.num_processes()) +
      " process(es), last epoch " + std::to_string(correct) + " of " +
      std::to_string(counted) + " right; saved trained_model");
  return 0;
}
