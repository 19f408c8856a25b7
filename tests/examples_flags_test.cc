// The examples, end to end: what a user gets wrong and what a job says.
// Bad flags, accel's own flags, misspellings, an unknown backend or
// tracker and an error that escapes main are one clear line (on every rank,
// or before any rank starts), fast; complete_example's and train_demo's
// tracking (JSONL, TensorBoard read back, plot_metrics); --v and --vmodule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/example_runs.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

// Failures must end the job long before any collective timeout (300 s);
// generous, because CI runs other tests (and sanitizers) beside this one.
const auto kFailFast = std::chrono::seconds(30);

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

size_t Count(const std::vector<std::string>& lines, const std::string& part) {
  size_t n = 0;
  for (const std::string& line : lines)
    n += line.find(part) != std::string::npos;
  return n;
}

TEST(ExamplesTest, AnErrorThatEscapesMainIsOneLineAndExitCode1) {
  // gather_demo has no RunAndReportErrors around main.
  const ProcessResult r =
      RunExample("gather_demo", {"--num_processes=2", "--backend=bogus"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(Matches(r.output,
                    "error: \\[rank [01]/2\\] unknown backend "
                    "'bogus'; available backends: [a-z, ]+\n")
                .size(),
            2u)
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("exited with code 1"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("terminate called")));
}

TEST(ExamplesTest, BadFlagsAreOneClearErrorOnEveryRankBeforeAnyTraining) {
  const std::string file = MakeTempDir("bad_flags") + "/a_file";
  std::ofstream(file) << "not a folder";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--epochs=-1", "--epochs must not be negative, found -1"},
      {"--batch_size=-4", "--batch_size must be at least 1, found -4"},
      {"--hidden=0", "--hidden must be at least 1, found 0"},
      {"--output_dir=", "--output_dir is empty"},
      {"--output_dir=" + file, "cannot create folder '" + file + "'"},
      {"--mixed_precision=fp8", "(--mixed_precision) must be"},
      {"--report_to=jsonl --logging_dir=" + file,
       "cannot create folder '" + file + "'"},
  };
  for (const auto& [flag, message] : cases) {
    std::vector<std::string> args = {"--num_processes=2"};
    std::stringstream flags(flag);
    for (std::string one; flags >> one;) args.push_back(one);
    const ProcessResult r = RunExample("train_demo", args);
    EXPECT_EQ(r.exit_code, 1) << flag << "\n" << r.output;
    size_t lines = 0;
    for (const std::string& line : Matches(r.output, "error: [^\n]*")) {
      lines += line.find(message) != std::string::npos;
    }
    EXPECT_EQ(lines, 2u) << flag << "\n" << r.output;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("Epoch 1")));
    EXPECT_LT(r.elapsed, kFailFast);
  }
}

// accel's own flags are checked before any rank starts: one line, exit
// code 2 (each rank printed it, after the launcher's summary; a port of
// 70000 went unnoticed at 1 process; gflags said "ERROR: illegal value",
// exit code 1, for a value of the wrong type).
TEST(ExamplesTest, AccelsFlagValuesAreCheckedBeforeAnyRankStarts) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--timeout_s=0", "--timeout_s must be at least 1, found 0"},
      {"--timeout_s=-1", "--timeout_s must be at least 1, found -1"},
      {"--rendezvous_timeout_s=0",
       "--rendezvous_timeout_s must be at least 1, found 0"},
      {"--network_timeout_s=0",
       "--network_timeout_s must be at least 1, found 0"},
      {"--gradient_accumulation_steps=0",
       "--gradient_accumulation_steps must be at least 1, found 0"},
      {"--main_process_port=70000",
       "--main_process_port must be in [0, 65535], found 70000"},
      {"--num_processes=abc",
       "train_demo: --num_processes=abc is not an integer from -2147483648 "
       "to 2147483647"},
      {"--timeout_s 9999999999",
       "--timeout_s=9999999999 is not an integer from"},
      {"--cpu=maybe", "--cpu=maybe is not true or false"},
      {"--gradient_clipping=1.0x", "--gradient_clipping=1.0x is not a number"},
  };
  for (const char* processes : {"--num_processes=1", "--num_processes=2"}) {
    for (const auto& [flag, message] : cases) {
      // Not RunExample, which picks the port.
      std::vector<std::string> args = {Runfile("examples/train_demo"),
                                       processes};
      std::stringstream flags(flag);
      for (std::string one; flags >> one;) args.push_back(one);
      const ProcessResult r = RunProcess(args, {}, kTimeout);
      EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.output;
      EXPECT_THAT(r.output, HasSubstr("error: "));
      EXPECT_THAT(r.output, HasSubstr(message)) << flag;
      EXPECT_EQ(Matches(r.output, "error: ").size(), 1u) << flag << r.output;
      EXPECT_THAT(r.output, ::testing::Not(HasSubstr("rank")));
    }
  }
}

