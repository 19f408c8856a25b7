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
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <fstream>

#include "accel/accelerator.h"
#include "accel/checkpoint/checkpoint_folders.h"
#include "accel/runtime/base/errors.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class Numbers : public torch::data::datasets::Dataset<Numbers> {
 public:
  torch::data::Example<> get(size_t i) override {
    return {torch::full({3}, static_cast<float>(i)),
            torch::tensor(static_cast<int64_t>(i % 2))};
  }
  torch::optional<size_t> size() const override { return 16; }
};

AcceleratorOptions TestOptions(const std::string& project_dir = "") {
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
      : accelerator(TestOptions(project_dir)),
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
  // One process writes accel's sharded format too (one shard file and its
  // index), so that a ZeRO job at any count can resume from it.
  EXPECT_EQ(files, (std::vector<std::string>{"accelerator_state.pt",
                                             "random_states_0.pt",
                                             "rank-00000-of-00001.safetensors",
                                             "sharded_state.index.json"}));
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
              HasSubstr("hold model_0/0.weight of shape [8, 3], but this "
                        "program's is [6, 3]"));
  EXPECT_TRUE(SameValues(narrow.Snapshot(), before));
}

// A layer renamed since the save: the error names what the checkpoint
// holds in its place (the trial saw only the new name).
TEST(CheckpointTest, ARenamedLayerIsNamedWithWhatTheCheckpointHolds) {
  const std::string dir = MakeTempDir("ckpt") + "/state";
  struct Net : torch::nn::Module {
    explicit Net(const std::string& layer) {
      block = register_module("block", std::make_shared<torch::nn::Module>());
      block->register_module(layer, torch::nn::Linear(3, 2));
    }
    std::shared_ptr<torch::nn::Module> block;
  };
  const auto train = [&](const std::string& layer, bool load) {
    Accelerator accelerator(TestOptions(""));
    auto net = std::make_shared<Net>(layer);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    accelerator.prepare(net, sgd);
    if (!load) {
      accelerator.save_state(dir);
      return std::string("saved");
    }
    try {
      accelerator.load_state(dir);
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  train("fc1", false);
  EXPECT_THAT(train("fc_in", true),
              HasSubstr("hold no model_0/block.fc_in.weight: the model changed "
                        "since the save (the checkpoint holds beside it: "
                        "model_0/block.fc1.bias, model_0/block.fc1.weight)"));
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
  EXPECT_EQ(CheckpointIndices(project), (std::vector<int64_t>{3, 5}));
}

// Saves an optimizer whose param groups' options `change` altered after
// construction (as a schedule or the program does), loads the checkpoint
// into one built as the first was, and returns both options of group 0.
template <typename Optimizer, typename Options, typename Change>
std::pair<Options, Options> OptionsAfterResume(const Options& built,
                                               Change change) {
  const std::string dir = MakeTempDir("options") + "/state";
  torch::nn::Linear net(3, 2);
  Optimizer optimizer(net->parameters(), built);
  {
    Accelerator accelerator(TestOptions());
    auto [model, prepared] = accelerator.prepare(net, optimizer);
    auto& options =
        static_cast<Options&>(optimizer.param_groups()[0].options());
    change(options);
    accelerator.save_state(dir);
  }
  torch::nn::Linear other(3, 2);
  Optimizer resumed(other->parameters(), built);
  Accelerator accelerator(TestOptions());
  auto [model, prepared] = accelerator.prepare(other, resumed);
  accelerator.load_state(dir);
  return {static_cast<Options&>(optimizer.param_groups()[0].options()),
          static_cast<Options&>(resumed.param_groups()[0].options())};
}

TEST(CheckpointTest, LoadStateRestoresEveryOptionOfEveryParamGroup) {
  namespace optim = torch::optim;
  {
    auto [saved, loaded] = OptionsAfterResume<
        optim::AdamW>(optim::AdamWOptions(1e-3), [](optim::AdamWOptions& o) {
      o.lr(0.5).betas({0.85, 0.9}).eps(1e-6).weight_decay(0.3).amsgrad(true);
    });
    EXPECT_TRUE(saved == loaded) << "AdamW";
    EXPECT_EQ(std::get<0>(loaded.betas()), 0.85);
  }
  {
    auto [saved, loaded] = OptionsAfterResume<optim::Adam>(
        optim::AdamOptions(1e-3), [](optim::AdamOptions& o) {
          o.betas({0.7, 0.8}).eps(1e-4).weight_decay(0.1);
        });
    EXPECT_TRUE(saved == loaded) << "Adam";
  }
  {
    auto [saved, loaded] = OptionsAfterResume<optim::SGD>(
        optim::SGDOptions(0.1), [](optim::SGDOptions& o) {
          o.momentum(0.9).dampening(0).nesterov(true).weight_decay(0.01);
        });
    EXPECT_TRUE(saved == loaded) << "SGD";
    EXPECT_TRUE(loaded.nesterov());
  }
  {
    auto [saved, loaded] = OptionsAfterResume<optim::RMSprop>(
        optim::RMSpropOptions(0.01), [](optim::RMSpropOptions& o) {
          o.alpha(0.9).eps(1e-5).weight_decay(0.2).momentum(0.5).centered(true);
        });
    EXPECT_TRUE(saved == loaded) << "RMSprop";
  }
  {
    auto [saved, loaded] = OptionsAfterResume<optim::Adagrad>(
        optim::AdagradOptions(0.01), [](optim::AdagradOptions& o) {
          o.lr_decay(0.1).weight_decay(0.2).eps(1e-8);
        });
    EXPECT_TRUE(saved == loaded) << "Adagrad";
  }
  {
    auto [saved, loaded] = OptionsAfterResume<optim::LBFGS>(
        optim::LBFGSOptions(1), [](optim::LBFGSOptions& o) {
          o.max_iter(7).history_size(5).tolerance_grad(1e-3);
        });
    EXPECT_TRUE(saved == loaded) << "LBFGS";
  }
}

// The gradients of a cycle's first micro-steps are in no checkpoint (nor
// in Accelerate's): saving then says so, saving after the step does not.
TEST(CheckpointTest, SavingInTheMiddleOfAnAccumulationCycleWarns) {
  const std::string dir = MakeTempDir("mid_cycle") + "/state";
  AcceleratorOptions options = TestOptions();
  options.gradient_accumulation_steps = 2;
  Accelerator accelerator(options);
  torch::nn::Linear net(3, 2);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer] = accelerator.prepare(net, sgd);
  for (int micro = 0; micro < 2; ++micro) {
    {
      auto scope = accelerator.accumulate(model);
      accelerator.backward(model->forward(torch::ones({4, 3})).sum());
      optimizer.step();
      optimizer.zero_grad();
    }
    ::testing::internal::CaptureStderr();
    accelerator.save_state(dir);
    const std::string printed = ::testing::internal::GetCapturedStderr();
    if (micro == 0) {
      EXPECT_THAT(printed,
                  HasSubstr("save_state at micro-step 1 of 2 of a gradient "
                            "accumulation cycle: the gradients accumulated "
                            "since the last optimizer step are not saved"));
    } else {
      EXPECT_THAT(printed, Not(HasSubstr("micro-step"))) << printed;
    }
  }
}

TEST(CheckpointTest, ResumeUnderOneCycleIsBitExact) {
  const std::string dir = MakeTempDir("one_cycle") + "/state";
  struct Run {
    explicit Run(uint64_t seed)
        : accelerator(TestOptions()),
          model(torch::nn::Linear(3, 8), torch::nn::ReLU(),
                torch::nn::Linear(8, 2)),
          optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2)),
          data(Numbers(), TrainingRun::LoaderOptions()) {
      accelerator.set_seed(seed);
      for (auto& p : model->parameters()) {
        torch::NoGradGuard no_grad;
        p.copy_(torch::randn(p.sizes()));
      }
      auto prepared = accelerator.prepare(
          model, optimizer, data,
          std::make_unique<OneCycleLR>(optimizer, 0.05, 12));
      loader = std::make_unique<DataLoader<Numbers>>(std::get<2>(prepared));
      scheduler = std::make_unique<AcceleratedScheduler>(std::get<3>(prepared));
    }
    void Epoch() {
      for (auto& batch : *loader) {
        accelerator.backward(torch::nn::functional::cross_entropy(
            model->forward(batch.data), batch.target));
        optimizer.step();
        scheduler->step();
        optimizer.zero_grad();
      }
    }
    Accelerator accelerator;
    torch::nn::Sequential model;
    torch::optim::AdamW optimizer;
    DataLoader<Numbers> data;
    std::unique_ptr<DataLoader<Numbers>> loader;
    std::unique_ptr<AcceleratedScheduler> scheduler;
  };
  std::vector<torch::Tensor> straight;
  {
    Run run(1);
    run.Epoch();
    run.accelerator.save_state(dir);
    run.Epoch();
    run.Epoch();
    for (auto& p : run.model->parameters()) straight.push_back(p.clone());
  }
  Run resumed(2);
  resumed.accelerator.load_state(dir);
  resumed.Epoch();
  resumed.Epoch();
  std::vector<torch::Tensor> after;
  for (auto& p : resumed.model->parameters()) after.push_back(p.clone());
  EXPECT_TRUE(SameValues(after, straight));
}

