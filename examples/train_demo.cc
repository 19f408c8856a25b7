// The seed's training demo: a small classifier trained data-parallel on one
// process or many, with the same results up to float rounding (each rank
// averages its share of the batch, then the shares are averaged) for any
// process count that divides the data (the global batch is split).
//
//   bazel run //examples:train_demo -- --num_processes=2
//   bazel run //examples:train_demo -- --resume_from=trained_model --epochs=4
//   bazel run //examples:train_demo -- --report_to=all   # loss, accuracy,
//       # learning rate and samples/s of every step in trained_model/train_demo
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"
#include "examples/progress_bar.h"

DEFINE_int32(epochs, 3, "Epochs to train (in total, when resuming).");
DEFINE_int64(seed, 42, "Seed of the data, the weights and the shuffling.");
DEFINE_int32(batch_size, 8, "Global batch size, split across processes.");
DEFINE_int64(hidden, 32, "Width of the hidden layer.");
DEFINE_string(output_dir, "trained_model", "Where save_state writes.");
DEFINE_string(resume_from, "", "A checkpoint folder to continue from.");
DEFINE_bool(resume, false,
            "Continue from the newest complete checkpoint in "
            "<output_dir>/checkpoints, if there is one (after a crash, or "
            "with the launcher's --max_restarts).");
DEFINE_int32(total_limit, 2,
             "Per-epoch checkpoints to keep in <output_dir>/checkpoints.");
DEFINE_int32(sleep_per_step_ms, 0,
             "Sleep after each step (to make runs long enough to interrupt "
             "in tests and tools/soak.sh).");
DEFINE_bool(progress, true, "Show a progress bar on the local main process.");

namespace {

constexpr int64_t kSamples = 64;
constexpr int64_t kFeatures = 10;
constexpr int64_t kClasses = 2;

// 64 random samples with random labels, the same on every rank.
class RandomDataset : public torch::data::datasets::Dataset<RandomDataset> {
 public:
  explicit RandomDataset(uint64_t seed) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    inputs_ = torch::randn({kSamples, kFeatures}, generator);
    labels_ = torch::randint(0, kClasses, {kSamples}, generator, torch::kLong);
  }
  torch::data::Example<> get(size_t index) override {
    return {inputs_[index], labels_[index]};
  }
  torch::optional<size_t> size() const override { return kSamples; }

 private:
  torch::Tensor inputs_;
  torch::Tensor labels_;
};

// FNV-1a over the bytes of every parameter.
uint64_t Fingerprint(const std::vector<torch::Tensor>& parameters) {
  uint64_t hash = 1469598103934665603ull;
  for (const auto& parameter : parameters) {
    torch::Tensor data = parameter.detach().cpu().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(data.data_ptr());
    for (int64_t i = 0; i < data.numel() * data.element_size(); ++i) {
      hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
  }
  return hash;
}

double ParameterNorm(const std::vector<torch::Tensor>& parameters) {
  double squares = 0;
  for (const auto& parameter : parameters) {
    squares +=
        parameter.detach().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  return std::sqrt(squares);
}

// The epoch's accuracy so far, saved with the checkpoints: a run resumed in
// the middle of an epoch (after preemption) reports the whole epoch's.
struct EpochTotals {
  int64_t correct = 0;
  int64_t total = 0;
  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("correct", c10::IValue(correct));
    archive.write("total", c10::IValue(total));
  }
  void load(torch::serialize::InputArchive& archive) {
    c10::IValue value;
    archive.read("correct", value);
    correct = value.toInt();
    archive.read("total", value);
    total = value.toInt();
  }
};

// Every rank checks the flags before anything starts.
void CheckFlags() {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw accel::UsageError(message);
  };
  require(FLAGS_epochs >= 0, "--epochs must not be negative, found " +
                                 std::to_string(FLAGS_epochs));
  require(FLAGS_batch_size >= 1, "--batch_size must be at least 1, found " +
                                     std::to_string(FLAGS_batch_size));
  require(FLAGS_hidden >= 1,
          "--hidden must be at least 1, found " + std::to_string(FLAGS_hidden));
  require(FLAGS_total_limit >= 0, "--total_limit must not be negative, found " +
                                      std::to_string(FLAGS_total_limit));
  require(FLAGS_sleep_per_step_ms >= 0,
          "--sleep_per_step_ms must not be negative, found " +
              std::to_string(FLAGS_sleep_per_step_ms));
  require(!FLAGS_output_dir.empty(),
          "--output_dir is empty; name the folder for checkpoints");
}

