// Every examples/by_feature port at 2 processes, end to end through
// self-launch, checking what its feature does (as Accelerate tests its
// example scripts): each prints an evaluation per epoch over exactly the 110
// evaluation samples, on the main process only.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const auto kTimeout = std::chrono::seconds(120);

ProcessResult RunByFeature(const std::string& name,
                           std::vector<std::string> args) {
  args.insert(args.begin(), {Runfile("examples/by_feature/" + name),
                             "--num_processes=2", "--main_process_port=0"});
  return RunProcess(args, {}, kTimeout);
}

std::vector<std::smatch> AllMatches(const std::string& text,
                                    const std::regex& pattern) {
  return {std::sregex_iterator(text.begin(), text.end(), pattern),
          std::sregex_iterator()};
}

// The accuracies of the "epoch N: {...}" lines, checking that each counted
// `samples` samples.
std::vector<double> EpochAccuracies(const ProcessResult& r, int samples = 110) {
  static const std::regex kEpoch(
      "epoch ([0-9]+): \\{'accuracy': ([0-9.]+), 'samples': ([0-9]+)\\}");
  std::vector<double> accuracies;
  for (const std::smatch& m : AllMatches(r.output, kEpoch)) {
    EXPECT_EQ(std::stoi(m[3]), samples) << m[0] << " in:\n" << r.output;
    accuracies.push_back(std::stod(m[2]));
  }
  return accuracies;
}

// The value printed after `label` (to the end of its line), or "".
std::string ValueAfter(const std::string& output, const std::string& label) {
  const size_t at = output.find(label);
  if (at == std::string::npos) return "";
  const size_t start = at + label.size();
  return output.substr(start, output.find('\n', start) - start);
}

// Three epochs, from the main process alone, that learned the blobs
// (chance is 1/3; with 24 optimizer steps every port reaches 0.93 by its
// last epoch).
void ExpectLearned(const ProcessResult& r, double min_accuracy = 0.9) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> accuracies = EpochAccuracies(r);
  ASSERT_EQ(accuracies.size(), 3u) << r.output;
  EXPECT_GE(accuracies.back(), min_accuracy) << r.output;
}

// The script fails (on every rank, as accel reports errors) saying `what`.
void ExpectRefused(const std::string& name, std::vector<std::string> args,
                   const std::string& what) {
  const ProcessResult r = RunByFeature(name, std::move(args));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(what));
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

std::vector<std::string> FileNames(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* entry = readdir(d)) names.push_back(entry->d_name);
    closedir(d);
  }
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ByFeatureTest, GradientAccumulationStepsTheOptimizerEveryNBatches) {
  // 240 samples, 16 a process: 8 batches an epoch at 2 processes.
  const ProcessResult plain = RunByFeature("gradient_accumulation", {});
  ExpectLearned(plain);
  EXPECT_EQ(ValueAfter(plain.output, "optimizer steps: "), "24");
  const ProcessResult accumulated = RunByFeature(
      "gradient_accumulation", {"--gradient_accumulation_steps=3"});
  ExpectLearned(accumulated, /*min_accuracy=*/0.8);  // 9 steps: 0.85.
  // 3 steps an epoch (batches 3, 6 and the loader's end at 8).
  EXPECT_EQ(ValueAfter(accumulated.output, "optimizer steps: "), "9");
}

