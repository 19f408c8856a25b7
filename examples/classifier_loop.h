// What nlp_example and cv_example share, as Accelerate's nlp_example.py and
// cv_example.py write it: the flags (--epochs, --batch_size, --lr, ...),
// split-batch loaders, AdamW with a linear warmup schedule, and the loop:
// per epoch, the training steps (autocast forward and backward of each of
// the batch's micro-batches, --invariant_micro_batches, then the optimizer
// and schedule steps) and an evaluation over exactly the test set through
// gather_for_metrics (accuracy and F1), a checkpoint after every epoch,
// and --resume from the newest one.
//
//   int main(int argc, char** argv) {
//     accel_examples::SetFlagDefaults({{"lr", "3e-3"}});  // this example's
//     accel::InitProgram(&argc, &argv);
//     ...
//     accel::Accelerator accelerator(accel_examples::ExampleAccelerator());
//     accel_examples::ExampleOptions options = accel_examples::FromFlags();
//     options.project = "nlp_example";
//     accel_examples::RunClassifierExample(accelerator, net, train, test,
//                                          options);
//   }
//
// Prints, from the main process, one line per epoch:
//   epoch 0: {'accuracy': 0.981803, 'f1': 0.968254, 'samples': 1209}
#pragma once

#include <gflags/gflags.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "accel/accelerator.h"

DECLARE_int32(epochs);
DECLARE_int32(batch_size);
DECLARE_double(lr);
DECLARE_int32(num_warmup_steps);
DECLARE_int64(seed);
DECLARE_string(output_dir);
DECLARE_bool(resume);
DECLARE_int32(stop_after_steps);
DECLARE_bool(float64);

