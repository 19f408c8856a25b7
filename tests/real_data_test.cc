// The real-data examples end to end, through self-launch: nlp_example on
// the SpamAssassin corpus (tools/setup.sh installs it), cv_example on
// python3-sklearn's digits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

const auto kTimeout = std::chrono::seconds(300);

struct EpochMetrics {
  int epoch = 0;
  double accuracy = 0;
  double f1 = 0;
  int samples = 0;
};

// The "epoch N: {'accuracy': A, 'f1': F, 'samples': S}" lines.
std::vector<EpochMetrics> Epochs(const std::string& output) {
  static const std::regex line(
      "epoch ([0-9]+): \\{'accuracy': ([0-9.]+), 'f1': ([0-9.]+), "
      "'samples': ([0-9]+)\\}");
  std::vector<EpochMetrics> epochs;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    epochs.push_back({std::stoi((*it)[1]), std::stod((*it)[2]),
                      std::stod((*it)[3]), std::stoi((*it)[4])});
  }
  return epochs;
}

ProcessResult RunExample(const std::string& name, const std::string& output_dir,
                         std::vector<std::string> args) {
  args.insert(args.begin(),
              {Runfile("examples/" + name), "--output_dir=" + output_dir,
               "--main_process_port=0"});
  return RunProcess(args, {}, kTimeout);
}

ProcessResult RunNlp(const std::string& output_dir,
                     std::vector<std::string> args) {
  args.insert(args.begin(), {"--epochs=2", "--max_length=32"});
  return RunExample("nlp_example", output_dir, args);
}

void ExpectSameMetrics(const std::vector<EpochMetrics>& found,
                       const std::vector<EpochMetrics>& expected,
                       const std::string& what) {
  ASSERT_EQ(found.size(), expected.size()) << what;
  for (size_t e = 0; e < found.size(); ++e) {
    EXPECT_NEAR(found[e].accuracy, expected[e].accuracy, 1e-5) << what;
    EXPECT_NEAR(found[e].f1, expected[e].f1, 1e-5) << what;
    EXPECT_EQ(found[e].samples, expected[e].samples) << what;
  }
}

// Runs `example` at 1, 2 and 4 processes with `args`: every epoch's
// metrics agree, and the final weights are the same bytes (the examples'
// default --invariant_micro_batches=4: accel/parallel/invariant_reduction.h).
// Returns the 1-process run's epochs.
std::vector<EpochMetrics> ExpectSameRunsAtOneTwoAndFour(
    const std::string& example, std::vector<std::string> args,
    const std::string& expected_line) {
  std::vector<EpochMetrics> reference;
  std::string reference_weights;
  for (int n : {1, 2, 4}) {
    const std::string dir = MakeTempDir(example);
    std::vector<std::string> run = args;
    run.push_back("--num_processes=" + std::to_string(n));
    const ProcessResult r = example == "nlp_example"
                                ? RunNlp(dir, run)
                                : RunExample(example, dir, run);
    const std::string what =
        example + " at " + std::to_string(n) + " processes, " + run.front();
    EXPECT_EQ(r.exit_code, 0) << what << r.output;
    EXPECT_THAT(r.output, HasSubstr(expected_line));
    const std::vector<EpochMetrics> epochs = Epochs(r.output);
    const std::string weights = ReadFile(dir + "/model/model.safetensors");
    EXPECT_FALSE(weights.empty()) << what;
    if (reference.empty()) {
      reference = epochs;
      reference_weights = weights;
    }
    ExpectSameMetrics(epochs, reference, what);
    EXPECT_TRUE(weights == reference_weights)
        << what << ": the weights differ from 1 process's";
  }
  return reference;
}

// One epoch (151 steps at 1 process): the bits agree or not from the first
// step on, and docs/benchmarks.md's table shows the two-epoch runs.
TEST(RealDataTest, NlpRunsAgreeToTheBitAtOneTwoAndFourProcesses) {
  for (const std::string precision : {"no", "bf16"}) {
    const std::vector<EpochMetrics> epochs = ExpectSameRunsAtOneTwoAndFour(
        "nlp_example", {"--mixed_precision=" + precision, "--epochs=1"},
        "Training on 4836 mails, 1516 of them spam; testing on 1210");
    ASSERT_EQ(epochs.size(), 1u);        // The main process's only.
    EXPECT_EQ(epochs[0].samples, 1210);  // Exactly the test set.
    EXPECT_GT(epochs[0].accuracy, 0.9) << precision;
  }
}

// bf16 autocast; a run stopped in the middle of its first epoch and
// resumed from its checkpoint ends where an uninterrupted run ends.
TEST(RealDataTest, NlpResumedInBf16EndsAsTheUninterruptedRun) {
  const std::vector<std::string> bf16 = {
      "--num_processes=2", "--mixed_precision=bf16", "--epochs=1"};
  const ProcessResult whole = RunNlp(MakeTempDir("nlp_whole"), bf16);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::string dir = MakeTempDir("nlp_resumed");
  std::vector<std::string> stop = bf16;
  stop.push_back("--stop_after_steps=100");  // Of 151.
  const ProcessResult stopped = RunNlp(dir, stop);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_THAT(stopped.output, HasSubstr("Stopped after 100 steps"));
  EXPECT_TRUE(Epochs(stopped.output).empty()) << stopped.output;
  std::vector<std::string> resume = bf16;
  resume.push_back("--resume");
  const ProcessResult resumed = RunNlp(dir, resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("Resumed from"));
  const auto expected = Epochs(whole.output);
  const auto found = Epochs(resumed.output);
  ASSERT_EQ(expected.size(), 1u) << whole.output;
  ASSERT_EQ(found.size(), 1u) << resumed.output;
  EXPECT_GT(found[0].accuracy, 0.9);
  EXPECT_EQ(found[0].accuracy, expected[0].accuracy);
  EXPECT_EQ(found[0].f1, expected[0].f1);
}

