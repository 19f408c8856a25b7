// //examples:gpt on the State of the Union text end to end (tools/setup.sh
// installs the corpus): a short run gives the same bits at 1 and 2
// processes (--invariant_micro_batches), prints the progress line with
// tokens/s, MFU and memory, a validation loss that has fallen from
// ln(256), and a sample that continues the prompt; a run stopped at a
// checkpoint and resumed at the other process count ends on the same
// bits; bad input is refused by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

const auto kTimeout = std::chrono::seconds(300);

// A small model and batch: 8 steps take about a second a process.
const std::vector<std::string> kSmall = {
    "--max_steps=8",
    "--batch_size=8",
    "--block_size=32",
    "--n_layer=2",
    "--n_embd=32",
    "--lr=1e-2",
    "--warmup_steps=2",
    "--eval_blocks=16",
    "--print_every=4",
    "--generate=24",
    "--invariant_micro_batches=2",
    "--peak_gflops=100"};  // Not measured: the test stays short.

ProcessResult RunGpt(const std::string& output_dir, int processes,
                     std::vector<std::string> args) {
  args.insert(args.begin(), kSmall.begin(), kSmall.end());
  args.insert(args.begin(),
              {Runfile("examples/gpt"), "--output_dir=" + output_dir,
               "--main_process_port=0",
               "--num_processes=" + std::to_string(processes)});
  return RunProcess(args, {}, kTimeout);
}

std::string Match(const std::string& output, const std::string& pattern) {
  std::smatch found;
  if (!std::regex_search(output, found, std::regex(pattern))) return "";
  return found[1];
}

std::string Fingerprint(const std::string& output) {
  return Match(output, "Parameter fingerprint: ([0-9a-f]+)");
}

double ValidationLoss(const std::string& output) {
  const std::string loss =
      Match(output, "step 8: validation loss ([0-9.]+), perplexity");
  return loss.empty() ? std::nan("") : std::stod(loss);
}

TEST(GptExampleTest, SameBitsAtOneAndTwoProcessesWithProgressAndSample) {
  std::string reference;
  double reference_loss = 0;
  for (int n : {1, 2}) {
    const ProcessResult r =
        RunGpt(MakeTempDir("gpt_" + std::to_string(n)), n, {});
    const std::string what = "at " + std::to_string(n) + " processes";
    ASSERT_EQ(r.exit_code, 0) << what << r.output;
    EXPECT_THAT(r.output, HasSubstr("State of the Union: 209 addresses, "
                                    "9782774 bytes to train on; 24 held out"));
    EXPECT_THAT(r.output,
                ContainsRegex("step 4/8 \\| loss [0-9.]+ \\| [0-9.]+k? "
                              "tokens/s \\| MFU [0-9.]+% of 100.0 GFLOP/s \\| "
                              "memory [0-9]+ MiB RSS, [0-9]+ MiB tensors"))
        << what;
    EXPECT_THAT(r.output, HasSubstr("Sample (top_k 5):\nThe state of the "
                                    "Union is"))
        << what;
    EXPECT_THAT(r.output, ContainsRegex("Trained 2048 tokens in [0-9.]+ s of "
                                        "training steps"))
        << what;
    const double loss = ValidationLoss(r.output);
    // ln(256) = 5.545 at the start; bytes' own frequencies alone give ~3.
    EXPECT_LT(loss, 4.5) << what << r.output;
    const std::string fingerprint = Fingerprint(r.output);
    ASSERT_FALSE(fingerprint.empty()) << r.output;
    if (n == 1) {
      reference = fingerprint;
      reference_loss = loss;
    }
    EXPECT_EQ(fingerprint, reference) << what;
    EXPECT_EQ(loss, reference_loss) << what;
  }
}

// Stopped at step 4's checkpoint (accel numbers from 1) at 2 processes, resumed
// at 1: the loader continues with the next batch of the epoch, so the end is
// the uninterrupted run's.
TEST(GptExampleTest, ResumesAtAnotherProcessCountOnTheSameBits) {
  const ProcessResult whole = RunGpt(MakeTempDir("gpt_whole"), 1, {});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::string dir = MakeTempDir("gpt_resumed");
  const ProcessResult first =
      RunGpt(dir, 2, {"--checkpointing_steps=4", "--generate=0"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed =
      RunGpt(dir, 1, {"--resume_from=" + dir + "/checkpoints/checkpoint_1"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("at step 4"));
  EXPECT_THAT(resumed.output, ContainsRegex("Trained 1024 tokens in"));
  EXPECT_EQ(Fingerprint(resumed.output), Fingerprint(whole.output));
  EXPECT_EQ(ValidationLoss(resumed.output), ValidationLoss(whole.output));
}

TEST(GptExampleTest, RefusesBadInputByName) {
  const auto refused = [](std::vector<std::string> args,
                          const std::string& expected) {
    const ProcessResult r = RunGpt(MakeTempDir("gpt_bad"), 1, args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(expected));
  };
  refused({"--text=shakespeare"},
          "--text must be sotu or markov, not 'shakespeare'");
  refused({"--data_dir=/nonexistent/sotu"},
          "--data_dir=/nonexistent/sotu holds no State of the Union corpus");
  refused({"--epochs=0", "--max_steps=0"},
          "--epochs and --max_steps are both 0");
  refused({"--batch_size=3", "--num_processes=2"},
          "must be a multiple of the number of processes");
  refused({"--block_size=20000000"}, "holds no block of 20000000 bytes");
  const ProcessResult env =
      RunProcess({Runfile("examples/gpt"), "--max_steps=1",
                  "--output_dir=" + MakeTempDir("gpt_env")},
                 {{"ACCEL_SOTU_DIR", "/nonexistent/env"}}, kTimeout);
  EXPECT_NE(env.exit_code, 0);
  EXPECT_THAT(env.output, HasSubstr("ACCEL_SOTU_DIR=/nonexistent/env holds "
                                    "no State of the Union corpus"));
}

}  // namespace
}  // namespace accel::testing
