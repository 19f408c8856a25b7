// What Accelerate's by_feature scripts take from nlp_example.py, for their
// C++ ports: the configuration (`config = {"lr": ..., "num_epochs": ...}`),
// get_dataloaders, the model (whose output has .loss and .logits), the
// metric (evaluate.load(...)), and the training objects prepared, so that
// each port shows only what its feature adds.
//
//   accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
//   const by_feature::Config config;
//   by_feature::Training training(accelerator, config);
//   auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
//       training.prepared;
//   for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
//     model->train();
//     for (auto& batch : train_loader) {
//       auto accumulate = accelerator.accumulate(model);
//       by_feature::TrainStep(accelerator, training, batch);
//     }
//     by_feature::PrintEpoch(accelerator, epoch,
//                            by_feature::Evaluate(accelerator, training));
//   }
//
// The data are accel_examples::Blobs (examples/blobs.h): 240 training and
// 110 evaluation samples (110 is not a multiple of the global batch, so
// gather_for_metrics's dropping of duplicates matters), 3 classes.
#pragma once

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"
#include "examples/blobs.h"

namespace by_feature {

// nlp_example.py's EVAL_BATCH_SIZE.
constexpr int64_t kEvalBatchSize = 32;

// nlp_example.py's `config` dictionary, at values for the blobs.
struct Config {
  double lr = 1e-2;
  int num_epochs = 3;
  uint64_t seed = 42;
  int64_t batch_size = 16;  // Per process, as Accelerate's loaders.
  int64_t num_warmup_steps = 4;
};

using Loader = accel::DataLoader<accel_examples::Blobs>;
using Batch = torch::data::Example<>;

// get_dataloaders(accelerator, batch_size): the data sets made under
// main_process_first (where Accelerate's script tokenizes), a shuffled
// training loader and an evaluation loader of kEvalBatchSize.
inline std::pair<Loader, Loader> GetDataloaders(accel::Accelerator& accelerator,
                                                int64_t batch_size,
                                                uint64_t seed = Config().seed) {
  std::optional<std::pair<accel_examples::Blobs, accel_examples::Blobs>> sets;
  {
    auto first = accelerator.main_process_first();
    sets = accel_examples::MakeBlobs(seed);
  }
  accel::DataLoaderOptions train_options;
  train_options.batch_size = static_cast<size_t>(batch_size);
  train_options.shuffle = true;
  train_options.seed = seed;
  accel::DataLoaderOptions eval_options;
  eval_options.batch_size = static_cast<size_t>(kEvalBatchSize);
  return {Loader(sets->first, train_options),
          Loader(sets->second, eval_options)};
}

// What AutoModelForSequenceClassification returns: the loss (cross
// entropy against the batch's labels) and the logits.
struct ClassifierOutput {
  torch::Tensor loss;
  torch::Tensor logits;
};

// The scripts' model: an MLP over the blobs' features.
class ClassifierImpl : public torch::nn::Module {
 public:
  explicit ClassifierImpl(const accel_examples::BlobsShape& shape = {})
      : net_(register_module(
            "net", torch::nn::Sequential(
                       torch::nn::Linear(shape.features, 64), torch::nn::ReLU(),
                       torch::nn::Linear(64, shape.classes)))) {}
  ClassifierOutput forward(const Batch& batch) {
    torch::Tensor logits = net_->forward(batch.data);
    return {torch::nn::functional::cross_entropy(logits, batch.target), logits};
  }

 private:
  torch::nn::Sequential net_;
};
TORCH_MODULE(Classifier);

// evaluate's "accuracy" result.
struct MetricResult {
  double accuracy = 0;
  int64_t samples = 0;  // How many predictions it counted.
  // As Python prints the dictionary: {'accuracy': 0.954545, 'samples': 110}
  std::string ToString() const {
    char text[96];
    std::snprintf(text, sizeof(text), "{'accuracy': %.6f, 'samples': %lld}",
                  accuracy, static_cast<long long>(samples));
    return text;
  }
};

// evaluate.load(...): add_batch() over the evaluation, then compute(),
// which also starts the next evaluation afresh.
class Metric {
 public:
  void add_batch(const torch::Tensor& predictions,
                 const torch::Tensor& references) {
    correct_ += predictions.eq(references).sum().item<int64_t>();
    samples_ += references.numel();
  }
  MetricResult compute() {
    MetricResult result;
    result.samples = samples_;
    result.accuracy = samples_ == 0 ? 0.0
                                    : static_cast<double>(correct_) /
                                          static_cast<double>(samples_);
    correct_ = samples_ = 0;
    return result;
  }

 private:
  int64_t correct_ = 0;
  int64_t samples_ = 0;
};

// The torch objects nlp_example's training_function makes (the model,
// AdamW, the linear warmup schedule over every optimizer step) and
// `prepared`, what accelerator.prepare returned for them and the loaders.
// The Training keeps the torch optimizer alive, as a LibTorch program
// keeps any optimizer it passes by reference.
class Training {
 public:
  // set_seed(seed), get_dataloaders(accelerator, batch_size), the rest.
  Training(accel::Accelerator& accelerator, const Config& config,
           int64_t batch_size = 0)
      : Training(accelerator, config,
                 SeededDataloaders(accelerator, config, batch_size)) {}
  // With the program's own (unprepared) loaders.
  Training(accel::Accelerator& accelerator, const Config& config,
           std::pair<Loader, Loader> loaders)
      : adamw_(std::make_unique<torch::optim::AdamW>(
            model_->parameters(), torch::optim::AdamWOptions(config.lr))),
        prepared(accelerator.prepare(
            model_, *adamw_, loaders.first, loaders.second,
            accel::get_linear_schedule_with_warmup(
                *adamw_, config.num_warmup_steps,
                TrainingSteps(accelerator, config, loaders.first)))) {}

