// accel-test's checks (self_test.h), each on every rank: the process
// state, the collectives (gather, reduce, broadcast, wait_for_everyone), the
// data loader's sharding and gather_for_metrics, DDP training against one
// process on the global batch, and a save_state / load_state round trip.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "accel/accelerator.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/launch/program.h"
#include "tools/self_test.h"

namespace accel::self_test_internal {
namespace {

constexpr uint64_t kSeed = 20240229;
// The data loader check: 13 samples in batches of 2 leave the last batch
// short on any process count above 1, so even_batches pads it.
constexpr int64_t kSamples = 13;
constexpr size_t kLoaderBatch = 2;
// The training check: a 4-8-1 MLP, 4 rows per process, AdamW.
constexpr int64_t kFeatures = 4;
constexpr int64_t kHidden = 8;
constexpr int64_t kRowsPerProcess = 4;
constexpr int kSteps = 5;
constexpr double kTolerance = 1e-6;

std::string Join(const std::vector<int64_t>& values) {
  std::string text;
  for (const int64_t value : values) {
    text += (text.empty() ? "" : ", ") + std::to_string(value);
  }
  return text;
}

std::vector<int64_t> ToVector(const torch::Tensor& tensor) {
  const torch::Tensor flat = tensor.to(torch::kLong).flatten().contiguous();
  return std::vector<int64_t>(flat.data_ptr<int64_t>(),
                              flat.data_ptr<int64_t>() + flat.numel());
}

std::string Scientific(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1e", value);
  return text;
}

// The index of each sample, as a dataset for accel::DataLoader.
class Indices {
 public:
  torch::Tensor get(size_t index) const {
    return torch::tensor(static_cast<int64_t>(index));
  }
  size_t size() const { return kSamples; }
};

// The training check's model, with the same weights wherever it is built
// (its own generator, whatever the global seed).
torch::nn::Sequential MakeModel() {
  torch::nn::Sequential model(torch::nn::Linear(kFeatures, kHidden),
                              torch::nn::Tanh(), torch::nn::Linear(kHidden, 1));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(kSeed);
  torch::NoGradGuard no_grad;
  for (auto& parameter : model->parameters()) {
    parameter.copy_(torch::randn(parameter.sizes(), generator) * 0.5);
  }
  return model;
}

// Every parameter, flattened into one float32 vector on the CPU.
torch::Tensor Flat(const torch::nn::Module& model) {
  std::vector<torch::Tensor> pieces;
  for (const auto& parameter : model.parameters()) {
    pieces.push_back(parameter.detach().cpu().flatten());
  }
  return torch::cat(pieces);
}

double MaxDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

Outcome SelfTest::ProcessState() {
  const int n = accelerator_.num_processes();
  const int rank = accelerator_.process_index();
  const std::vector<int64_t> ranks =
      accelerator_.gather_object(std::vector<int64_t>{rank});
  const std::vector<int64_t> mains = accelerator_.gather_object(
      std::vector<int64_t>{accelerator_.is_main_process() ? 1 : 0});
  std::vector<int64_t> expected(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
  const bool own_ranks = std::getenv(kOwnRanks) != nullptr;
  const int wanted = own_ranks ? accel::flags::num_processes.value() : n;
  Outcome outcome;
  outcome.found = "ranks " + Join(ranks) + " of " + std::to_string(n) +
                  ", rank 0 the main process" +
                  (own_ranks ? "" : " (started by another launcher)");
  if (n != wanted) {
    outcome.problem = "expected a world size of " + std::to_string(wanted) +
                      " (--num_processes), found " + std::to_string(n);
  } else if (ranks != expected) {
    outcome.problem =
        "expected ranks " + Join(expected) + ", found " + Join(ranks);
  } else if (mains[0] != 1 || std::count(mains.begin(), mains.end(), 1) != 1) {
    outcome.problem =
        "expected rank 0 alone to be the main process, found "
        "is_main_process " +
        Join(mains) + " by rank";
  } else if (own_ranks && accelerator_.local_process_index() != rank) {
    outcome.problem = "expected local rank " + std::to_string(rank) +
                      " on one machine, found " +
                      std::to_string(accelerator_.local_process_index());
  }
  return outcome;
}

// Rank r holds [10r, 10r + 1]; everyone gets them all in rank order.
Outcome SelfTest::Gather() {
  const int n = accelerator_.num_processes();
  const int64_t rank = accelerator_.process_index();
  const torch::Tensor mine =
      torch::tensor({10 * rank, 10 * rank + 1}).to(accelerator_.device());
  const std::vector<int64_t> found = ToVector(accelerator_.gather(mine).cpu());
  std::vector<int64_t> expected;
  for (int64_t r = 0; r < n; ++r) {
    expected.push_back(10 * r);
    expected.push_back(10 * r + 1);
  }
  const std::vector<std::string> names = accelerator_.gather_object(
      std::vector<std::string>{"rank " + std::to_string(rank)});
  Outcome outcome;
  outcome.found = "[" + Join(found) + "] and " + std::to_string(names.size()) +
                  " strings (gather_object) on every rank";
  if (found != expected) {
    outcome.problem =
        "expected [" + Join(expected) + "], found [" + Join(found) + "]";
  } else if (names.size() != static_cast<size_t>(n) ||
             names.back() != "rank " + std::to_string(n - 1)) {
    outcome.problem = "expected gather_object to give 'rank 0' to 'rank " +
                      std::to_string(n - 1) + "', found " +
                      std::to_string(names.size()) + " strings, the last '" +
                      (names.empty() ? "" : names.back()) + "'";
  }
  return outcome;
}

// Rank r holds r + 1: the sum is n(n + 1)/2, the mean (n + 1)/2.
Outcome SelfTest::Reduce() {
  const double n = accelerator_.num_processes();
  const torch::Tensor mine =
      torch::full({2}, accelerator_.process_index() + 1.0, torch::kFloat64)
          .to(accelerator_.device());
  const double sum = accelerator_.reduce(mine, "sum")[1].item<double>();
  const double mean = accelerator_.reduce(mine, "mean")[1].item<double>();
  const double expected_sum = n * (n + 1) / 2;
  const double expected_mean = (n + 1) / 2;
  Outcome outcome;
  char text[160];
  std::snprintf(text, sizeof(text), "sum %g, mean %g", sum, mean);
  outcome.found = text;
  if (sum != expected_sum || mean != expected_mean) {
    std::snprintf(text, sizeof(text),
                  "expected sum %g and mean %g, found %g and %g", expected_sum,
                  expected_mean, sum, mean);
    outcome.problem = text;
  }
  return outcome;
}

// The main process's [100, 101, 102] replaces every other rank's zeros.
Outcome SelfTest::Broadcast() {
  const torch::Tensor mine =
      (accelerator_.is_main_process() ? torch::arange(100, 103)
                                      : torch::zeros({3}, torch::kLong))
          .to(accelerator_.device());
  const std::vector<int64_t> found =
      ToVector(accelerator_.broadcast(mine).cpu());
  const std::vector<int64_t> expected = {100, 101, 102};
  Outcome outcome;
  outcome.found = "[" + Join(found) + "] from rank 0 on every rank";
  if (found != expected) {
    outcome.problem =
        "expected [" + Join(expected) + "], found [" + Join(found) + "]";
  }
  return outcome;
}

// Each rank leaves a marker before the barrier, the last one late; after
// it, every rank must see them all.
Outcome SelfTest::WaitForEveryone() {
  const int n = accelerator_.num_processes();
  if (accelerator_.is_last_process() && n > 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  accel::WriteFileAtomically(folder_.path() + "/marker_" +
                                 std::to_string(accelerator_.process_index()),
                             "here\n");
  accelerator_.wait_for_everyone();
  int seen = 0;
  for (int rank = 0; rank < n; ++rank) {
    seen += accel::IsFile(folder_.path() + "/marker_" + std::to_string(rank));
  }
  accelerator_.wait_for_everyone();  // All have looked: remove them.
  std::remove((folder_.path() + "/marker_" +
               std::to_string(accelerator_.process_index()))
                  .c_str());
  Outcome outcome;
  outcome.found =
      "every rank saw the " + std::to_string(n) + " ranks' markers after it";
  if (seen != n) {
    outcome.problem = "expected " + std::to_string(n) +
                      " ranks' markers after the barrier, found " +
                      std::to_string(seen);
  }
  return outcome;
}

// One epoch of 13 shuffled samples in batches of 2 per process: the
// ranks' batches are as many, together hold every sample (even_batches
// repeats a few to fill the last ones), and gather_for_metrics gives each
// sample exactly once.
void SelfTest::DataLoaderChecks() {
  accel::DataLoaderOptions options;
  options.batch_size = kLoaderBatch;
  options.shuffle = true;
  options.seed = kSeed;
  auto loader = accelerator_.prepare_data_loader(
      accel::DataLoader<Indices>(Indices(), options));
  std::vector<int64_t> local;
  std::vector<int64_t> for_metrics;
  std::vector<int64_t> gathered;
  for (auto& batch : loader) {
    const std::vector<int64_t> ids = ToVector(batch.cpu());
    local.insert(local.end(), ids.begin(), ids.end());
    const std::vector<int64_t> all = ToVector(accelerator_.gather(batch).cpu());
    gathered.insert(gathered.end(), all.begin(), all.end());
    const std::vector<int64_t> once =
        ToVector(accelerator_.gather_for_metrics(batch).cpu());
    for_metrics.insert(for_metrics.end(), once.begin(), once.end());
  }
  const int64_t n = accelerator_.num_processes();
  const int64_t per_batch = static_cast<int64_t>(kLoaderBatch) * n;
  const int64_t batches = (kSamples + per_batch - 1) / per_batch;
  Check("data loader sharding", [&] {
    Outcome outcome;
    const std::vector<int64_t> counts = accelerator_.gather_object(
        std::vector<int64_t>{static_cast<int64_t>(local.size())});
    std::vector<int64_t> times(kSamples, 0);
    bool in_range = true;
    for (const int64_t id : gathered) {
      if (id < 0 || id >= kSamples) {
        in_range = false;
      } else {
        ++times[static_cast<size_t>(id)];
      }
    }
    const int64_t missing = std::count(times.begin(), times.end(), 0);
    const int64_t repeats = static_cast<int64_t>(gathered.size()) - kSamples;
    outcome.found = std::to_string(kSamples) + " samples over " +
                    std::to_string(n) + " rank(s), " + std::to_string(batches) +
                    " batches each, " + std::to_string(repeats) +
                    " repeated to even the last batch";
    // Accelerate's even_batches: each rank gets ceil(13 / (2n)) batches,
    // only the last one possibly short when n is 1.
    const int64_t expected_local =
        n == 1 ? kSamples : batches * static_cast<int64_t>(kLoaderBatch);
    for (size_t rank = 0; rank < counts.size(); ++rank) {
      if (counts[rank] != expected_local) {
        outcome.problem = "expected " + std::to_string(expected_local) +
                          " samples on every rank, found " + Join(counts) +
                          " by rank";
        return outcome;
      }
    }
    if (!in_range || missing != 0) {
      outcome.problem = "expected every sample 0-" +
                        std::to_string(kSamples - 1) + " on some rank, found " +
                        std::to_string(missing) + " missing" +
                        (in_range ? "" : " and ids outside");
    } else if (repeats != expected_local * n - kSamples) {
      outcome.problem = "expected " +
                        std::to_string(expected_local * n - kSamples) +
                        " repeated samples, found " + std::to_string(repeats);
    }
    return outcome;
  });
  Check("gather_for_metrics", [&] {
    Outcome outcome;
    std::vector<int64_t> sorted = for_metrics;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> expected(kSamples);
    for (int64_t i = 0; i < kSamples; ++i) {
      expected[static_cast<size_t>(i)] = i;
    }
    outcome.found = "each of the " + std::to_string(kSamples) +
                    " samples exactly once (gather gave " +
                    std::to_string(gathered.size()) + ")";
    if (sorted != expected) {
      outcome.problem = "expected samples 0-" + std::to_string(kSamples - 1) +
                        " once each, found [" + Join(sorted) + "]";
    }
    return outcome;
  });
}

// A few AdamW steps with DDP, each rank on its rows of the global batch,
// against the same steps by one model on the whole batch; then a
// save_state / load_state round trip.
void SelfTest::TrainingChecks() {
  const int64_t n = accelerator_.num_processes();
  const int64_t rank = accelerator_.process_index();
  const int64_t rows = kRowsPerProcess * n;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(kSeed + 1);
  // One more batch than the training steps: the round trip's step.
  const torch::Tensor inputs =
      torch::randn({kSteps + 1, rows, kFeatures}, generator);
  const torch::Tensor targets = torch::randn({kSteps + 1, rows, 1}, generator);
  const auto options = torch::optim::AdamWOptions(0.01);

  torch::nn::Sequential reference = MakeModel();
  torch::optim::AdamW reference_optimizer(reference->parameters(), options);
  for (int step = 0; step < kSteps; ++step) {
    torch::Tensor loss = torch::nn::functional::mse_loss(
        reference->forward(inputs[step]), targets[step]);
    loss.backward();
    reference_optimizer.step();
    reference_optimizer.zero_grad();
  }

  torch::nn::Sequential model = MakeModel();
  torch::optim::AdamW optimizer(model->parameters(), options);
  auto [prepared, prepared_optimizer] = accelerator_.prepare(model, optimizer);
  const auto train_step = [&, &prepared = prepared,
                           &prepared_optimizer = prepared_optimizer](int step) {
    const auto mine = torch::indexing::Slice(rank * kRowsPerProcess,
                                             (rank + 1) * kRowsPerProcess);
    torch::Tensor loss = torch::nn::functional::mse_loss(
        prepared->forward(inputs[step].index({mine}).to(accelerator_.device())),
        targets[step].index({mine}).to(accelerator_.device()));
    accelerator_.backward(loss);
    prepared_optimizer.step();
    prepared_optimizer.zero_grad();
  };
  for (int step = 0; step < kSteps; ++step) train_step(step);
  const torch::Tensor trained = Flat(*prepared);

  Check("DDP: same parameters on every rank", [&] {
    const torch::Tensor all =
        accelerator_.gather(trained.unsqueeze(0).to(accelerator_.device()))
            .cpu();
    Outcome outcome;
    outcome.found = std::to_string(trained.numel()) + " parameters after " +
                    std::to_string(kSteps) + " AdamW steps, bit for bit";
    for (int64_t r = 1; r < all.size(0); ++r) {
      if (!all[r].equal(all[0])) {
        outcome.problem = "expected rank " + std::to_string(r) +
                          "'s parameters to equal rank 0's, found max "
                          "|difference| " +
                          Scientific(MaxDifference(all[r], all[0]));
        break;
      }
    }
    return outcome;
  });
  Check("DDP: equal to one process on the global batch", [&] {
    const double difference = MaxDifference(trained, Flat(*reference));
    Outcome outcome;
    outcome.found = "max |difference| " + Scientific(difference) +
                    " (at most " + Scientific(kTolerance) + ") over " +
                    std::to_string(rows) + " rows per step";
    if (!(difference <= kTolerance)) {
      outcome.problem =
          "expected the parameters within " + Scientific(kTolerance) +
          " of one process's, found max |difference| " + Scientific(difference);
    }
    return outcome;
  });
  Check("save_state/load_state", [&] {
    const std::string checkpoint = folder_.path() + "/checkpoint";
    accelerator_.save_state(checkpoint);
    const torch::Tensor saved = Flat(*prepared);
    train_step(kSteps);
    const torch::Tensor stepped = Flat(*prepared);
    accelerator_.load_state(checkpoint);
    const torch::Tensor restored = Flat(*prepared);
    train_step(kSteps);
    const torch::Tensor again = Flat(*prepared);
    accelerator_.wait_for_everyone();  // No rank reads the folder now.
    std::vector<std::string> kept;
    if (accelerator_.is_main_process()) kept = folder_.Remove();
    Outcome outcome;
    outcome.found =
        "parameters restored and the next step repeated bit for bit; " +
        folder_.path() + " removed";
    if (stepped.equal(saved)) {
      outcome.problem =
          "expected the step after save_state to change the "
          "parameters, found them unchanged";
    } else if (!restored.equal(saved)) {
      outcome.problem =
          "expected load_state to restore the saved "
          "parameters, found max |difference| " +
          Scientific(MaxDifference(restored, saved));
    } else if (!again.equal(stepped)) {
      outcome.problem =
          "expected the step after load_state to repeat the "
          "one after save_state (optimizer state restored), "
          "found max |difference| " +
          Scientific(MaxDifference(again, stepped));
    } else if (accelerator_.is_main_process() &&
               (!kept.empty() || access(folder_.path().c_str(), F_OK) == 0)) {
      outcome.problem = "expected " + folder_.path() +
                        " removed, found it still there (" +
                        std::to_string(kept.size()) + " entries kept)";
    }
    return outcome;
  });
}

}  // namespace accel::self_test_internal