TEST(RealDataTest, CvRunsAgreeToTheBitAtOneTwoAndFourProcesses) {
  for (const std::string precision : {"no", "bf16"}) {
    const std::vector<EpochMetrics> epochs = ExpectSameRunsAtOneTwoAndFour(
        "cv_example", {"--mixed_precision=" + precision},
        "Training on 1437 images; testing on 360");
    ASSERT_EQ(epochs.size(), 10u);
    EXPECT_EQ(epochs.back().samples, 360);
    EXPECT_GT(epochs.back().accuracy, 0.95) << precision;
  }
}

// Without the micro-batches (DDP's allreduce, as Accelerate sums) double
// precision agrees in the metrics too.
TEST(RealDataTest, NlpInDoublePrecisionAgreesWithoutMicroBatches) {
  std::vector<EpochMetrics> reference;
  for (int n : {1, 4}) {
    const ProcessResult r =
        RunNlp(MakeTempDir("nlp64"),
               {"--num_processes=" + std::to_string(n), "--float64",
                "--epochs=1", "--invariant_micro_batches=0"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<EpochMetrics> epochs = Epochs(r.output);
    ASSERT_EQ(epochs.size(), 1u) << r.output;
    if (reference.empty()) reference = epochs;
    ExpectSameMetrics(epochs, reference, std::to_string(n) + " processes");
  }
}

// The shifts are made in two worker threads, from (seed, epoch, index):
// the same seed gives the same run, another seed another one; a resumed run
// ends where the uninterrupted one does.
TEST(RealDataTest, CvAugmentationIsReproducibleAndResumable) {
  const std::vector<std::string> two = {"--num_processes=2"};
  const ProcessResult first = RunExample("cv_example", MakeTempDir("cv"), two);
  const ProcessResult again = RunExample("cv_example", MakeTempDir("cv"), two);
  std::vector<std::string> seven = two;
  seven.push_back("--seed=7");
  const ProcessResult other =
      RunExample("cv_example", MakeTempDir("cv"), seven);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(again.exit_code, 0) << again.output;
  ASSERT_EQ(other.exit_code, 0) << other.output;
  ASSERT_EQ(Epochs(first.output).size(), 10u) << first.output;
  ExpectSameMetrics(Epochs(again.output), Epochs(first.output), "same seed");
  EXPECT_NE(Epochs(other.output).back().f1, Epochs(first.output).back().f1);

  const std::string dir = MakeTempDir("cv_resumed");
  std::vector<std::string> stop = two;
  stop.push_back("--stop_after_steps=30");  // Of 44 in the first epoch.
  const ProcessResult stopped = RunExample("cv_example", dir, stop);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_THAT(stopped.output, HasSubstr("Stopped after 30 steps"));
  std::vector<std::string> resume = two;
  resume.push_back("--resume");
  const ProcessResult resumed = RunExample("cv_example", dir, resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto epochs = Epochs(resumed.output);
  ASSERT_EQ(epochs.size(), 10u) << resumed.output;
  EXPECT_EQ(epochs.back().accuracy, Epochs(first.output).back().accuracy);
  EXPECT_EQ(epochs.back().f1, Epochs(first.output).back().f1);
}

TEST(RealDataTest, CvRejectsAFileThatIsNotTheDigits) {
  const std::string dir = MakeTempDir("cv_bad");
  const std::string bad = dir + "/digits.csv";
  ASSERT_EQ(std::system(("printf '0,1,2\\n' > " + bad).c_str()), 0);
  const ProcessResult r = RunExample("cv_example", dir, {"--data_file=" + bad});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr(bad + ":1: expected 64 grey levels (0-16) "
                                        "and a digit, found \"0,1,2\""));
}

// A cache that cannot be used (garbage here) is named and made again.
TEST(RealDataTest, NlpRemakesAnUnusableTokenCache) {
  const std::string dir = MakeTempDir("nlp_cache");
  ASSERT_EQ(std::system(("echo garbage > " + dir + "/tokens.pt").c_str()), 0);
  const ProcessResult r = RunNlp(dir, {"--epochs=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("not using " + dir + "/tokens.pt (unreadable"));
  EXPECT_EQ(Epochs(r.output).size(), 1u) << r.output;
  const ProcessResult again = RunNlp(dir, {"--epochs=1"});
  EXPECT_THAT(again.output, ::testing::Not(HasSubstr("not using")));
}

TEST(RealDataTest, CvRefusesABatchLargerThanTheTrainingSet) {
  const ProcessResult r =
      RunExample("cv_example", MakeTempDir("cv_big"), {"--batch_size=1438"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("the training set (1437 samples) is smaller "
                                  "than one global batch (--batch_size=1438"));
}

TEST(RealDataTest, NlpWithoutTheCorpusSaysWhatToInstall) {
  const ProcessResult r =
      RunNlp(MakeTempDir("nlp_none"), {"--data_dir=/nonexistent/corpus"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--data_dir=/nonexistent/corpus holds no "
                                  "SpamAssassin corpus"));
  const ProcessResult env =
      RunProcess({Runfile("examples/nlp_example"), "--epochs=1",
                  "--output_dir=" + MakeTempDir("nlp_env")},
                 {{"ACCEL_DATA_DIR", "/nonexistent/env"}}, kTimeout);
  EXPECT_NE(env.exit_code, 0);
  EXPECT_THAT(env.output, HasSubstr("ACCEL_DATA_DIR=/nonexistent/env holds no "
                                    "SpamAssassin corpus"));
}

}  // namespace
}  // namespace accel::testing
