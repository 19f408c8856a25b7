// Accelerate's cv_example.py on real images: the handwritten digits that
// Debian's python3-sklearn ships (1,797 8x8 images; 1,437 to train, 360 to
// test), a small CNN, and random shifts of the training images made in two
// loader worker threads (reproducible per --seed). Accuracy and macro F1
// over exactly the test set through gather_for_metrics, a checkpoint after
// every epoch, --resume.
//
//   bazel run //examples:cv_example -- --num_processes=2
//   bazel run //examples:cv_example -- --num_processes=4 --mixed_precision=bf16
//   bazel run //examples:cv_example -- --stop_after_steps=30   # then:
//   bazel run //examples:cv_example -- --resume
#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <string>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"
#include "examples/classifier_loop.h"
#include "examples/digits.h"

DEFINE_string(data_file, "",
              "sklearn's digits.csv.gz; empty: python3-sklearn's copy.");
DEFINE_int32(channels, 16,
             "Channels of the first convolution (twice that "
             "in the second).");

namespace {

// Two 3x3 convolutions, a 2x2 max pool, two linear layers.
class DigitNetImpl : public torch::nn::Module {
 public:
  explicit DigitNetImpl(int64_t channels)
      : first_(register_module(
            "first", torch::nn::Conv2d(
                         torch::nn::Conv2dOptions(1, channels, 3).padding(1)))),
        second_(register_module(
            "second", torch::nn::Conv2d(
                          torch::nn::Conv2dOptions(channels, 2 * channels, 3)
                              .padding(1)))),
        hidden_(register_module("hidden",
                                torch::nn::Linear(2 * channels * 16, 64))),
        head_(register_module("head", torch::nn::Linear(64, 10))) {}

  torch::Tensor forward(const torch::Tensor& images) {
    torch::Tensor x = torch::relu(first_->forward(images));
    x = torch::max_pool2d(torch::relu(second_->forward(x)), 2);
    return head_->forward(torch::relu(hidden_->forward(x.flatten(1))));
  }

 private:
  torch::nn::Conv2d first_, second_;
  torch::nn::Linear hidden_, head_;
};
TORCH_MODULE(DigitNet);

int Main(int argc, char** argv) {
  if (FLAGS_channels < 1 || FLAGS_channels > 1024) {
    throw accel::UsageError("--channels must be in [1, 1024], found " +
                            std::to_string(FLAGS_channels));
  }
  accel_examples::ExampleOptions options = accel_examples::FromFlags();
  options.project = "cv_example";
  options.num_workers = 2;
  options.loop.classes = 10;
  options.loop.f1_average = accel_examples::F1Average::kMacro;
  options.hyperparameters = {{"channels", FLAGS_channels}};
  accel::Accelerator accelerator(accel_examples::ExampleAccelerator());

  const accel_examples::DigitSplits digits =
      accel_examples::ReadDigits(accel_examples::FindDigits(FLAGS_data_file));
  accelerator.print("Training on", digits.train.labels.size(0),
                    "images; testing on", digits.test.labels.size(0));
  accel_examples::Digits train(digits.train, /*augment=*/true, options.seed);
  options.loop.on_epoch = [train](int64_t epoch) mutable {
    train.set_epoch(epoch);
  };
  accel_examples::RunClassifierExample(
      accelerator, DigitNet(FLAGS_channels), train,
      accel_examples::Digits(digits.test, /*augment=*/false, options.seed),
      options);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel_examples::SetFlagDefaults({{"lr", "1e-2"},
                                   {"epochs", "10"},
                                   {"num_warmup_steps", "10"},
                                   {"output_dir", "cv_example_output"}});
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