bool Exists(const std::string& path) {
  struct stat info;
  return lstat(path.c_str(), &info) == 0;
}

TEST(CheckpointTest, PruningNeverDeletesThroughLinksNorWhatAccelDidNotWrite) {
  const std::string root = MakeTempDir("links");
  const std::string project = root + "/project";
  const std::string folder = project + "/checkpoints/checkpoint_";
  // What the links point to, outside the project.
  ASSERT_EQ(mkdir((root + "/data").c_str(), 0755), 0);
  std::ofstream(root + "/data/train.csv") << "precious";
  std::ofstream(root + "/data/accelerator_state.pt") << "not a checkpoint";
  ASSERT_EQ(mkdir((root + "/elsewhere").c_str(), 0755), 0);
  std::ofstream(root + "/elsewhere/accelerator_state.pt") << "looks complete";
  std::ofstream(root + "/elsewhere/notes.txt") << "precious";
  {
    TrainingRun first(8, project);
    ASSERT_EQ(first.accelerator.save_state(), folder + "1");
  }
  ASSERT_EQ(symlink((root + "/data").c_str(), (folder + "1/data").c_str()), 0);
  // A link with the name of a file accel writes goes as a link too.
  ASSERT_EQ(symlink((root + "/data/train.csv").c_str(),
                    (folder + "1/random_states_5.pt").c_str()),
            0);
  // A checkpoint folder that is itself a link, complete through it.
  ASSERT_EQ(symlink((root + "/elsewhere").c_str(), (folder + "2").c_str()), 0);
  TrainingRun run(8, project);
  EXPECT_EQ(run.accelerator.save_state(), folder + "3");
  EXPECT_EQ(run.accelerator.save_state(), folder + "4");  // Prunes 1 and 2.
  EXPECT_TRUE(IsCompleteCheckpoint(folder + "3"));
  EXPECT_TRUE(IsCompleteCheckpoint(folder + "4"));
  // The links went as links; nothing they point to was touched.
  EXPECT_FALSE(Exists(folder + "1"));
  EXPECT_FALSE(Exists(folder + "2"));
  EXPECT_EQ(ReadFile(root + "/data/train.csv"), "precious");
  EXPECT_EQ(ReadFile(root + "/data/accelerator_state.pt"), "not a checkpoint");
  EXPECT_EQ(ReadFile(root + "/elsewhere/notes.txt"), "precious");
  EXPECT_EQ(ReadFile(root + "/elsewhere/accelerator_state.pt"),
            "looks complete");
}

