#include "examples/classifier_loop.h"

#include <stdexcept>
#include <vector>

DEFINE_int32(epochs, 3, "Epochs to train (in total, when resuming).");
DEFINE_int32(batch_size, 32, "Global batch size, split across processes.");
DEFINE_double(lr, 1e-3, "Peak learning rate of AdamW.");
DEFINE_int32(num_warmup_steps, 30, "Linear warmup steps of the schedule.");
DEFINE_int64(seed, 42, "Seed of the weights, the shuffling, augmentation.");
DEFINE_string(output_dir, "example_output",
              "Checkpoints (output_dir/checkpoints), the final weights.");
DEFINE_bool(resume, false, "Continue from the newest checkpoint.");
DEFINE_int32(stop_after_steps, 0,
             "Save and stop after this many optimizer steps of this run; 0 "
             "runs to the end. For trying --resume.");
DEFINE_bool(float64, false, "Train in double precision.");
// accel's flag, with this example's default: a program's default is not
// accel's (accel reads a flag the program owns only when it is given), so
// ExampleAccelerator passes the value on itself.
DEFINE_int32(invariant_micro_batches, 4,
             "Each global batch in this many micro-batches, their gradients "
             "summed in one fixed tree: the same weights, to the bit, at 1, 2 "
             "and 4 processes (accel/parallel/invariant_reduction.h). 0: DDP's "
             "allreduce, as Accelerate sums (float32 then rounds differently "
             "at each process count).");

namespace accel_examples {
namespace {

// F1 of one class from its true positives, false positives and negatives;
// 0 when the class is neither predicted nor present (sklearn's
// zero_division=0).
double ClassF1(int64_t true_positives, int64_t false_positives,
               int64_t false_negatives) {
  const int64_t denominator =
      2 * true_positives + false_positives + false_negatives;
  return denominator == 0 ? 0.0
                          : 2.0 * static_cast<double>(true_positives) /
                                static_cast<double>(denominator);
}

void Require(bool ok, const std::string& name, int64_t value, int64_t least) {
  if (!ok) {
    throw accel::UsageError("--" + name + " must be at least " +
                            std::to_string(least) + ", found " +
                            std::to_string(value));
  }
}

}  // namespace

void SetFlagDefaults(const std::map<std::string, std::string>& defaults) {
  for (const auto& [name, value] : defaults) {
    if (gflags::SetCommandLineOptionWithMode(name.c_str(), value.c_str(),
                                             gflags::SET_FLAGS_DEFAULT)
            .empty()) {
      throw std::logic_error("no flag --" + name + " taking " + value);
    }
  }
}

accel::AcceleratorOptions ExampleAccelerator() {
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.invariant_micro_batches = FLAGS_invariant_micro_batches;
  options.seed = static_cast<uint64_t>(FLAGS_seed);
  options.project_dir = FLAGS_output_dir;
  options.total_limit = 2;
  return options;
}

ExampleOptions FromFlags() {
  Require(FLAGS_epochs >= 0, "epochs", FLAGS_epochs, 0);
  Require(FLAGS_batch_size >= 1, "batch_size", FLAGS_batch_size, 1);
  Require(FLAGS_num_warmup_steps >= 0, "num_warmup_steps",
          FLAGS_num_warmup_steps, 0);
  Require(FLAGS_stop_after_steps >= 0, "stop_after_steps",
          FLAGS_stop_after_steps, 0);
  if (!(FLAGS_lr > 0)) {
    throw accel::UsageError("--lr must be positive, found " +
                            std::to_string(FLAGS_lr));
  }
  if (FLAGS_output_dir.empty()) {
    throw accel::UsageError("--output_dir is empty; name a folder");
  }
  ExampleOptions options;
  options.batch_size = FLAGS_batch_size;
  options.lr = FLAGS_lr;
  options.num_warmup_steps = FLAGS_num_warmup_steps;
  options.seed = static_cast<uint64_t>(FLAGS_seed);
  options.loop.float64 = FLAGS_float64;
  options.output_dir = FLAGS_output_dir;
  options.loop.epochs = FLAGS_epochs;
  options.loop.resume = FLAGS_resume;
  options.loop.stop_after_steps = FLAGS_stop_after_steps;
  return options;
}

accel::DataLoaderOptions TrainLoaderOptions(const ExampleOptions& options) {
  accel::DataLoaderOptions loader;
  loader.batch_size = static_cast<size_t>(options.batch_size);
  loader.split_batches = true;
  loader.shuffle = true;
  loader.drop_last = true;
  loader.seed = options.seed;
  loader.num_workers = options.num_workers;
  return loader;
}

accel::DataLoaderOptions TestLoaderOptions(const ExampleOptions& options) {
  accel::DataLoaderOptions loader = TrainLoaderOptions(options);
  loader.shuffle = false;
  loader.drop_last = false;
  loader.num_workers = 0;
  return loader;
}

EvalResult ClassificationMetrics(const torch::Tensor& predictions,
                                 const torch::Tensor& references,
                                 int64_t classes, F1Average average) {
  const torch::Tensor predicted = predictions.to(torch::kLong).flatten();
  const torch::Tensor expected = references.to(torch::kLong).flatten();
  EvalResult result;
  result.samples = expected.numel();
  if (result.samples == 0) return result;
  result.accuracy = predicted.eq(expected).sum().item<double>() /
                    static_cast<double>(result.samples);
  std::vector<double> f1s;
  for (int64_t c = average == F1Average::kBinary ? 1 : 0; c < classes; ++c) {
    const torch::Tensor is_predicted = predicted.eq(c);
    const torch::Tensor is_expected = expected.eq(c);
    const int64_t true_positives =
        (is_predicted & is_expected).sum().item<int64_t>();
    f1s.push_back(ClassF1(true_positives,
                          is_predicted.sum().item<int64_t>() - true_positives,
                          is_expected.sum().item<int64_t>() - true_positives));
    if (average == F1Average::kBinary) break;
  }
  double sum = 0;
  for (double f1 : f1s) sum += f1;
  result.f1 = sum / static_cast<double>(f1s.size());
  return result;
}

}  // namespace accel_examples