TEST(ByFeatureTest, CheckpointingResumesFromAnEpochOrAStepExactly) {
  const std::string dir = MakeTempDir("checkpointing");
  const ProcessResult whole = RunByFeature(
      "checkpointing",
      {"--checkpointing_steps=epoch", "--output_dir=" + dir + "/epochs"});
  ExpectLearned(whole);
  const std::string checksum = ValueAfter(whole.output, "parameter checksum: ");
  ASSERT_FALSE(checksum.empty()) << whole.output;
  for (const char* epoch : {"epoch_0", "epoch_1", "epoch_2"}) {
    EXPECT_TRUE(Exists(dir + "/epochs/" + epoch + "/accelerator_state.pt"))
        << epoch;
  }
  // After epoch 0: epochs 1 and 2 again, to the same weights.
  const ProcessResult from_epoch = RunByFeature(
      "checkpointing", {"--resume_from_checkpoint=" + dir + "/epochs/epoch_0",
                        "--output_dir=" + dir + "/unused"});
  ASSERT_EQ(from_epoch.exit_code, 0) << from_epoch.output;
  const std::vector<double> whole_accuracies = EpochAccuracies(whole);
  EXPECT_EQ(EpochAccuracies(from_epoch),
            std::vector<double>(whole_accuracies.begin() + 1,
                                whole_accuracies.end()));
  EXPECT_EQ(ValueAfter(from_epoch.output, "parameter checksum: "), checksum);

  // Every 5 steps; step 10 is the third batch of epoch 1 (8 an epoch).
  const ProcessResult stepped = RunByFeature(
      "checkpointing",
      {"--checkpointing_steps=5", "--output_dir=" + dir + "/steps"});
  ASSERT_EQ(stepped.exit_code, 0) << stepped.output;
  EXPECT_EQ(ValueAfter(stepped.output, "parameter checksum: "), checksum);
  for (const char* step : {"step_5", "step_10", "step_15", "step_20"}) {
    EXPECT_TRUE(Exists(dir + "/steps/" + step + "/accelerator_state.pt"))
        << step;
  }
  EXPECT_FALSE(Exists(dir + "/steps/step_25"));
  const ProcessResult from_step = RunByFeature(
      "checkpointing",
      {"--resume_from_checkpoint=" + dir + "/steps/step_10",
       "--checkpointing_steps=5", "--output_dir=" + dir + "/resumed_steps"});
  ASSERT_EQ(from_step.exit_code, 0) << from_step.output;
  EXPECT_EQ(EpochAccuracies(from_step).size(), 2u) << from_step.output;
  EXPECT_EQ(ValueAfter(from_step.output, "parameter checksum: "), checksum);
  // The resumed run names its steps from the run's first batch.
  EXPECT_TRUE(Exists(dir + "/resumed_steps/step_15/accelerator_state.pt"));
  EXPECT_FALSE(Exists(dir + "/resumed_steps/step_5"));

  ExpectRefused("checkpointing",
                {"--resume_from_checkpoint=" + dir + "/steps/step_7"},
                "step_7");
  // A folder renamed, and so misnamed, is refused after it loads.
  ASSERT_EQ(std::rename((dir + "/steps/step_20").c_str(),
                        (dir + "/steps/step_999").c_str()),
            0);
  ExpectRefused("checkpointing",
                {"--resume_from_checkpoint=" + dir + "/steps/step_999"},
                "'step_999' holds a run after 20 steps, in epoch 2");
  ExpectRefused("checkpointing", {"--checkpointing_steps=+5"}, "found '+5'");
  ExpectRefused("checkpointing", {"--checkpointing_steps=often"},
                "found 'often'");
}

TEST(ByFeatureTest, MultiProcessMetricsDropsTheRepeatedSamplesByHand) {
  // 110 samples, 32 a process: the last step's 64 hold 18 repeated ones.
  const ProcessResult r = RunByFeature("multi_process_metrics", {});
  ExpectLearned(r);
  static const std::regex kAutomatic(
      "gather_for_metrics: \\{'accuracy': ([0-9.]+), 'samples': 110\\}");
  const auto automatic = AllMatches(r.output, kAutomatic);
  ASSERT_EQ(automatic.size(), 3u) << r.output;
  const std::vector<double> by_hand = EpochAccuracies(r);
  for (size_t i = 0; i < automatic.size(); ++i) {
    EXPECT_EQ(std::stod(automatic[i][1]), by_hand[i]) << i;
  }
}