int Main(int argc, char** argv) {
  CheckFlags();
  const auto start = std::chrono::steady_clock::now();
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.seed = static_cast<uint64_t>(FLAGS_seed);
  options.project_dir = FLAGS_output_dir;
  options.total_limit = FLAGS_total_limit;
  accel::Accelerator accelerator(options);
  if (FLAGS_batch_size % accelerator.num_processes() != 0) {
    throw accel::UsageError(
        "--batch_size (" + std::to_string(FLAGS_batch_size) +
        ") must be a multiple of the number of processes (" +
        std::to_string(accelerator.num_processes()) +
        "): train_demo splits each global batch across them; pass "
        "--batch_size=" +
        std::to_string((FLAGS_batch_size / accelerator.num_processes() + 1) *
                       accelerator.num_processes()) +
        " or another --num_processes");
  }

  torch::nn::Sequential model(torch::nn::Linear(kFeatures, FLAGS_hidden),
                              torch::nn::ReLU(),
                              torch::nn::Linear(FLAGS_hidden, kClasses));
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(3e-4));
  accel::DataLoaderOptions loader_options;
  loader_options.batch_size = FLAGS_batch_size;
  loader_options.split_batches = true;
  loader_options.shuffle = true;
  loader_options.seed = *options.seed;
  accel::DataLoader<RandomDataset> data(RandomDataset(*options.seed),
                                        loader_options);

  auto [prepared_model, prepared_optimizer, loader] =
      accelerator.prepare(model, optimizer, data);
  EpochTotals totals;
  accelerator.register_for_checkpointing(totals);
  std::string resumed = FLAGS_resume_from;
  if (!resumed.empty()) {
    accelerator.load_state(resumed);
  } else if (FLAGS_resume) {
    resumed = accelerator.load_state();  // "" when there is none yet.
  }
  if (!resumed.empty()) {
    accelerator.print("Resumed from", resumed, "in epoch", loader.epoch() + 1);
  }

  accelerator.init_trackers("train_demo", {{"lr", 3e-4},
                                           {"epochs", FLAGS_epochs},
                                           {"batch_size", FLAGS_batch_size},
                                           {"hidden", FLAGS_hidden},
                                           {"seed", FLAGS_seed}});
  const bool show_progress =
      FLAGS_progress && accelerator.is_local_main_process();
  examples::ProgressBar progress(stderr);
  // The epoch's accuracy, reported once its last batch is done.
  auto finish_epoch = [&](int epoch) {
    accelerator.wait_for_everyone();
    accelerator.log({{"epoch_accuracy", static_cast<double>(totals.correct) /
                                            static_cast<double>(totals.total)}},
                    accelerator.step());
    if (accelerator.is_main_process()) {
      std::printf("Epoch %d - Accuracy: %.4f\n", epoch + 1,
                  static_cast<double>(totals.correct) /
                      static_cast<double>(totals.total));
      std::fflush(stdout);
    }
    totals.correct = 0;
    totals.total = 0;
  };
  for (int epoch = static_cast<int>(loader.epoch()); epoch < FLAGS_epochs;
       ++epoch) {
    int64_t& correct = totals.correct;
    int64_t& total = totals.total;
    size_t step = 0;  // Of this pass: a resumed epoch's are fewer.
    const auto epoch_start = std::chrono::steady_clock::now();
    auto step_start = epoch_start;
    for (auto& batch : loader) {
      torch::Tensor outputs = prepared_model->forward(batch.data);
      torch::Tensor loss =
          torch::nn::functional::cross_entropy(outputs, batch.target);
      accelerator.backward(loss);
      prepared_optimizer.step();
      prepared_optimizer.zero_grad();
      torch::Tensor predictions = accelerator.gather(outputs.argmax(-1));
      torch::Tensor labels = accelerator.gather(batch.target);
      const int64_t batch_correct =
          predictions.eq(labels).sum().item<int64_t>();
      correct += batch_correct;
      total += labels.numel();
      ++step;
      const auto now = std::chrono::steady_clock::now();
      // Over the gathered (global) batch; the loss is the main process's.
      accelerator.log(
          {{"loss", loss.item<double>()},
           {"accuracy", static_cast<double>(batch_correct) / labels.numel()},
           {"learning_rate",
            prepared_optimizer.param_groups()[0].options().get_lr()},
           {"samples_per_second",
            labels.numel() /
                std::max(
                    std::chrono::duration<double>(now - step_start).count(),
                    1e-9)},
           {"epoch", epoch}},
          accelerator.step());
      step_start = now;
      if (FLAGS_sleep_per_step_ms > 0) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(FLAGS_sleep_per_step_ms));
      }
      if (show_progress) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                          epoch_start)
                .count();
        char text[64];
        std::snprintf(text, sizeof(text), "loss %.4f %.1f it/s",
                      loss.item<double>(), step / std::max(seconds, 1e-9));
        progress.Update("Epoch " + std::to_string(epoch + 1) + "/" +
                            std::to_string(FLAGS_epochs),
                        loader.size() - loader.batches_remaining(),
                        loader.size(), text);
      }
      // A cluster's warning before it kills the job (SIGTERM, SLURM's
      // --signal=USR1@60): every rank saves at this step and leaves, and
      // --resume continues bit for bit.
      if (accelerator.check_preemption()) {
        // At the epoch's last batch the checkpoint records the next epoch
        // (the loader is done with this one): report this one first, or
        // the resumed run would never print it and would count it into
        // the next.
        if (loader.batches_remaining() == 0) finish_epoch(epoch);
        const std::string saved = accelerator.save_state();
        if (show_progress) progress.Break();
        accelerator.print("Preempted by",
                          accel::SignalName(accelerator.preemption_signal()),
                          "in epoch", epoch + 1, "- saved", saved,
                          "(continue with --resume)");
        accelerator.end_training();
        return accel::kPreemptedExitCode;
      }
    }
    finish_epoch(epoch);
    // Every rank saves (its own RNG file); the newest --total_limit stay.
    accelerator.save_state();
  }
  accelerator.wait_for_everyone();
  // Every rank: each saves its own random state, so that --resume_from can
  // continue at any number of processes (under --zero_stage >= 1 only at
  // this one: the optimizer state is sharded; see docs/parallelism.md).
  accelerator.save_state(FLAGS_output_dir);
  // On every rank: under --zero_stage=3 it gathers the sharded parameters
  // unit by unit, and the main process gets them.
  const std::map<std::string, torch::Tensor> weights =
      accelerator.get_state_dict(prepared_model);
  if (accelerator.is_main_process()) {
    std::vector<torch::Tensor> parameters;  // In the model's order.
    for (const auto& parameter : prepared_model->named_parameters()) {
      parameters.push_back(weights.at(parameter.key()));
    }
    // Lets runs be compared bit for bit, e.g. a resumed run with an
    // uninterrupted one.
    std::printf("Parameter fingerprint: %016llx\n",
                static_cast<unsigned long long>(Fingerprint(parameters)));
    // Comparable where bits are not: machines that sum gradients in another
    // order (tests/cluster).
    std::printf("Parameter norm: %.6e\n", ParameterNorm(parameters));
    std::printf(
        "Trained in %.2f s on %d process(es) (%s); saved the training state "
        "to %s\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count(),
        accelerator.num_processes(), accelerator.backend().c_str(),
        FLAGS_output_dir.c_str());
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