// A misspelt flag says which it resembles (gflags' bare "unknown command
// line flag 'epoch'" before); a batch that does not split over the
// processes names --batch_size (the DataLoader's message did not); a tool's
// --help lists its own flags (merge-weights printed "SetUsageMessage()
// never called" and 252 LibTorch flags, exit 1).
TEST(ExamplesTest, FlagMistakesAreNamedWithTheFix) {
  const ProcessResult misspelt = RunExample("train_demo", {"--epoch=3"});
  EXPECT_EQ(misspelt.exit_code, 2) << misspelt.output;
  EXPECT_THAT(misspelt.output, HasSubstr("error: train_demo has no flag "
                                         "--epoch (did you mean --epochs?)"));
  const ProcessResult three = RunExample(
      "train_demo",
      {"--num_processes=3", "--output_dir=" + MakeTempDir("three") + "/out"});
  EXPECT_EQ(three.exit_code, 1) << three.output;
  EXPECT_THAT(three.output,
              HasSubstr("--batch_size (8) must be a multiple of the number of "
                        "processes (3): train_demo splits each global batch "
                        "across them; pass --batch_size=9 or another "
                        "--num_processes"));
  const ProcessResult help =
      RunProcess({Runfile("tools/merge_weights"), "--help"}, {}, kTimeout);
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_THAT(help.output,
              HasSubstr("Usage: merge_weights CHECKPOINT OUT [--model=N]"));
  EXPECT_THAT(help.output, HasSubstr("--max_shard_size="));
  EXPECT_THAT(help.output, ::testing::Not(HasSubstr("SetUsageMessage")));
  EXPECT_THAT(help.output, HasSubstr("a folder save_state wrote"));
  EXPECT_LT(Matches(help.output, "\n").size(), 15u) << help.output;
}