 private:
  static std::pair<Loader, Loader> SeededDataloaders(
      accel::Accelerator& accelerator, const Config& config,
      int64_t batch_size) {
    accelerator.set_seed(config.seed);
    return GetDataloaders(accelerator,
                          batch_size > 0 ? batch_size : config.batch_size,
                          config.seed);
  }
  // (len(train_dataloader) * num_epochs) // gradient_accumulation_steps,
  // with the loader as prepare() will shard it.
  static int64_t TrainingSteps(const accel::Accelerator& accelerator,
                               const Config& config, const Loader& train) {
    const int64_t per_process_batches = static_cast<int64_t>(
        train
            .Shard(accelerator.process_index(), accelerator.num_processes(),
                   accelerator.device())
            .size());
    return per_process_batches * config.num_epochs /
           accelerator.gradient_accumulation_steps();
  }

  Classifier model_;  // Before adamw_ and prepared: they use it.
  std::unique_ptr<torch::optim::AdamW> adamw_;

 public:
  using Prepared = decltype(std::declval<accel::Accelerator&>().prepare(
      std::declval<Classifier&>(), std::declval<torch::optim::AdamW&>(),
      std::declval<Loader&>(), std::declval<Loader&>(),
      accel::get_linear_schedule_with_warmup(
          std::declval<torch::optim::AdamW&>(), 0, 0)));
  // model, optimizer, train_loader, eval_loader, lr_scheduler.
  Prepared prepared;
};

// One training step of nlp_example's loop, under the caller's
// accumulate scope (or none): forward, backward, optimizer and schedule
// steps, zero_grad. Returns the loss.
inline torch::Tensor TrainStep(accel::Accelerator& accelerator,
                               Training& training, const Batch& batch) {
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  ClassifierOutput outputs = model->forward(batch);
  accelerator.backward(outputs.loss);
  optimizer.step();
  lr_scheduler.step();
  optimizer.zero_grad();
  return outputs.loss;
}

// nlp_example's evaluation: argmax predictions, gather_for_metrics, the
// metric over exactly the evaluation set.
inline MetricResult Evaluate(accel::Accelerator& accelerator, Classifier& model,
                             Loader& eval_loader) {
  model->eval();
  Metric metric;
  for (auto& batch : eval_loader) {
    torch::Tensor predictions;
    {
      torch::NoGradGuard no_grad;
      auto autocast = accelerator.autocast();
      predictions = model->forward(batch).logits.argmax(-1);
    }
    auto [all_predictions, references] =
        accelerator.gather_for_metrics({predictions, batch.target});
    metric.add_batch(all_predictions, references);
  }
  return metric.compute();
}

inline MetricResult Evaluate(accel::Accelerator& accelerator,
                             Training& training) {
  return Evaluate(accelerator, std::get<0>(training.prepared),
                  std::get<3>(training.prepared));
}

// Not in the Python scripts: the sum of every parameter's values, printed
// to 9 digits, for the tests to compare runs (a resumed one, say).
inline std::string ParameterChecksum(const Classifier& model) {
  double sum = 0;
  for (const torch::Tensor& parameter : model->parameters()) {
    sum += parameter.detach().to(torch::kDouble).sum().item<double>();
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", sum);
  return text;
}

// For the tests of the memory examples, a machine whose last process has
// room for batches of at most `limit` samples (0: any): above it, that
// process's second step runs out of memory (std::bad_alloc, as LibTorch's
// allocator fails), while the others wait for it in the gradient sync.
inline void SimulateMemoryLimit(const accel::Accelerator& accelerator,
                                int64_t batch_size, int64_t limit,
                                int64_t step) {
  if (limit > 0 && batch_size > limit && step == 1 &&
      accelerator.is_last_process()) {
    throw std::bad_alloc();
  }
}

// accelerator.print(f"epoch {epoch}:", eval_metric)
inline void PrintEpoch(const accel::Accelerator& accelerator, int64_t epoch,
                       const MetricResult& result) {
  accelerator.print("epoch " + std::to_string(epoch) + ":", result.ToString());
}

// nlp_example's epochs (each step in an accumulate scope) with an
// evaluation printed after each, for the scripts whose feature is around
// the loop; batch_size and memory_limit: SimulateMemoryLimit's. Returns the
// last evaluation.
inline MetricResult TrainAndEvaluate(accel::Accelerator& accelerator,
                                     const Config& config, Training& training,
                                     int64_t batch_size = 0,
                                     int64_t memory_limit = 0) {
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  MetricResult result;
  int64_t step = 0;
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    for (auto& batch : train_loader) {
      SimulateMemoryLimit(accelerator, batch_size, memory_limit, step++);
      auto accumulate = accelerator.accumulate(model);
      TrainStep(accelerator, training, batch);
    }
    result = Evaluate(accelerator, training);
    PrintEpoch(accelerator, epoch, result);
  }
  return result;
}

// main(): accel's flags and launch (InitProgram), then `script`, whose
// errors are reported naming the rank.
inline int RunScript(int argc, char** argv, int (*script)(int, char**)) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(script, argc, argv);
}

}  // namespace by_feature
