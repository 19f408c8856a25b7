// The examples, end to end through self-launch (--num_processes): what
// each demo prints and trains (train_demo at any process count, its
// progress bar, bf16 and every ZeRO stage; fsdp_example's memory; the
// gather demos; complete_example; the README's samples; barrier_demo).
// Resumes, restarts and the job's surroundings are examples_resume_test's;
// flags, errors, tracking and logging examples_flags_test's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/example_runs.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

double MaxDifference(const std::map<std::string, torch::Tensor>& a,
                     const std::map<std::string, torch::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    worst = std::max(worst, (tensor - b.at(name)).abs().max().item<double>());
  }
  return worst;
}

TEST(ExamplesTest, TrainDemoPrintsTheSameAccuraciesOnceForAnyProcessCount) {
  std::vector<std::string> reference;
  for (int n : {1, 2, 4}) {
    const std::string out = MakeTempDir("train") + "/trained_model";
    const ProcessResult r = RunExample(
        "train_demo",
        {"--num_processes=" + std::to_string(n), "--output_dir=" + out});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto lines = Matches(r.output, "Epoch [0-9] - Accuracy: [0-9.]+");
    ASSERT_EQ(lines.size(), 3u) << r.output;  // From the main process only.
    EXPECT_EQ(lines[0].substr(0, 19), "Epoch 1 - Accuracy:");
    EXPECT_EQ(lines[2].substr(0, 19), "Epoch 3 - Accuracy:");
    if (reference.empty()) reference = lines;
    EXPECT_EQ(lines, reference) << n << " processes";
    // Not a terminal: no progress bar redraws (see the test below).
    EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
    EXPECT_TRUE(Exists(out + "/accelerator_state.pt")) << r.output;
    EXPECT_TRUE(Exists(out + "/random_states_0.pt"));
  }
}

// The progress bar: in a log (not a terminal) no redraws, at most a line
// every 10 s (--batch_size=2 --epochs=200 wrote 6,400 redraws, 289 KB, in
// 6.5 s); on a terminal (script's pseudo-terminal) redraws in place from
// the local main process only, ending each epoch's line once.
TEST(ExamplesTest, TrainDemosProgressBarDoesNotFloodALog) {
  const ProcessResult log = RunExample(
      "train_demo", {"--batch_size=2", "--epochs=200",
                     "--output_dir=" + MakeTempDir("bar") + "/trained_model"});
  ASSERT_EQ(log.exit_code, 0) << log.output;
  EXPECT_EQ(log.output.find('\r'), std::string::npos);
  EXPECT_LT(log.output.size(), 20000u) << log.output.substr(0, 2000);
  EXPECT_EQ(Matches(log.output, "Epoch [0-9]+ - Accuracy").size(), 200u);

  const std::string command =
      Runfile("examples/train_demo") +
      " --num_processes=2 --main_process_port=0 --output_dir=" +
      MakeTempDir("tty") + "/trained_model";
  const ProcessResult tty = RunProcess(
      {"/usr/bin/script", "-qefc", command, "/dev/null"}, {}, kTimeout);
  ASSERT_EQ(tty.exit_code, 0) << tty.output;
  // One bar per epoch, from rank 0 alone: each ends its line once.
  EXPECT_EQ(
      Matches(tty.output, "Epoch [0-9]/3 \\[8/8\\][^\\r]*\x1b\\[K").size(), 3u)
      << tty.output;
  EXPECT_EQ(Matches(tty.output, "\rEpoch 1/3 \\[1/8\\]").size(), 1u)
      << tty.output;
}

