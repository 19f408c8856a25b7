// Accelerate's by_feature/fsdp_with_peak_mem_tracking.py in C++: a training
// loop with sharded training state (--zero_stage, accel's ZeRO stages 1-3;
// see docs/parallelism.md, "Sharded training") that prints, on the main
// process, the host memory of each epoch as that script prints its GPU memory:
// before the epoch, at its end, and its peak, for the largest rank (counted
// by accel::HostMemoryTracker, every byte LibTorch allocates on the CPU).
//
//   bazel run //examples:fsdp_example -- --num_processes=2 --zero_stage=2
//   bazel run //examples:fsdp_example -- --num_processes=3 --zero_stage=3
//   bazel run //examples:fsdp_example -- --num_processes=1   (the baseline)
//
// A synthetic two-class task and an MLP (--hidden wide, --layers deep, fp32
// AdamW), the global batch split across processes; accuracy through
// gather_for_metrics. At 2 processes with --zero_stage=2 a rank holds about
// 10 of DDP's 16 bytes per parameter (docs/parallelism.md), which the peaks
// show.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <string>

#include "accel/accelerator.h"
#include "accel/memory/host_memory_tracker.h"

DEFINE_int32(epochs, 2, "Epochs to train.");
DEFINE_int32(batch_size, 24, "Global batch size, split across processes.");
DEFINE_int32(hidden, 512, "Width of the hidden layers.");
DEFINE_int32(layers, 4, "Hidden layers.");
DEFINE_double(lr, 1e-3, "Learning rate of AdamW.");

namespace {

constexpr int64_t kSamples = 288;  // Divisible by 24 at 1 to 4 processes.
constexpr int64_t kFeatures = 32;

class TwoClasses : public torch::data::datasets::Dataset<TwoClasses> {
 public:
  TwoClasses() {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
    labels_ = torch::randint(0, 2, {kSamples}, generator, torch::kLong);
    inputs_ = torch::randn({kSamples, kFeatures}, generator) +
              labels_.unsqueeze(1).to(torch::kFloat) * 0.4;
  }
  torch::data::Example<> get(size_t i) override {
    return {inputs_[i], labels_[i]};
  }
  torch::optional<size_t> size() const override { return kSamples; }

 private:
  torch::Tensor inputs_, labels_;
};

double Mb(double bytes) { return bytes / 1e6; }

int Main(int, char**) {
  if (FLAGS_epochs < 1 || FLAGS_batch_size < 1 || FLAGS_hidden < 1 ||
      FLAGS_layers < 1) {
    throw accel::UsageError(
        "--epochs, --batch_size, --hidden and --layers must be at least 1");
  }
  // Before any tensor, so that it counts them all.
  accel::HostMemoryTracker& memory = accel::HostMemoryTracker::Install();
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.seed = 42;
  accel::Accelerator accelerator(options);

  accel::DataLoaderOptions loader_options;
  loader_options.batch_size = static_cast<size_t>(FLAGS_batch_size);
  loader_options.split_batches = true;
  loader_options.shuffle = true;
  loader_options.seed = 42;
  accel::DataLoader<TwoClasses> data(TwoClasses(), loader_options);

  torch::nn::Sequential net(torch::nn::Linear(kFeatures, FLAGS_hidden),
                            torch::nn::ReLU());
  for (int i = 0; i < FLAGS_layers; ++i) {
    net->push_back(torch::nn::Linear(FLAGS_hidden, FLAGS_hidden));
    net->push_back(torch::nn::ReLU());
  }
  net->push_back(torch::nn::Linear(FLAGS_hidden, 2));
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(FLAGS_lr));
  auto [model, optimizer, loader] = accelerator.prepare(net, adamw, data);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  accelerator.print("Training", parameters, "parameters on",
                    accelerator.num_processes(), "process(es), zero_stage",
                    options.zero_stage);

  for (int epoch = 0; epoch < FLAGS_epochs; ++epoch) {
    const double before = static_cast<double>(memory.held_bytes());
    memory.ResetPeak();
    model->train();
    for (auto& batch : loader) {
      accelerator.backward(torch::nn::functional::cross_entropy(
          model->forward(batch.data), batch.target));
      optimizer.step();
      optimizer.zero_grad();
    }
    // The largest rank's figures.
    const torch::Tensor figures = accelerator.reduce(
        torch::tensor({before, static_cast<double>(memory.held_bytes()),
                       static_cast<double>(memory.peak_bytes())},
                      torch::kFloat64),
        "max");
    const double end = figures[1].item<double>();
    const double peak = figures[2].item<double>();

    model->eval();
    int64_t correct = 0;
    int64_t total = 0;
    for (auto& batch : loader) {
      torch::NoGradGuard no_grad;
      const torch::Tensor predictions =
          accelerator.gather_for_metrics(model->forward(batch.data).argmax(-1));
      const torch::Tensor references =
          accelerator.gather_for_metrics(batch.target);
      correct += predictions.eq(references).sum().item<int64_t>();
      total += references.numel();
    }
    accelerator.print("Epoch", epoch + 1, "- accuracy",
                      std::to_string(static_cast<double>(correct) / total),
                      "on", total, "samples");
    accelerator.print("  Host memory before the epoch:",
                      std::to_string(Mb(figures[0].item<double>())), "MB");
    accelerator.print("  Host memory at its end (end - before):",
                      std::to_string(Mb(end - figures[0].item<double>())),
                      "MB");
    accelerator.print("  Peak host memory during it (peak - before):",
                      std::to_string(Mb(peak - figures[0].item<double>())),
                      "MB");
    accelerator.print("  Peak host memory per rank:", std::to_string(Mb(peak)),
                      "MB");
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
