// save_state / load_state in one process: round trip, and every way a
// checkpoint can be wrong.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <fstream>

#include "accel/accelerator.h"
#include "accel/runtime/errors.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

class Numbers : public torch::data::datasets::Dataset<Numbers> {
 public:
  torch::data::Example<> get(size_t i) override {
    return {torch::full({3}, static_cast<float>(i)),
            torch::tensor(static_cast<int64_t>(i % 2))};
  }
  torch::optional<size_t> size() const override { return 16; }
};

AcceleratorOptions Options(const std::string& project_dir = "") {
  AcceleratorOptions options;
  options.backend = "gloo";
  options.seed = 5;
  options.project_dir = project_dir;
  options.total_limit = 2;
  return options;
}

// A model, optimizer and loader prepared on an Accelerator.
struct TrainingRun {
  explicit TrainingRun(int64_t hidden = 8, const std::string& project_dir = "")
      : accelerator(Options(project_dir)),
        model(torch::nn::Linear(3, hidden), torch::nn::ReLU(),
              torch::nn::Linear(hidden, 2)),
        optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2)),
        data(Numbers(), LoaderOptions()) {
    auto prepared = accelerator.prepare(model, optimizer, data);
    loader = std::make_unique<DataLoader<Numbers>>(std::get<2>(prepared));
  }
  static DataLoaderOptions LoaderOptions() {
    DataLoaderOptions options;
    options.batch_size = 4;
    options.shuffle = true;
    return options;
  }
  void TrainEpoch() {
    for (auto& batch : *loader) {
      accelerator.backward(torch::nn::functional::cross_entropy(
          model->forward(batch.data), batch.target));
      optimizer.step();
      optimizer.zero_grad();
    }
  }
  std::vector<torch::Tensor> Snapshot() {
    std::vector<torch::Tensor> values;
    for (auto& p : model->parameters()) values.push_back(p.detach().clone());
    return values;
  }

  Accelerator accelerator;
  torch::nn::Sequential model;
  torch::optim::AdamW optimizer;
  DataLoader<Numbers> data;
  std::unique_ptr<DataLoader<Numbers>> loader;
};

bool SameValues(const std::vector<torch::Tensor>& a,
                const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

std::string CheckpointErrorOf(TrainingRun& setup, const std::string& dir) {
  try {
    setup.accelerator.load_state(dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "load_state(" << dir << ") did not fail";
  return "";
}

TEST(CheckpointTest, RoundTripRestoresModelOptimizerStepLoaderAndRng) {
  const std::string dir = MakeTempDir("ckpt") + "/state";
  TrainingRun original;
  original.TrainEpoch();
  original.accelerator.save_state(dir);
  const torch::Tensor next_random = torch::rand({4});
  original.TrainEpoch();
  const auto after_two_epochs = original.Snapshot();

  TrainingRun resumed;
  ASSERT_FALSE(SameValues(resumed.Snapshot(), after_two_epochs));
  resumed.accelerator.load_state(dir);
  EXPECT_EQ(resumed.accelerator.step(), 4);
  EXPECT_EQ(resumed.loader->epoch(), 1);
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_random));
  resumed.TrainEpoch();
  // Same model, optimizer moments, data order: bit for bit the same.
  EXPECT_TRUE(SameValues(resumed.Snapshot(), after_two_epochs));
}

TEST(CheckpointTest, SavingAgainReplacesFilesWithoutLeftovers) {
  const std::string dir = MakeTempDir("ckpt") + "/state";
  TrainingRun setup;
  setup.accelerator.save_state(dir);
  setup.TrainEpoch();
  setup.accelerator.save_state(dir);
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  while (dirent* entry = readdir(d)) {
    if (entry->d_name[0] != '.') files.push_back(entry->d_name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"accelerator_state.pt",
                                             "random_states_0.pt"}));
}

TEST(CheckpointTest, MissingFolderOrFileIsNamed) {
  TrainingRun setup;
  EXPECT_THAT(CheckpointErrorOf(setup, "/no/such/checkpoint"),
              HasSubstr("checkpoint folder '/no/such/checkpoint' does not "
                        "exist"));
  const std::string empty = MakeTempDir("empty");
  EXPECT_THAT(CheckpointErrorOf(setup, empty),
              HasSubstr("accelerator_state.pt' is missing"));
}

TEST(CheckpointTest, CorruptOrTruncatedFileIsAClearErrorAndChangesNothing) {
  const std::string dir = MakeTempDir("ckpt") + "/state";
  TrainingRun setup;
  setup.accelerator.save_state(dir);
  const std::string path = dir + "/accelerator_state.pt";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  setup.TrainEpoch();
  const auto before = setup.Snapshot();
  for (const std::string& damaged :
       {bytes.substr(0, bytes.size() / 2), std::string("garbage"),
        std::string(bytes.size(), '\0')}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
    EXPECT_THAT(CheckpointErrorOf(setup, dir),
                HasSubstr("accelerator_state.pt' is corrupt or not an accel "
                          "checkpoint file"));
    EXPECT_TRUE(SameValues(setup.Snapshot(), before));
  }
}