// --mixed_precision=bf16 changes what train_demo computes, at 1 and 2
// processes, with no code for it in the loop (the prepared model computes
// under autocast, as Accelerate's); it printed float32's fingerprint.
TEST(ExamplesTest, TrainDemoUnderBf16TrainsInBf16) {
  for (int n : {1, 2}) {
    std::map<std::string, std::string> fingerprints;
    for (const std::string precision : {"no", "bf16"}) {
      const ProcessResult r = RunExample(
          "train_demo",
          {"--num_processes=" + std::to_string(n),
           "--mixed_precision=" + precision,
           "--output_dir=" + MakeTempDir("precision") + "/trained_model"});
      ASSERT_EQ(r.exit_code, 0) << r.output;
      fingerprints[precision] = Fingerprint(r);
    }
    EXPECT_NE(fingerprints["bf16"], fingerprints["no"]) << n << " processes";
  }
}

// fsdp_example: sharded training state shows in each rank's peak host
// memory (ZeRO stage 2 holds about 10 of DDP's 16 bytes per parameter at 2
// processes, fewer at 3; stage 3 fewer again at 3, where its two units of
// 1 MB in flight weigh less than the parameters it shards), and DDP's
// ranks each hold everything. Every stage trains the same model.
TEST(ExamplesTest, FsdpExamplePrintsPeakMemoryThatShardingLowers) {
  std::map<double, std::vector<std::string>> accuracy_of;  // By peak.
  auto peak_of = [&](const std::vector<std::string>& args) {
    const ProcessResult r = RunExample("fsdp_example", args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::string> accuracy =
        Matches(r.output, "Epoch \\d - accuracy [0-9.]+");
    EXPECT_EQ(accuracy.size(), 2u) << r.output;
    const std::vector<std::string> peaks =
        Matches(r.output, "Peak host memory per rank: [0-9.]+");
    EXPECT_EQ(peaks.size(), 2u) << r.output;
    const double peak =
        peaks.empty() ? 0.0
                      : std::stod(peaks.back().substr(peaks.back().rfind(' ')));
    accuracy_of[peak] = accuracy;
    return peak;
  };
  const double one = peak_of({"--num_processes=1"});
  const double ddp = peak_of({"--num_processes=2", "--zero_stage=0"});
  const double two = peak_of({"--num_processes=2", "--zero_stage=2"});
  const double three = peak_of({"--num_processes=3", "--zero_stage=2"});
  const double full = peak_of({"--num_processes=3", "--zero_stage=3",
                               "--fsdp_transformer_layer_cls_to_wrap=Linear"});
  EXPECT_GT(one, 5.0);
  EXPECT_GT(ddp, 0.95 * one);
  EXPECT_LT(two, 0.75 * one);
  EXPECT_LT(three, two);
  EXPECT_LT(full, 0.97 * three);
  EXPECT_EQ(accuracy_of[full], accuracy_of[three]);
  EXPECT_EQ(accuracy_of[two], accuracy_of[ddp]);
}

// train_demo under every ZeRO stage, through the launcher and its flags:
// DDP's parameters bit for bit at 2 processes (each stage's checkpoint
// written on the way), under stage 3 resumable where it stopped, and
// accel-merge-weights turns the stage-3 checkpoint into DDP's file.
TEST(ExamplesTest, TrainDemoUnderEveryZeroStageEndsWithDdpsParameters) {
  const std::string dir = MakeTempDir("zero_stages");
  std::string ddp;
  // Each stage, then Accelerate's FSDP names for stages 2 and 3.
  const std::vector<std::vector<std::string>> stages = {
      {"--zero_stage=0"},
      {"--zero_stage=1"},
      {"--zero_stage=2"},
      {"--zero_stage=3"},
      {"--use_fsdp", "--fsdp_sharding_strategy=SHARD_GRAD_OP"},
      {"--use_fsdp"},
      // One machine: sharded over its processes, nothing replicated.
      {"--use_fsdp", "--fsdp_sharding_strategy=HYBRID_SHARD"}};
  for (size_t i = 0; i < stages.size(); ++i) {
    std::vector<std::string> args = {
        "--num_processes=2", "--epochs=2",
        "--output_dir=" + dir + "/stage" + std::to_string(i)};
    args.insert(args.end(), stages[i].begin(), stages[i].end());
    const ProcessResult r = RunExample("train_demo", args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (i == 0) {
      ddp = Fingerprint(r);
    } else {
      EXPECT_EQ(Fingerprint(r), ddp) << stages[i].back();
    }
  }
  for (const auto& [args, error] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--use_fsdp", "--zero_stage=1"},
            "--use_fsdp (the command line) with "
            "--fsdp_sharding_strategy=FULL_SHARD (its default) is "
            "zero_stage 3, but --zero_stage=1 was also given (the command "
            "line)"},
           {{"--fsdp_sharding_strategy=NO_SHARD"}, "is read with --use_fsdp"},
           // Names the flag given, and the strategies to give instead (it
           // named --zero_stage, which was never passed).
           {{"--use_fsdp", "--fsdp_sharding_strategy=HALF_SHARD"},
            "--fsdp_sharding_strategy must be FULL_SHARD, SHARD_GRAD_OP, "
            "NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2 (or Accelerate's "
            "numbers 1-5 for them), found \"HALF_SHARD\" (the command line)"},
           {{"--zero_stage=7"}, "--zero_stage (the command line) must be 0"}}) {
    std::vector<std::string> bad = {"--num_processes=1",
                                    "--output_dir=" + dir + "/bad"};
    bad.insert(bad.end(), args.begin(), args.end());
    const ProcessResult r = RunExample("train_demo", bad);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(error));
  }
  // In the launch configuration (a boolean alone, as gflags' flag files
  // take it), and overridden by the command line, which wins.
  std::ofstream(dir + "/fsdp.flags")
      << "--use_fsdp\n"
         "--fsdp_sharding_strategy=SHARD_GRAD_OP\n";
  for (const auto& [extra, stage] :
       std::vector<std::pair<std::string, std::string>>{
           {"--epochs=1", "zero_stage 2 with one process"},
           {"--zero_stage=3", "zero_stage 3 with one process"}}) {
    const ProcessResult r =
        RunExample("train_demo", {"--num_processes=1", "--epochs=1", extra,
                                  "--config_file=" + dir + "/fsdp.flags",
                                  "--output_dir=" + dir + "/configured"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(stage));
  }
  const ProcessResult first = RunExample(
      "train_demo", {"--num_processes=2", "--epochs=1", "--zero_stage=3",
                     "--output_dir=" + dir + "/first"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed = RunExample(
      "train_demo",
      {"--num_processes=2", "--epochs=2", "--zero_stage=3",
       "--resume_from=" + dir + "/first", "--output_dir=" + dir + "/resumed"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(Fingerprint(resumed), ddp);
  for (int stage : {0, 3}) {
    const std::string from = dir + "/stage" + std::to_string(stage);
    const ProcessResult merged = RunProcess(
        {Runfile("tools/merge_weights"), from, from + "/merged"}, {}, kTimeout);
    ASSERT_EQ(merged.exit_code, 0) << merged.output;
    EXPECT_THAT(merged.output, HasSubstr("merged/model.safetensors"));
  }
  std::ifstream ddp_file(dir + "/stage0/merged/model.safetensors");
  std::ifstream zero_file(dir + "/stage3/merged/model.safetensors");
  const std::string ddp_bytes((std::istreambuf_iterator<char>(ddp_file)), {});
  const std::string zero_bytes((std::istreambuf_iterator<char>(zero_file)), {});
  EXPECT_GT(ddp_bytes.size(), 1000u);
  EXPECT_TRUE(ddp_bytes == zero_bytes);
  const ProcessResult bad = RunProcess(
      {Runfile("tools/merge_weights"), dir + "/nothing", dir + "/out"}, {},
      kTimeout);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("is not a complete accel checkpoint"));
}

TEST(ExamplesTest, GatherDemoPrintsTheSeedsLineOnTheMainProcessOnly) {
  for (int n : {1, 2, 3}) {
    const ProcessResult r =
        RunExample("gather_demo", {"--num_processes=" + std::to_string(n)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string expected = "1, 2, 3";
    for (int i = 1; i < n; ++i) expected += ", 1, 2, 3";
    EXPECT_EQ(
        Matches(r.output, "Gathered tensor: .*"),
        std::vector<std::string>{"Gathered tensor: tensor([" + expected + "])"})
        << r.output;
  }
}

TEST(ExamplesTest, GatherLoopDemoPrintsEveryPredictionOnce) {
  for (int n : {1, 2, 3}) {
    const ProcessResult r = RunExample(
        "gather_loop_demo", {"--num_processes=" + std::to_string(n)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Matches(r.output, "Full predictions: .*"),
              std::vector<std::string>{
                  "Full predictions: tensor([0, 2, 4, 6, 8, 10, 12, 14])"})
        << n << " processes:\n"
        << r.output;
  }
}

TEST(ExamplesTest,
     CompleteExampleGivesTheSameResultsAtOneTwoAndThreeProcesses) {
  std::map<std::string, torch::Tensor> reference;
  std::vector<std::string> reference_lines;
  for (int n : {1, 2, 3}) {
    const std::string out = MakeTempDir("complete") + "/out";
    const ProcessResult r = RunExample(
        "complete_example",
        {"--num_processes=" + std::to_string(n), "--output_dir=" + out});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto lines =
        Matches(r.output, "Epoch [0-9] - accuracy [0-9.]+ on 110");
    ASSERT_EQ(lines.size(), 3u) << r.output;  // Every eval sample, once.
    EXPECT_TRUE(Exists(out + "/checkpoints/checkpoint_3/accelerator_state.pt"));
    const auto weights = Weights(out);
    if (n == 1) {
      reference = weights;
      reference_lines = lines;
      continue;
    }
    EXPECT_LE(MaxDifference(weights, reference), 1e-6) << n << " processes";
    EXPECT_EQ(lines, reference_lines);
  }
}

TEST(ExamplesTest, TheReadmeSamplesRunAsWritten) {
  // InitProgram runs in BUILD_WORKING_DIRECTORY, as under `bazel run`.
  const std::string dir = MakeTempDir("readme");
  const std::map<std::string, std::string> env = {
      {"BUILD_WORKING_DIRECTORY", dir}};
  const ProcessResult first =
      RunProcess({Runfile("tests/readme_sample_1"), "--num_processes=2",
                  "--main_process_port=0"},
                 env, kTimeout);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_THAT(first.output, HasSubstr("saved to trained_model"));
  EXPECT_TRUE(Exists(dir + "/trained_model/accelerator_state.pt"));
  for (int run = 0; run < 2; ++run) {
    const ProcessResult second =
        RunProcess({Runfile("tests/readme_sample_2"), "--num_processes=2",
                    "--main_process_port=0", "--gradient_accumulation_steps=2"},
                   env, kTimeout);
    ASSERT_EQ(second.exit_code, 0) << second.output;
    // The second run resumes after the first's three epochs: nothing left.
    EXPECT_EQ(Matches(second.output, "epoch [0-9] predictions 240").size(),
              run == 0 ? 3u : 0u)
        << second.output;
  }
  EXPECT_TRUE(Exists(dir + "/run/model/model.safetensors"));
  EXPECT_TRUE(
      Exists(dir + "/run/checkpoints/checkpoint_3/accelerator_state.pt"));
  EXPECT_FALSE(Exists(dir + "/run/checkpoints/checkpoint_1"));  // total_limit 2
}

TEST(ExamplesTest, BarrierDemoReleasesEveryoneTogether) {
  const ProcessResult r = RunExample("barrier_demo", {"--num_processes=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Process 0 reached the barrier after 0.0 s"));
  EXPECT_THAT(r.output, HasSubstr("Process 1 reached the barrier after 1.0 s"));
  const auto passed = Matches(r.output, "passed the barrier after 1\\.[0-9] s");
  EXPECT_EQ(passed.size(), 2u) << r.output;
}

}  // namespace
}  // namespace accel::testing
