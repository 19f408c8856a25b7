// The checkpoint loader against damaged checkpoints: random byte flips,
// truncations, appended bytes, and files swapped within a checkpoint or
// taken from another save. Every case must either load the values of one
// consistent save exactly or raise CheckpointError and change nothing:
// never crash, never another exception type, never silently different
// values.
//
// ACCEL_FUZZ_CASES (default 300) sets the number of cases; by hand:
//   bazel test //tests:checkpoint_fuzz_test --test_env=ACCEL_FUZZ_CASES=5000
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "accel/checkpoint/checkpoint.h"
#include "accel/runtime/base/errors.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

constexpr int kRanks = 2;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A model, optimizer, scheduler, loader position and RNG: everything a
// checkpoint restores, with a fingerprint of all of it.
struct Training {
  torch::nn::Sequential model{torch::nn::Linear(5, 7), torch::nn::ReLU(),
                              torch::nn::Linear(7, 2)};
  torch::optim::AdamW optimizer{model->parameters(),
                                torch::optim::AdamWOptions(0.01)};
  std::shared_ptr<LRScheduler> scheduler =
      get_linear_schedule_with_warmup(optimizer, 3, 30);
  std::shared_ptr<DataLoaderState> loader = std::make_shared<DataLoaderState>();
  CheckpointContents contents;

  explicit Training(const std::string& run_id) {
    contents.models = {model.ptr()};
    contents.optimizers = {&optimizer};
    contents.schedulers = {scheduler};
    contents.loaders = {loader};
    contents.run_id = run_id;
  }
  void Step() {
    model->forward(torch::randn({4, 5})).pow(2).sum().backward();
    optimizer.step();
    optimizer.zero_grad();
    scheduler->step();
    ++contents.step;
    ++loader->epoch;
  }
  // Parameters, schedule, loader position and step.
  std::string Fingerprint() {
    std::ostringstream out;
    for (const auto& p : model->parameters()) {
      torch::Tensor t = p.detach().contiguous();
      out.write(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
    out << scheduler->last_epoch() << ";";
    for (double lr : scheduler->get_last_lr()) out << lr << ";";
    out << loader->Checkpoint().first << "/" << loader->Checkpoint().second
        << "/" << contents.step;
    return out.str();
  }
  // The optimizer's state shows in its next step: the parameters after one
  // step on a fixed batch (changes the training).
  std::string Probe() {
    model->forward(torch::ones({2, 5})).sum().backward();
    optimizer.step();
    optimizer.zero_grad();
    return Fingerprint();
  }
};

// Saves rank 0's (shared and own) and rank 1's files into `dir`; returns the
// fingerprint of what was saved.
std::string Save(Training& training, const std::string& dir) {
  const std::string fingerprint = training.Fingerprint();
  for (int rank = kRanks - 1; rank >= 0; --rank) {
    SaveCheckpoint(dir, rank, kRanks, rank == 0, training.contents);
  }
  return fingerprint;
}

TEST(CheckpointFuzzTest, DamagedCheckpointsFailCleanlyOrLoadExactly) {
  const char* cases_text = std::getenv("ACCEL_FUZZ_CASES");
  const int cases = cases_text ? std::atoi(cases_text) : 300;
  const std::string root = MakeTempDir("fuzz");
  torch::manual_seed(1);
  Training original("run-a");
  original.Step();
  const std::string older = Save(original, root + "/older");  // Step 1.
  original.Step();
  const std::string saved = Save(original, root + "/saved");  // Step 2.
  Training other_run("run-b");
  other_run.Step();
  other_run.Step();
  Save(other_run, root + "/other");

  const std::vector<std::string> files = {
      "accelerator_state.pt", "random_states_0.pt", "random_states_1.pt"};
  std::map<std::string, std::string> pristine;
  for (const auto& f : files) pristine[f] = ReadFile(root + "/saved/" + f);
  // What an intact load gives, optimizer included.
  std::string saved_probe;
  {
    Training intact("run-c");
    LoadCheckpoint(root + "/saved", 0, kRanks, intact.contents);
    ASSERT_EQ(intact.Fingerprint(), saved);
    saved_probe = intact.Probe();
  }

  std::mt19937 random(20261201);
  int rejected = 0, loaded_intact = 0, other_errors = 0, silently_different = 0;
  std::map<std::string, int> kinds;
  for (int i = 0; i < cases; ++i) {
    const std::string dir = root + "/case";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    for (const auto& f : files) WriteFile(dir + "/" + f, pristine[f]);
    const std::string& target = files[random() % files.size()];
    std::string bytes = pristine[target];
    std::string kind;
    switch (random() % 7) {
      case 0:
      case 1: {  // Flip one byte.
        kind = "byte flip";
        bytes[random() % bytes.size()] ^= static_cast<char>(1 + random() % 255);
        break;
      }
      case 2:  // Truncate.
        kind = "truncation";
        bytes.resize(random() % bytes.size());
        break;
      case 3:  // Appended bytes.
        kind = "appended bytes";
        bytes += std::string(1 + random() % 64, static_cast<char>(random()));
        break;
      case 4: {  // Another file of the same checkpoint.
        kind = "swapped file";
        bytes = pristine[files[(&target - files.data() + 1 + random() % 2) %
                               files.size()]];
        break;
      }
      case 5:  // Untouched: proves that loading works at all.
        kind = "untouched";
        break;
      default: {  // The same file of an older save or of another run.
        kind = "file of another save";
        bytes =
            ReadFile(root + (random() % 2 ? "/older/" : "/other/") + target);
        break;
      }
    }
    WriteFile(dir + "/" + target, bytes);
    ++kinds[kind];

    Training fresh("run-c");
    torch::manual_seed(1000 + i);
    const std::string before = fresh.Fingerprint();
    const int rank = target == "random_states_1.pt" ? 1 : 0;
    try {
      LoadCheckpoint(dir, rank, kRanks, fresh.contents);
      if (fresh.Fingerprint() == saved && fresh.Probe() == saved_probe) {
        ++loaded_intact;
      } else {
        ++silently_different;
        ADD_FAILURE() << "case " << i << " (" << kind << " of " << target
                      << ") loaded different values";
      }
    } catch (const CheckpointError&) {
      ++rejected;
      if (fresh.Fingerprint() != before) {
        ++silently_different;
        ADD_FAILURE() << "case " << i << " (" << kind << " of " << target
                      << ") failed but changed the training state";
      }
    } catch (const std::exception& e) {
      ++other_errors;
      ADD_FAILURE() << "case " << i << " (" << kind << " of " << target
                    << "): not a CheckpointError: " << e.what();
    }
  }
  std::string mix;
  for (const auto& [kind, count] : kinds) {
    mix += (mix.empty() ? "" : ", ") + kind + " " + std::to_string(count);
  }
  std::printf(
      "checkpoint fuzz: %d cases (%s): %d rejected with CheckpointError, %d "
      "loaded intact, %d other "
      "errors, %d silently different, 0 aborts\n",
      cases, mix.c_str(), rejected, loaded_intact, other_errors,
      silently_different);
  EXPECT_EQ(other_errors, 0);
  EXPECT_EQ(silently_different, 0);
  EXPECT_EQ(loaded_intact, kinds["untouched"]);
  EXPECT_EQ(rejected, cases - kinds["untouched"]);
  (void)older;
}

}  // namespace
}  // namespace accel::testing