TEST(ByFeatureTest, TrackingRecordsTheConfigurationAndEachEpoch) {
  const std::string dir = MakeTempDir("tracking");
  const ProcessResult r =
      RunByFeature("tracking", {"--with_tracking", "--project_dir=" + dir});
  ExpectLearned(r);
  const std::string jsonl = ReadFile(dir + "/tracking/metrics.jsonl");
  EXPECT_THAT(jsonl, HasSubstr("\"config\":{\"batch_size\":16,\"lr\":0.01,"
                               "\"num_epochs\":3,\"seed\":42}"));
  static const std::regex kStep(
      "\\{\"step\":([0-9]),\"values\":\\{\"accuracy\":([0-9.]+),\"epoch\":"
      "([0-9]),\"train_loss\":([0-9.e-]+)\\}");
  const auto steps = AllMatches(jsonl, kStep);
  ASSERT_EQ(steps.size(), 3u) << jsonl;  // Once: from the main process.
  const std::vector<double> printed = EpochAccuracies(r);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(std::stoi(steps[i][1]), static_cast<int>(i));
    EXPECT_NEAR(std::stod(steps[i][2]), printed[i], 1e-6);
    EXPECT_GT(std::stod(steps[i][4]), 0.0);
  }
  // The loss falls as the model learns.
  EXPECT_LT(std::stod(steps[2][4]), std::stod(steps[0][4]));
  // log_with="all": TensorBoard's event file beside it.
  EXPECT_THAT(FileNames(dir + "/tracking"),
              Contains(StartsWith("events.out.tfevents.")));

  // Without --with_tracking, nothing is written.
  const std::string quiet = MakeTempDir("untracked");
  ExpectLearned(RunByFeature("tracking", {"--project_dir=" + quiet}));
  EXPECT_FALSE(Exists(quiet + "/tracking"));
}

TEST(ByFeatureTest, EarlyStoppingStopsEveryProcessAtTheSameStep) {
  const ProcessResult r = RunByFeature("early_stopping", {"--patience=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  static const std::regex kStopped(
      "process ([01]) stopped early after step ([0-9]+)");
  const auto stops = AllMatches(r.output, kStopped);
  ASSERT_EQ(stops.size(), 2u) << r.output;
  EXPECT_NE(stops[0][1], stops[1][1]);
  EXPECT_EQ(stops[0][2], stops[1][2]) << r.output;
  // Stopped before the run's 24 steps, after an evaluation.
  EXPECT_LT(std::stoi(stops[0][2]), 24);
  EXPECT_FALSE(EpochAccuracies(r).empty());
  // A patience longer than the run never stops it.
  const ProcessResult patient =
      RunByFeature("early_stopping", {"--patience=100"});
  ExpectLearned(patient);
  EXPECT_THAT(patient.output, Not(HasSubstr("stopped early")));
  ExpectRefused("early_stopping", {"--patience=0"},
                "--patience must be at least 1 step, found 0");
}

TEST(ByFeatureTest, LocalSgdAveragesEveryNSteps) {
  // 8 steps an epoch: every 4 steps is twice an epoch.
  const ProcessResult r = RunByFeature("local_sgd", {"--local_sgd_steps=4"});
  ExpectLearned(r);
  EXPECT_THAT(r.output, HasSubstr("parameters averaged 6 times"));
  const ProcessResult off = RunByFeature("local_sgd", {"--local_sgd_steps=0"});
  ExpectLearned(off);
  EXPECT_THAT(off.output, HasSubstr("parameters averaged 0 times within the "
                                    "epochs (LocalSGD off)"));
  ExpectRefused("local_sgd", {"--local_sgd_steps=-1"},
                "--local_sgd_steps must be 0 (off) or a number of steps");
}

TEST(ByFeatureTest, MemoryRetriesEveryProcessWithTheSameSmallerBatch) {
  const ProcessResult r =
      RunByFeature("memory", {"--simulated_memory_limit=12"});
  ExpectLearned(r);
  static const std::regex kTry("Trying batch size ([0-9]+)");
  std::vector<std::string> tried;
  for (const std::smatch& m : AllMatches(r.output, kTry)) tried.push_back(m[1]);
  EXPECT_EQ(tried, (std::vector<std::string>{"16", "14", "12"})) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Trained with batch size 12"));
  EXPECT_THAT(r.output, HasSubstr("rank(s) 1 ran out of memory"));
  // Enough memory: one try.
  const ProcessResult roomy = RunByFeature("memory", {});
  ExpectLearned(roomy);
  EXPECT_EQ(AllMatches(roomy.output, kTry).size(), 1u);
}

TEST(ByFeatureTest, AutomaticGradientAccumulationKeepsTheObservedBatch) {
  const ProcessResult r = RunByFeature("automatic_gradient_accumulation",
                                       {"--simulated_memory_limit=8"});
  ExpectLearned(r);
  // 16, 14, 12, 10, 9 fail; 8 fits and accumulates 16 / 8 = 2 batches.
  EXPECT_EQ(AllMatches(r.output, std::regex("Trying batch size")).size(), 6u)
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("Trained with batch size 8 and 2 gradient "
                                  "accumulation steps"));
}