TEST(ExamplesTest, UnknownBackendIsAClearErrorOnEveryRank) {
  const ProcessResult r =
      RunExample("train_demo", {"--num_processes=2", "--backend=nope"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(
      Matches(r.output,
              "error: \\[rank [01]/2\\] unknown backend 'nope'; available "
              "backends: gloo, mpi")
          .size(),
      2u)
      << r.output;
  EXPECT_LT(r.elapsed, kFailFast);
}

TEST(ExamplesTest, NcclWithoutGpuFailsFastOnEveryRankAndAutoPicksGloo) {
  const ProcessResult nccl =
      RunExample("train_demo", {"--num_processes=2", "--backend=nccl"});
  if (nccl.exit_code == 0) GTEST_SKIP() << "a GPU is visible here";
  const auto errors = Matches(
      nccl.output,
      "error: (\\[nccl\\] rank [01]/2: creating the communicator: |\\[rank "
      "[01]/2\\] the nccl backend is unavailable: )(no CUDA GPU is "
      "visible|.*built without CUDA)[^\\n]*--backend=gloo");
  EXPECT_EQ(errors.size(), 2u) << nccl.output;
  EXPECT_THAT(nccl.output, HasSubstr("accel launch: rank"));
  EXPECT_LT(nccl.elapsed, kFailFast) << nccl.output;

  const ProcessResult automatic = RunExample(
      "train_demo", {"--num_processes=2", "--backend=auto", "--epochs=1",
                     "--output_dir=" + MakeTempDir("auto") + "/model"});
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  EXPECT_THAT(automatic.output, HasSubstr("on 2 process(es) (gloo)"));
}

// The acceptance check: complete_example's TensorBoard file holds
// exactly what its JSONL file holds, read back independently.
TEST(ExamplesTest, CompleteExampleTracksEveryStepToTensorBoardAndJsonl) {
  const std::string out = MakeTempDir("complete") + "/out";
  const ProcessResult r = RunExample(
      "complete_example",
      {"--num_processes=2", "--report_to=all", "--output_dir=" + out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string run = out + "/complete_example";
  const std::vector<std::string> lines = Lines(run + "/metrics.jsonl");
  // 240 samples in global batches of 12: 20 steps per epoch, 3 epochs, and
  // an evaluation per epoch; the configuration first.
  ASSERT_EQ(lines.size(), 1u + 60u + 3u) << r.output;
  EXPECT_EQ(Count(lines, "\"config\""), 1u);
  EXPECT_EQ(Count(lines, "\"samples_per_second\""), 60u);
  EXPECT_EQ(Count(lines, "\"accuracy\""), 3u);
  EXPECT_THAT(lines[0], HasSubstr("\"num_processes\":2"));
  EXPECT_THAT(lines[1], HasSubstr("\"step\":1,"));
  EXPECT_THAT(lines.back(), HasSubstr("\"step\":60,"));

  const std::string expect = out + "/expected.jsonl";
  {
    std::ofstream file(expect);
    for (const std::string& line : lines) file << line << "\n";
    file << "{\"finished\": true}\n";
  }
  const ProcessResult read_back = RunProcess(
      {"/usr/bin/python3", Runfile("accel/tracking/read_tensorboard_events.py"),
       "--protoc=" + Runfile("../accel_protobuf/bin/protoc"),
       "--proto_root=" + Runfile(""),
       "--wkt_root=" + Runfile("../accel_protobuf/include"),
       "--expect=" + expect, run},
      {}, kTimeout);
  EXPECT_EQ(read_back.exit_code, 0) << read_back.output;
  EXPECT_THAT(read_back.output,
              HasSubstr("checked 1 files, 66 records, 66 length CRCs, 66 "
                        "data CRCs, 63 steps, 246 tags, 246 values, 8 "
                        "hparams"));
  std::cout << read_back.output;

  const ProcessResult plot = RunProcess(
      {Runfile("tools/plot_metrics"), run, "-o", out + "/curves.png"}, {},
      kTimeout);
  EXPECT_EQ(plot.exit_code, 0) << plot.output;
  EXPECT_THAT(plot.output, HasSubstr("(loss, accuracy, learning_rate, "
                                     "samples_per_second; up to 60 steps)"));
  EXPECT_TRUE(Exists(out + "/curves.png"));
}

TEST(ExamplesTest, TrainDemoLogsEveryStepOnlyWhenAsked) {
  const std::string quiet = MakeTempDir("untracked") + "/model";
  const ProcessResult untracked =
      RunExample("train_demo", {"--num_processes=2", "--output_dir=" + quiet});
  ASSERT_EQ(untracked.exit_code, 0) << untracked.output;
  EXPECT_FALSE(Exists(quiet + "/train_demo"));

  const std::string out = MakeTempDir("tracked") + "/model";
  const ProcessResult r =
      RunExample("train_demo", {"--num_processes=2", "--report_to=jsonl",
                                "--logging_dir=" + out + "/logs"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines =
      Lines(out + "/logs/train_demo/metrics.jsonl");
  // 64 samples in global batches of 8, 3 epochs: 24 steps, 3 epoch lines.
  ASSERT_EQ(lines.size(), 1u + 24u + 3u) << r.output;
  EXPECT_EQ(Count(lines, "\"learning_rate\":0.0003"), 24u);
  EXPECT_EQ(Count(lines, "\"epoch_accuracy\""), 3u);
}

TEST(ExamplesTest, AnUnknownTrackerIsAClearErrorOnEveryRank) {
  const ProcessResult r = RunExample(
      "train_demo", {"--num_processes=2", "--report_to=jsonl,wandb"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(Matches(r.output,
                    "error: \\[rank [01]/2\\] unknown tracker 'wandb'; "
                    "linked trackers: jsonl, tensorboard")
                .size(),
            2u)
      << r.output;
  EXPECT_LT(r.elapsed, kFailFast);
}

// --v=1: rendezvous and connections; --v=2: also one line per collective
// (sequence number, operation, bytes, duration, call site); nothing of it
// by default. Every line names its rank.
TEST(ExamplesTest, VerboseLoggingShowsRendezvousThenEveryCollective) {
  const std::string glog_line = "(^|\n)I[0-9]{8} [0-9:.]+ +[0-9]+ ";
  const std::string collective =
      "\\[rank [01]/2\\] \\[gloo\\] gather #1 \\(gather_demo.cc:[0-9]+\\): "
      "allgather uint8 x 1024, 1024 bytes, [0-9]+\\.[0-9]{3} ms";
  const std::string joined =
      "\\[rank [01]/2\\] all 2 ranks joined after [0-9]+ ms";

  const ProcessResult quiet = RunExample("gather_demo", {"--num_processes=2"});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_TRUE(Matches(quiet.output, glog_line).empty()) << quiet.output;

  const ProcessResult v1 =
      RunExample("gather_demo", {"--num_processes=2", "--v=1"});
  ASSERT_EQ(v1.exit_code, 0) << v1.output;
  EXPECT_EQ(Matches(v1.output, joined).size(), 2u) << v1.output;
  EXPECT_EQ(
      Matches(v1.output, "\\[rank 0/2\\] store: rank 1 connected from").size(),
      1u)
      << v1.output;
  EXPECT_EQ(
      Matches(v1.output, "\\[rank [01]/2\\] gloo connected 2 ranks").size(), 2u)
      << v1.output;
  EXPECT_TRUE(Matches(v1.output, collective).empty()) << v1.output;

  const ProcessResult v2 =
      RunExample("gather_demo", {"--num_processes=2", "--v=2"});
  ASSERT_EQ(v2.exit_code, 0) << v2.output;
  EXPECT_EQ(Matches(v2.output, collective).size(), 2u) << v2.output;
  EXPECT_EQ(Matches(v2.output, joined).size(), 2u) << v2.output;

  // One file's lines only.
  const ProcessResult one_file = RunExample(
      "gather_demo", {"--num_processes=2", "--vmodule=communicator=2"});
  ASSERT_EQ(one_file.exit_code, 0) << one_file.output;
  EXPECT_EQ(Matches(one_file.output, collective).size(), 2u) << one_file.output;
  EXPECT_TRUE(Matches(one_file.output, joined).empty()) << one_file.output;
}

}  // namespace
}  // namespace accel::testing