TEST(CheckpointTest, PruningKeepsFilesAccelDidNotWriteAndTheirFolder) {
  const std::string project = MakeTempDir("foreign");
  const std::string folder = project + "/checkpoints/checkpoint_";
  TrainingRun run(8, project);
  ASSERT_EQ(run.accelerator.save_state(), folder + "1");
  ASSERT_EQ(mkdir((folder + "1/eval").c_str(), 0755), 0);
  std::ofstream(folder + "1/eval/predictions.txt") << "mine";
  std::ofstream(folder + "1/README") << "mine too";
  run.accelerator.save_state();
  run.accelerator.save_state();
  // Accel's files are gone (no longer a checkpoint), the user's stay.
  EXPECT_FALSE(IsCompleteCheckpoint(folder + "1"));
  EXPECT_FALSE(Exists(folder + "1/random_states_0.pt"));
  EXPECT_EQ(ReadFile(folder + "1/eval/predictions.txt"), "mine");
  EXPECT_EQ(ReadFile(folder + "1/README"), "mine too");
  EXPECT_EQ(run.accelerator.latest_checkpoint(), folder + "3");
}

TEST(CheckpointTest, NumbersOfTenDigitsAndMoreCountForResumeAndPruning) {
  const std::string project = MakeTempDir("digits");
  const std::string folder = project + "/checkpoints/checkpoint_";
  {
    TrainingRun run(8, project);
    ASSERT_EQ(run.accelerator.save_state(), folder + "1");
    run.TrainEpoch();
    ASSERT_EQ(run.accelerator.save_state(), folder + "2");
  }
  ASSERT_EQ(rename((folder + "2").c_str(), (folder + "99999999999").c_str()),
            0);
  {
    TrainingRun next(8, project);
    EXPECT_EQ(next.accelerator.load_state(), folder + "99999999999");
    EXPECT_EQ(next.accelerator.save_state(), folder + "100000000000");
    EXPECT_EQ(CheckpointIndices(project),
              (std::vector<int64_t>{99999999999, 100000000000}));
    // Folders accel does not name (leading zeros) are not checkpoints.
    ASSERT_EQ(mkdir((folder + "0100000000001").c_str(), 0755), 0);
    EXPECT_EQ(next.accelerator.latest_checkpoint(), folder + "100000000000");
  }
  // The last number: nothing can follow it, said at once (accel never
  // writes a number it would refuse to read).
  ASSERT_EQ(mkdir((folder + "9223372036854775806").c_str(), 0755), 0);
  EXPECT_THAT([&] { TrainingRun last(8, project); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("checkpoint_9223372036854775806' has the last "
                            "number accel's checkpoint numbering has")));
  // Beyond int64: refused at once, naming the folder.
  ASSERT_EQ(mkdir((folder + "92233720368547758070").c_str(), 0755), 0);
  EXPECT_THAT([&] { TrainingRun too_far(8, project); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("checkpoint_92233720368547758070' has a number "
                            "beyond accel's checkpoint numbering")));
}