TEST(ByFeatureTest, CrossValidationAveragesTheFoldsOnTheTestSet) {
  const ProcessResult r = RunByFeature("cross_validation", {"--num_folds=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  static const std::regex kFold(
      "fold [0-2] - training on ([0-9]+) samples, validating on ([0-9]+)");
  const auto folds = AllMatches(r.output, kFold);
  ASSERT_EQ(folds.size(), 3u) << r.output;
  int validated = 0;
  for (const std::smatch& fold : folds) {
    EXPECT_EQ(std::stoi(fold[1]) + std::stoi(fold[2]), 240);
    validated += std::stoi(fold[2]);
  }
  EXPECT_EQ(validated, 240);  // Each sample validates once.
  static const std::regex kAverage(
      "Average test metrics from all folds: \\{'accuracy': ([0-9.]+), "
      "'samples': 110\\}");
  const auto average = AllMatches(r.output, kAverage);
  ASSERT_EQ(average.size(), 1u) << r.output;
  EXPECT_GE(std::stod(average[0][1]), 0.9);
  ExpectRefused("cross_validation", {"--num_folds=1000"},
                "--num_folds=1000 is more than class 0's");
  ExpectRefused("cross_validation", {"--num_folds=1"},
                "--num_folds must be at least 2");
}

TEST(ByFeatureTest, DdpCommHooksTrainAndUnknownOnesAreRefused) {
  for (const char* hook : {"fp16", "bf16", "power_sgd"}) {
    SCOPED_TRACE(hook);
    ExpectLearned(RunByFeature("ddp_comm_hook",
                               {std::string("--ddp_comm_hook=") + hook}));
  }
  ExpectRefused("ddp_comm_hook", {"--ddp_comm_hook=batched_power_sgd"},
                "accel has no batched PowerSGD");
  ExpectRefused("ddp_comm_hook", {"--ddp_comm_wrapper=fp16"},
                "no communication wrappers");
}

TEST(ByFeatureTest, ScheduleFreeTrainsWithoutASchedule) {
  // Schedule-free AdamW evaluates its average: 0.964 after 3 epochs.
  const ProcessResult r = RunByFeature("schedule_free", {});
  ExpectLearned(r, /*min_accuracy=*/0.95);
  EXPECT_FALSE(ValueAfter(r.output, "parameter checksum: ").empty());
}

TEST(ByFeatureTest, ProfilerPrintsTheTableAndWritesATracePerProcess) {
  const std::string dir = MakeTempDir("profiler");
  const ProcessResult r =
      RunByFeature("profiler", {"--output_trace_dir=" + dir, "--record_shapes",
                                "--profile_memory", "--row_limit=5"});
  ExpectLearned(r);
  // One table an epoch, from the main process.
  EXPECT_EQ(AllMatches(r.output, std::regex("Self CPU time total: ")).size(),
            3u)
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("accel::gradient_sync"));
  for (const char* rank : {"0", "1"}) {
    const std::string trace =
        ReadFile(dir + "/profile_" + std::string(rank) + ".json");
    EXPECT_THAT(trace, HasSubstr("\"traceEvents\":[")) << rank;
    EXPECT_THAT(trace,
                HasSubstr("\"name\":\"rank " + std::string(rank) + "\""));
    EXPECT_THAT(trace, HasSubstr("aten::addmm")) << rank;
  }
  ExpectRefused("profiler", {"--with_flops"}, "not FLOPs");
}

}  // namespace
}  // namespace accel::testing
