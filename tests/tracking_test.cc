// Accelerate's experiment tracking on the Accelerator, with every rank a
// process: init_trackers, log, get_tracker and end_training run the trackers
// on the main process only; misuse is a UsageError on every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/tracking/jsonl_tracker.h"
#include "accel/tracking/tensorboard_tracker.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"

namespace accel::testing {

// One folder per world size: every rank computes the same one.
std::string LoggingDir() {
  return std::string(std::getenv("TEST_TMPDIR")) + "/logs_" +
         std::getenv("WORLD_SIZE");
}

AcceleratorOptions TestAcceleratorOptions() {
  AcceleratorOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(20);
  options.log_with = {"tensorboard", "jsonl"};
  options.logging_dir = LoggingDir();
  return options;
}

namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }
int R() { return A().process_index(); }

std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// Before the shared Accelerator's trackers start.
TEST(TrackingTest, LogBeforeInitTrackersIsAnErrorOnEveryRank) {
  EXPECT_THAT(UsageErrorOf([] {
                A().log({{"loss", 1.0}}, 0);
              }),
              HasSubstr("log() before init_trackers()"));
  if (A().is_main_process()) {
    EXPECT_THAT(UsageErrorOf([] { A().get_tracker("jsonl"); }),
                HasSubstr("(init_trackers has not been called)"));
  }
  EXPECT_EQ(A().logging_dir(), LoggingDir());
}

TEST(TrackingTest, BadTrackerOptionsFailAtConstructionBeforeJoining) {
  AcceleratorOptions unknown = TestAcceleratorOptions();
  unknown.log_with = {"jsonl", "wandb"};
  const std::string error = UsageErrorOf([&] { Accelerator bad(unknown); });
  EXPECT_THAT(error, HasSubstr("unknown tracker 'wandb'"));
  EXPECT_THAT(error, HasSubstr("linked trackers: jsonl, tensorboard"));

  AcceleratorOptions nowhere = TestAcceleratorOptions();
  nowhere.logging_dir = "";
  EXPECT_THAT(UsageErrorOf([&] { Accelerator bad(nowhere); }),
              HasSubstr("tracker 'tensorboard' (--report_to) needs a logging "
                        "directory: pass --logging_dir=DIR"));
}

TEST(TrackingTest, InitTrackersNeedsAProjectName) {
  EXPECT_THAT(UsageErrorOf([] { A().init_trackers(""); }),
              HasSubstr("the project name is empty"));
}

TEST(TrackingTest, TrackersRunOnTheMainProcessOnly) {
  A().init_trackers("run", {{"lr", 3e-4}, {"optimizer", "adamw"}});
  EXPECT_THAT(UsageErrorOf([] { A().init_trackers("run"); }),
              HasSubstr("init_trackers was called twice"));
  if (A().is_main_process()) {
    ASSERT_EQ(A().trackers().size(), 2u);
    EXPECT_EQ(A().trackers()[0]->name(), "tensorboard");
    auto& tensorboard =
        dynamic_cast<TensorBoardTracker&>(A().get_tracker("tensorboard"));
    EXPECT_EQ(tensorboard.run_dir(), LoggingDir() + "/run");
    EXPECT_EQ(A().get_tracker("jsonl").name(), "jsonl");
    const std::string error = UsageErrorOf([] { A().get_tracker("wandb"); });
    EXPECT_THAT(error, HasSubstr("'wandb' is not an available tracker"));
    EXPECT_THAT(error, HasSubstr("started trackers: tensorboard, jsonl"));
  } else {
    EXPECT_TRUE(A().trackers().empty());
    EXPECT_EQ(A().get_tracker("wandb").name(), "blank");  // As Accelerate.
  }

  // Every rank logs; only the main process writes, once.
  A().log({{"loss", 0.5 + R()}, {"epoch", 0}}, 10);
  A().log({{"loss", 0.25}});  // Step 11: one past the last.
  A().log({{"note", "done"}});
  EXPECT_THAT(UsageErrorOf([] {
                A().log({{"", 1.0}});
              }),
              HasSubstr("a value has no name"));
  A().wait_for_everyone();

  if (A().is_main_process()) {
    const auto lines = JsonLines(LoggingDir() + "/run/metrics.jsonl");
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[0]["config"]["optimizer"], "adamw");
    EXPECT_EQ(lines[1]["step"], 10);
    EXPECT_EQ(lines[1]["values"]["loss"], 0.5);  // Rank 0's value.
    EXPECT_EQ(lines[2]["step"], 11);
    EXPECT_EQ(lines[3]["step"], 12);
    EXPECT_EQ(lines[3]["values"]["note"], "done");
  }
  int event_files = 0;
  for (const std::string& name : ListFolder(LoggingDir() + "/run")) {
    event_files += name.rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(event_files, 1);  // Not one per process.
}

// Last: end_training finishes the trackers and leaves the job.
TEST(TrackingTest, EndTrainingFinishesTheTrackers) {
  A().end_training();
  EXPECT_THAT(UsageErrorOf([] {
                A().log({{"loss", 1.0}});
              }),
              HasSubstr("log() after end_training()"));
  EXPECT_THAT(UsageErrorOf([] { A().init_trackers("again"); }),
              HasSubstr("init_trackers was called twice"));
  if (A().is_main_process()) {
    // The JSONL file is closed: its tracker refuses more lines.
    EXPECT_THROW(A().get_tracker("jsonl").log({{"loss", 1.0}}, 1), Error);
  }
}

}  // namespace
}  // namespace accel::testing