TEST(CheckpointTest, ASaveAtFewerProcessesRemovesTheExtraRanksFiles) {
  const std::string dir = MakeTempDir("fewer") + "/state";
  TrainingRun run;
  CheckpointContents contents;
  contents.models.push_back(run.model.ptr());
  contents.run_id = "three";
  for (int rank = 2; rank >= 0; --rank) {
    SaveCheckpoint(dir, rank, 3, rank == 0, contents);
  }
  contents.run_id = "two";
  contents.step = 7;
  for (int rank = 1; rank >= 0; --rank) {
    SaveCheckpoint(dir, rank, 2, rank == 0, contents);
  }
  EXPECT_FALSE(Exists(dir + "/random_states_2.pt"));
  // A resume at three processes takes the folder (rank 2 starts without a
  // random state of its own, as after any change of the process count).
  for (int rank = 0; rank < 3; ++rank) {
    const CheckpointProblem problem = CheckCheckpoint(dir, rank, 3);
    EXPECT_FALSE(problem) << "rank " << rank << ": " << problem.detail;
  }
}

TEST(CheckpointTest, AFullDiskFailsTheSaveNamingTheFileAndLeavesNothing) {
  const std::string project = MakeTempDir("full");
  auto run = std::make_unique<TrainingRun>(64, project);
  const std::string good = run->accelerator.save_state();
  run->TrainEpoch();
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
    run->accelerator.save_state();
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &original);
  run.reset();
  EXPECT_THAT(message, HasSubstr("File too large"));
  EXPECT_THAT(message, HasSubstr(project + "/checkpoints/checkpoint_2/"));
  // Nothing of the failed save is left, and the earlier one still loads.
  EXPECT_EQ(CheckpointIndices(project), (std::vector<int64_t>{1}));
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

TEST(CheckpointTest, ASecondAcceleratorInTheSameProjectDirIsRefused) {
  const std::string project = MakeTempDir("shared");
  auto first = std::make_unique<TrainingRun>(8, project);
  try {
    TrainingRun second(8, project);
    ADD_FAILURE() << "two Accelerators share " << project;
  } catch (const UsageError& e) {
    // In this process: another Accelerator (another process is named by
    // pid, host and command: examples_resume_test).
    EXPECT_THAT(e.what(),
                HasSubstr("project_dir '" + project +
                          "' is in use by another Accelerator of this "
                          "process"));
  }
  first.reset();  // Released with its Accelerator.
  TrainingRun third(8, project);
  EXPECT_EQ(third.accelerator.save_state(),
            project + "/checkpoints/checkpoint_1");
}

// Both used to be found only at the first save, after an epoch: a path too
// long for the checkpoint files, and a folder that is a link loop
// ("a file of that name is in the way").
TEST(CheckpointTest, AnUnusableProjectDirIsFoundBeforeTheFirstStep) {
  const std::string root = MakeTempDir("unusable");
  std::string long_dir = root;
  while (long_dir.size() < 4000) long_dir += "/" + std::string(200, 'd');
  long_dir.resize(4000);
  const std::string first_level =
      long_dir.substr(0, long_dir.find('/', root.size() + 1));
  EXPECT_THAT(
      [&] { TrainingRun run(8, long_dir); },
      ::testing::ThrowsMessage<UsageError>(::testing::AllOf(
          HasSubstr("(4000 characters) is too long for the checkpoint files "
                    "under it: their paths reach "),
          HasSubstr("over the system's limit of 4095"))));
  EXPECT_FALSE(Exists(first_level)) << "folders made before the refusal";
  const std::string loop = root + "/loop";
  ASSERT_EQ(symlink(loop.c_str(), loop.c_str()), 0);
  EXPECT_THAT([&] { TrainingRun run(8, loop); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "project_dir: cannot create folder '" + loop +
                  "': Too many levels of symbolic links (a symbolic link "
                  "loop)")));
  const std::string dangling = root + "/dangling";
  ASSERT_EQ(symlink((root + "/nowhere/x").c_str(), dangling.c_str()), 0);
  EXPECT_THAT([&] { TrainingRun run(8, dangling); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("a symbolic link to something that does not "
                            "exist")));
}

TEST(CheckpointTest, SaveStateWithoutProjectDirIsAUsageError) {
  TrainingRun run;
  EXPECT_THROW(run.accelerator.save_state(), UsageError);
}

}  // namespace
}  // namespace accel::testing