TEST(CheckpointTest, CheckpointOfAnotherModelIsRejectedNamingTheMismatch) {
  const std::string dir = MakeTempDir("ckpt") + "/state";
  {
    TrainingRun wide(/*hidden=*/8);
    wide.accelerator.save_state(dir);
  }
  TrainingRun narrow(/*hidden=*/6);
  const auto before = narrow.Snapshot();
  EXPECT_THAT(CheckpointErrorOf(narrow, dir),
              HasSubstr("model_0 parameter 0.weight is [8, 3] float32 in the "
                        "checkpoint but [6, 3] float32 in the model"));
  EXPECT_TRUE(SameValues(narrow.Snapshot(), before));
}

TEST(CheckpointTest, AutomaticNamingKeepsTheNewestCompleteCheckpoints) {
  const std::string project = MakeTempDir("project");
  const std::string folder = project + "/checkpoints/checkpoint_";
  {
    TrainingRun run(8, project);
    for (int i = 1; i <= 3; ++i) {
      EXPECT_EQ(run.accelerator.save_state(), folder + std::to_string(i));
    }
    EXPECT_FALSE(IsCompleteCheckpoint(folder + "1"));  // Pruned.
    EXPECT_TRUE(IsCompleteCheckpoint(folder + "2"));
    EXPECT_EQ(run.accelerator.latest_checkpoint(), folder + "3");
  }
  // A save killed half-way: rank files only, no accelerator_state.pt.
  ASSERT_EQ(mkdir((folder + "4").c_str(), 0755), 0);
  std::ofstream(folder + "4/random_states_0.pt") << "partial";
  EXPECT_EQ(LatestCheckpoint(project), folder + "3");
  // A new run continues the numbering and resumes from the last good one.
  TrainingRun next(8, project);
  next.accelerator.load_state(next.accelerator.latest_checkpoint());
  EXPECT_EQ(next.accelerator.save_state(), folder + "5");
  EXPECT_EQ(CheckpointIndices(project), (std::vector<int>{3, 5}));
}

TEST(CheckpointTest, AFullDiskFailsTheSaveNamingTheFileAndLeavesNothing) {
  const std::string project = MakeTempDir("full");
  TrainingRun run(64, project);
  const std::string good = run.accelerator.save_state();
  run.TrainEpoch();
  // A file-size limit stands in for a full disk: writes past it fail with
  // EFBIG (SIGXFSZ ignored), as they would with ENOSPC.
  signal(SIGXFSZ, SIG_IGN);
  rlimit original;
  getrlimit(RLIMIT_FSIZE, &original);
  rlimit tiny = original;
  tiny.rlim_cur = 2048;
  setrlimit(RLIMIT_FSIZE, &tiny);
  std::string message;
  try {
    run.accelerator.save_state();
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &original);
  EXPECT_THAT(message, HasSubstr("File too large"));
  EXPECT_THAT(message, HasSubstr(project + "/checkpoints/checkpoint_2/"));
  // Nothing of the failed save is left, and the earlier one still loads.
  EXPECT_EQ(CheckpointIndices(project), (std::vector<int>{1}));
  TrainingRun next(64, project);
  EXPECT_EQ(next.accelerator.load_state(), good);
}

TEST(CheckpointTest, FilesFromAnotherSaveOrSwappedFilesAreRefused) {
  const std::string root = MakeTempDir("mixed");
  TrainingRun first;
  first.accelerator.save_state(root + "/a");
  TrainingRun second;  // Another run id.
  second.TrainEpoch();
  second.accelerator.save_state(root + "/b");
  const auto before = second.Snapshot();
  auto copy = [](const std::string& from, const std::string& to) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream(to, std::ios::binary | std::ios::trunc) << in.rdbuf();
  };
  copy(root + "/a/random_states_0.pt", root + "/b/random_states_0.pt");
  EXPECT_THAT(CheckpointErrorOf(second, root + "/b"),
              HasSubstr("the files come from different saves"));
  copy(root + "/a/accelerator_state.pt", root + "/b/random_states_0.pt");
  EXPECT_THAT(CheckpointErrorOf(second, root + "/b"),
              HasSubstr("holds accelerator_state, expected random_states_0"));
  EXPECT_TRUE(SameValues(second.Snapshot(), before));
}

TEST(CheckpointTest, SaveStateWithoutProjectDirIsAUsageError) {
  TrainingRun run;
  EXPECT_THROW(run.accelerator.save_state(), UsageError);
}

}  // namespace
}  // namespace accel::testing
