// Data loading that overlaps training (a benchmark, not a test): samples per
// second of a small training loop whose data set spends a fixed time per
// sample, with the loader's batches made on the training thread
// (num_workers=0) or ahead of it on worker threads, in the same run.
//
//   bazel run -c opt //tools/bench:data_loader
//   bazel run -c opt //tools/bench:data_loader -- --sample_cost_us=1000
//       --workers=0,1,2,4 --repetitions=5   (one line)
//
// A sample "costs" --sample_cost_us of CPU (decoding, augmenting: a busy
// loop on the thread's CPU clock) or, with --sleep, of waiting (reading from
// a slow disk). The ratio
// column is samples/s over those with num_workers=0.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <thread>

#include "accel/accelerator.h"

DEFINE_int32(sample_cost_us, 1000, "Time each sample costs to make, in us.");
DEFINE_bool(sleep, false,
            "Samples cost waiting (sleep) instead of CPU (a busy loop).");
DEFINE_int32(samples, 2048, "Samples per epoch.");
DEFINE_int32(batch_size, 32, "Batch size.");
DEFINE_string(workers, "0,1,2", "num_workers values to measure.");
DEFINE_int32(repetitions, 5, "Epochs timed per num_workers value.");

namespace {

using Clock = std::chrono::steady_clock;

long long ThreadCpuNs() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

class CostlySamples {
 public:
  CostlySamples() {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
    inputs_ = torch::randn({FLAGS_samples, 64}, generator);
    labels_ = torch::randint(0, 4, {FLAGS_samples}, generator, torch::kLong);
  }
  torch::data::Example<> get(size_t i) {
    const auto cost = std::chrono::microseconds(FLAGS_sample_cost_us);
    if (FLAGS_sleep) {
      std::this_thread::sleep_for(cost);
    } else {
      // CPU time, not wall time: a sample whose thread the training step
      // preempts has done less work when the wall clock says 1 ms, as
      // decoding an image would have; counting wall time would charge the
      // loader for the step's CPU.
      const long long until = ThreadCpuNs() + cost.count() * 1000LL;
      while (ThreadCpuNs() < until) {
      }
    }
    return {inputs_[i], labels_[i]};
  }
  size_t size() const { return static_cast<size_t>(FLAGS_samples); }

 private:
  torch::Tensor inputs_, labels_;
};

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::stoi(item));
  return values;
}

struct Row {
  int workers;
  std::vector<double> rates;  // Samples per second, one per epoch.
};

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  accel::AcceleratorOptions options;
  options.backend = "gloo";
  accel::Accelerator accelerator(options);
  torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 4));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  auto [prepared, optimizer] = accelerator.prepare(model, sgd);

  // The rows take turns, epoch by epoch, so that load from elsewhere on the
  // machine falls on all of them alike.
  using Loader = accel::DataLoader<CostlySamples>;
  std::vector<Row> rows;
  std::vector<Loader> loaders;
  for (int workers : ParseList(FLAGS_workers)) {
    accel::DataLoaderOptions loader_options;
    loader_options.batch_size = static_cast<size_t>(FLAGS_batch_size);
    loader_options.shuffle = true;
    loader_options.num_workers = static_cast<size_t>(workers);
    Loader data(CostlySamples(), loader_options);
    loaders.push_back(accelerator.prepare(data));
    rows.push_back({workers, {}});
  }
  for (int epoch = 0; epoch <= FLAGS_repetitions; ++epoch) {
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto start = Clock::now();
      int64_t samples = 0;
      for (auto& batch : loaders[r]) {
        accelerator.backward(torch::nn::functional::cross_entropy(
            prepared->forward(batch.data), batch.target));
        optimizer.step();
        optimizer.zero_grad();
        samples += batch.target.size(0);
      }
      const double seconds =
          std::chrono::duration<double>(Clock::now() - start).count();
      if (epoch > 0) rows[r].rates.push_back(samples / seconds);  // 0: warm-up.
    }
  }
  for (Row& row : rows) std::sort(row.rates.begin(), row.rates.end());

  if (!accelerator.is_main_process()) return 0;
  std::printf(
      "Data loading overlapped with training: %d samples of %d us %s each, "
      "batch %d, %d epochs per row, %ld cores\n",
      FLAGS_samples, FLAGS_sample_cost_us, FLAGS_sleep ? "waiting" : "CPU",
      FLAGS_batch_size, FLAGS_repetitions, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-12s %12s %12s %12s %10s\n", "num_workers", "min", "median",
              "max", "ratio");
  const double base = rows.front().rates[rows.front().rates.size() / 2];
  for (const Row& row : rows) {
    const double median = row.rates[row.rates.size() / 2];
    std::printf("%-12d %10.0f/s %10.0f/s %10.0f/s %9.2fx\n", row.workers,
                row.rates.front(), median, row.rates.back(), median / base);
  }
  std::printf("ratio = median samples/s over the first row's\n");
  return 0;
}