namespace accel_examples {

// evaluate's f1: of class 1 (binary) or the mean over the classes (macro).
enum class F1Average { kBinary, kMacro };

struct LoopOptions {
  int epochs = 3;
  int64_t classes = 2;
  F1Average f1_average = F1Average::kBinary;
  bool resume = false;
  // Stop (as if interrupted, after saving) after this many optimizer steps
  // of this run; 0 runs to the end.
  int stop_after_steps = 0;
  // The model is in double precision: floating inputs are converted.
  bool float64 = false;
  // Called at the start of every epoch with its number (a data set's
  // augmentation, say).
  std::function<void(int64_t)> on_epoch;
};

struct EvalResult {
  double accuracy = 0;
  double f1 = 0;
  int64_t samples = 0;
  std::string ToString() const {
    char text[96];
    std::snprintf(text, sizeof(text),
                  "{'accuracy': %.6f, 'f1': %.6f, 'samples': %lld}", accuracy,
                  f1, static_cast<long long>(samples));
    return text;
  }
};

// Accuracy and F1 of `predictions` against `references` (int64 class ids).
EvalResult ClassificationMetrics(const torch::Tensor& predictions,
                                 const torch::Tensor& references,
                                 int64_t classes, F1Average average);

// The batch's inputs in the model's precision.
inline torch::Tensor Inputs(const torch::Tensor& data,
                            const LoopOptions& loop) {
  return loop.float64 && data.is_floating_point() ? data.to(torch::kDouble)
                                                  : data;
}

template <typename Model, typename Loader>
EvalResult EvaluateClassifier(accel::Accelerator& accelerator, Model& model,
                              Loader& eval_loader, const LoopOptions& loop) {
  model->eval();
  std::vector<torch::Tensor> predictions, references;
  for (auto& batch : eval_loader) {
    torch::Tensor predicted;
    {
      torch::NoGradGuard no_grad;
      auto autocast = accelerator.autocast();
      predicted = model->forward(Inputs(batch.data, loop)).argmax(-1);
    }
    auto gathered = accelerator.gather_for_metrics({predicted, batch.target});
    predictions.push_back(gathered[0]);
    references.push_back(gathered[1]);
  }
  return ClassificationMetrics(torch::cat(predictions), torch::cat(references),
                               loop.classes, loop.f1_average);
}

// Trains and evaluates; returns the last epoch's evaluation (samples 0 when
// the run stopped early or had no epoch left to run).
template <typename Model, typename Optimizer, typename Loader,
          typename Scheduler>
EvalResult TrainClassifier(accel::Accelerator& accelerator,
                           const LoopOptions& loop, Model& model,
                           Optimizer& optimizer, Loader& train_loader,
                           Loader& eval_loader, Scheduler& scheduler) {
  if (loop.resume) {
    if (const std::string resumed = accelerator.load_state();
        !resumed.empty()) {
      accelerator.print("Resumed from", resumed, "at epoch",
                        train_loader.epoch());
    } else {
      accelerator.print("No checkpoint to resume from: starting afresh");
    }
  }
  EvalResult result;
  int steps_this_run = 0;
  double train_seconds = 0;  // This run's, without the evaluations.
  int64_t trained_samples = 0;
  for (int64_t epoch = train_loader.epoch(); epoch < loop.epochs; ++epoch) {
    if (loop.on_epoch) loop.on_epoch(epoch);
    model->train();
    const auto start = std::chrono::steady_clock::now();
    int64_t samples = 0;
    double loss_sum = 0;
    int64_t losses = 0;
    for (auto& batch : train_loader) {
      auto accumulate = accelerator.accumulate(model);
      // One slice, the batch, unless --invariant_micro_batches cuts it.
      const auto slices = accelerator.micro_batches(batch);
      double loss_value = 0;
      for (const auto& slice : slices) {
        torch::Tensor loss;
        {
          auto autocast = accelerator.autocast();
          loss = torch::nn::functional::cross_entropy(
              model->forward(Inputs(slice.data, loop)), slice.target);
        }
        accelerator.backward(loss);
        loss_value += loss.template item<double>() / slices.size();
      }
      optimizer.step();
      scheduler.step();
      optimizer.zero_grad();
      samples += batch.data.size(0);
      loss_sum += loss_value;
      ++losses;
      if (!accelerator.sync_gradients()) continue;
      // The main process's loss (no collective), as Accelerate's examples
      // log it.
      accelerator.log({{"loss", loss_value}}, accelerator.step());
      if (loop.stop_after_steps > 0 &&
          ++steps_this_run >= loop.stop_after_steps) {
        const std::string saved = accelerator.save_state();
        accelerator.print("Stopped after", steps_this_run, "steps; saved",
                          saved);
        return {};
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    result = EvaluateClassifier(accelerator, model, eval_loader, loop);
    // Each process's share of global batches (split_batches).
    const int64_t global_samples = samples * accelerator.num_processes();
    train_seconds += seconds;
    trained_samples += global_samples;
    accelerator.log({{"train_loss", loss_sum / std::max<int64_t>(losses, 1)},
                     {"accuracy", result.accuracy},
                     {"f1", result.f1},
                     {"samples_per_second", global_samples / seconds},
                     {"epoch", epoch}},
                    accelerator.step());
    accelerator.print("epoch " + std::to_string(epoch) + ":",
                      result.ToString());
    accelerator.save_state();
  }
  if (train_seconds > 0) {
    char line[128];
    std::snprintf(line, sizeof(line),
                  "trained on %lld samples in %.2f s: %.1f samples/s",
                  static_cast<long long>(trained_samples), train_seconds,
                  trained_samples / train_seconds);
    accelerator.print(line);
  }
  return result;
}

// Before InitProgram: this example's defaults of the shared flags (and
// output_dir), shown by --help. Throws std::logic_error for an unknown one.
void SetFlagDefaults(const std::map<std::string, std::string>& defaults);

// The Accelerator options of the flags: seed, checkpoints under
// --output_dir, the newest two kept.
accel::AcceleratorOptions ExampleAccelerator();

struct ExampleOptions {
  std::string project;      // The trackers' project name.
  int64_t batch_size = 32;  // Global, split across processes.
  double lr = 1e-3;
  int num_warmup_steps = 0;
  uint64_t seed = 42;
  size_t num_workers = 0;  // The training loader's.
  std::string output_dir;
  accel::TrackerValues hyperparameters;  // Besides the ones above.
  LoopOptions loop;
};

// The shared flags, checked (UsageError for a bad one).
ExampleOptions FromFlags();

// The training loaders' options: split_batches, without the last short
// batch (one process would train on it alone, several on it filled up from
// the epoch's start), shuffled; the test loader's: in order, every sample.
accel::DataLoaderOptions TrainLoaderOptions(const ExampleOptions& options);
accel::DataLoaderOptions TestLoaderOptions(const ExampleOptions& options);

// Prepares `net` (in double precision with float64), AdamW, the linear
// warmup schedule over the run and the loaders; trains and evaluates; saves
// the weights to <output_dir>/model.
template <typename Net, typename Dataset>
EvalResult RunClassifierExample(accel::Accelerator& accelerator, Net net,
                                Dataset train, Dataset test,
                                const ExampleOptions& options) {
  accel::DataLoader<Dataset> train_data(std::move(train),
                                        TrainLoaderOptions(options));
  accel::DataLoader<Dataset> test_data(std::move(test),
                                       TestLoaderOptions(options));
  if (train_data.size() == 0) {
    throw accel::UsageError(
        "the training set (" + std::to_string(train_data.dataset_size()) +
        " samples) is smaller than one global batch (--batch_size=" +
        std::to_string(options.batch_size) +
        ", without the last short batch): no optimizer step would run");
  }
  if (options.loop.float64) net->to(torch::kDouble);
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(options.lr));
  const int64_t training_steps = static_cast<int64_t>(train_data.size()) *
                                 options.loop.epochs /
                                 accelerator.gradient_accumulation_steps();
  auto [model, optimizer, train_loader, test_loader, lr_scheduler] =
      accelerator.prepare(net, adamw, train_data, test_data,
                          accel::get_linear_schedule_with_warmup(
                              adamw, options.num_warmup_steps, training_steps));
  accel::TrackerValues config = options.hyperparameters;
  config.insert_or_assign("lr", options.lr);
  config.insert_or_assign("epochs", options.loop.epochs);
  config.insert_or_assign("batch_size", options.batch_size);
  config.insert_or_assign("num_processes", accelerator.num_processes());
  config.insert_or_assign("mixed_precision", accelerator.mixed_precision());
  accelerator.init_trackers(options.project, config);
  const EvalResult result =
      TrainClassifier(accelerator, options.loop, model, optimizer, train_loader,
                      test_loader, lr_scheduler);
  accelerator.wait_for_everyone();
  if (result.samples > 0) {
    accelerator.save_model(model, options.output_dir + "/model");
  }
  accelerator.end_training();
  return result;
}

}  // namespace accel_examples
