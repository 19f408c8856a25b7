// The examples, end to end through self-launch (--num_processes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "accel/checkpoint/model_weights.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

const auto kTimeout = std::chrono::seconds(120);
// Failures must end the job long before any collective timeout (300 s);
// generous, because CI runs other tests (and sanitizers) beside this one.
const auto kFailFast = std::chrono::seconds(30);

ProcessResult RunExample(const std::string& name,
                         std::vector<std::string> args) {
  args.insert(args.begin(), Runfile("examples/" + name));
  args.push_back("--main_process_port=0");
  return RunProcess(args, {}, kTimeout);
}

std::vector<std::string> Matches(const std::string& text,
                                 const std::string& pattern) {
  std::vector<std::string> found;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re);
       it != std::sregex_iterator(); ++it) {
    found.push_back(it->str());
  }
  return found;
}

std::string Fingerprint(const ProcessResult& r) {
  const auto found = Matches(r.output, "Parameter fingerprint: [0-9a-f]+");
  return found.size() == 1 ? found[0] : "missing in:\n" + r.output;
}

// `first`, then `then`.
std::vector<std::string> Concat(std::vector<std::string> first,
                                const std::vector<std::string>& then) {
  first.insert(first.end(), then.begin(), then.end());
  return first;
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
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
      {"--use_fsdp"}};
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
           {{"--use_fsdp", "--fsdp_sharding_strategy=HYBRID_SHARD"},
            "--fsdp_sharding_strategy=HYBRID_SHARD (the command line): "
            "hybrid sharding (shard within a machine, replicate across "
            "machines) is not in accel; give FULL_SHARD or SHARD_GRAD_OP, "
            "which shard over every process"},
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

TEST(ExamplesTest, ResumedTrainingEqualsUninterruptedTrainingBitForBit) {
  const std::string dir = MakeTempDir("resume");
  const ProcessResult straight = RunExample(
      "train_demo",
      {"--num_processes=2", "--epochs=3", "--output_dir=" + dir + "/straight"});
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const ProcessResult first = RunExample(
      "train_demo",
      {"--num_processes=2", "--epochs=2", "--output_dir=" + dir + "/first"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed =
      RunExample("train_demo", {"--num_processes=2", "--epochs=3",
                                "--resume_from=" + dir + "/first",
                                "--output_dir=" + dir + "/resumed"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output,
              HasSubstr("Resumed from " + dir + "/first in epoch 3"));
  EXPECT_EQ(Matches(resumed.output, "Epoch [0-9] - Accuracy").size(), 1u);
  EXPECT_EQ(Fingerprint(resumed), Fingerprint(straight));
  EXPECT_NE(Fingerprint(first), Fingerprint(straight));
}

TEST(ExamplesTest, KilledRankIsRestartedAndResumesToTheSameResult) {
  const std::string dir = MakeTempDir("restart");
  const std::vector<std::string> common = {"--num_processes=2", "--epochs=8",
                                           "--sleep_per_step_ms=25"};
  auto with = [&](std::vector<std::string> extra) {
    return Concat(common, std::move(extra));
  };
  const ProcessResult straight =
      RunExample("train_demo", with({"--output_dir=" + dir + "/straight"}));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  const std::string out = dir + "/restarted";
  bool killed = false;
  std::vector<std::string> args =
      with({"--output_dir=" + out, "--resume", "--max_restarts=1",
            "--main_process_port=0"});
  args.insert(args.begin(), Runfile("examples/train_demo"));
  const ProcessResult restarted =
      RunProcess(args, {}, kTimeout, [&](pid_t launcher) {
        // Once epoch 2's checkpoint is complete, kill rank 1 mid-training.
        const std::string marker =
            out + "/checkpoints/checkpoint_2/accelerator_state.pt";
        for (int i = 0; i < 3000 && !Exists(marker); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const std::vector<pid_t> ranks = RanksOf(launcher);
        if (ranks.size() == 2) killed = kill(ranks[1], SIGKILL) == 0;
      });
  ASSERT_TRUE(killed) << restarted.output;
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_THAT(restarted.output, HasSubstr("killed by signal 9"));
  EXPECT_THAT(restarted.output,
              HasSubstr("restarting all ranks (restart 1 of 1, "
                        "TORCHELASTIC_RESTART_COUNT=1)"));
  EXPECT_THAT(restarted.output,
              HasSubstr("Resumed from " + out + "/checkpoints/checkpoint_"));
  EXPECT_EQ(Fingerprint(restarted), Fingerprint(straight));
  // total_limit=2: only the two newest epoch checkpoints remain.
  EXPECT_TRUE(Exists(out + "/checkpoints/checkpoint_8"));
  EXPECT_TRUE(Exists(out + "/checkpoints/checkpoint_7"));
  EXPECT_FALSE(Exists(out + "/checkpoints/checkpoint_6"));
}

// A saved model's weights by name (defined below).
std::map<std::string, torch::Tensor> Weights(const std::string& dir);

// Waits until `path` exists (at most 30 s).
void AwaitFile(const std::string& path) {
  for (int i = 0; i < 3000 && !Exists(path); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A cluster's warning before it kills the job, to the supervisor (SLURM's
// --signal=USR1@60 on the batch step, Kubernetes' SIGTERM) or to the ranks
// themselves (srun --signal, torchrun's agent): every rank saves at the
// same step and leaves with 75, and --resume continues bit for bit.
TEST(ExamplesTest, PreemptedTrainDemoSavesLeavesAndResumesBitForBit) {
  const std::string dir = MakeTempDir("preempt");
  const std::vector<std::string> common = {"--num_processes=2", "--epochs=4",
                                           "--sleep_per_step_ms=40"};
  auto with = [&](std::vector<std::string> extra) {
    return Concat(common, std::move(extra));
  };
  const ProcessResult straight =
      RunExample("train_demo", with({"--output_dir=" + dir + "/straight"}));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  for (const bool to_ranks : {false, true}) {
    for (int signal_number : {SIGUSR1, SIGTERM}) {
      const std::string out = dir + "/" + std::to_string(signal_number) +
                              (to_ranks ? "_ranks" : "_supervisor");
      std::vector<std::string> args =
          with({"--output_dir=" + out, "--resume", "--main_process_port=0"});
      args.insert(args.begin(), Runfile("examples/train_demo"));
      const ProcessResult preempted =
          RunProcess(args, {}, kTimeout, [&](pid_t supervisor) {
            // In the middle of epoch 2.
            AwaitFile(out + "/checkpoints/checkpoint_1/accelerator_state.pt");
            std::this_thread::sleep_for(std::chrono::milliseconds(120));
            if (!to_ranks) {
              kill(supervisor, signal_number);
              return;
            }
            for (pid_t rank : RanksOf(supervisor)) kill(rank, signal_number);
          });
      SCOPED_TRACE(std::string(to_ranks ? "ranks" : "supervisor") + " got " +
                   strsignal(signal_number));
      EXPECT_EQ(preempted.exit_code, 75) << preempted.output;
      EXPECT_THAT(preempted.output,
                  HasSubstr("Preempted by " +
                            std::string(signal_number == SIGUSR1 ? "SIGUSR1"
                                                                 : "SIGTERM") +
                            " in epoch 2 - saved " + out +
                            "/checkpoints/checkpoint_2 (continue with "
                            "--resume)"))
          << preempted.output;
      EXPECT_THAT(preempted.output,
                  HasSubstr("all 2 rank(s) saved and left (exit code 75)"));
      EXPECT_EQ(Matches(preempted.output, "Epoch [0-9] - Accuracy").size(), 1u);
      const ProcessResult resumed = RunProcess(args, {}, kTimeout);
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      EXPECT_THAT(resumed.output, HasSubstr("Resumed from " + out +
                                            "/checkpoints/checkpoint_2"));
      EXPECT_EQ(Fingerprint(resumed), Fingerprint(straight));
      // The epoch cut in two reports the same accuracy as uninterrupted.
      EXPECT_EQ(Matches(preempted.output + resumed.output,
                        "Epoch [0-9] - Accuracy: [0-9.]+"),
                Matches(straight.output, "Epoch [0-9] - Accuracy: [0-9.]+"));
    }
  }
}

TEST(ExamplesTest, PreemptedCompleteExampleResumesBitForBit) {
  const std::string dir = MakeTempDir("preempt_complete");
  const std::vector<std::string> common = {
      "--num_processes=2", "--gradient_accumulation_steps=2", "--epochs=6",
      "--checkpointing_steps=epoch", "--main_process_port=0"};
  std::vector<std::string> straight_args = common;
  straight_args.insert(straight_args.begin(),
                       Runfile("examples/complete_example"));
  straight_args.push_back("--output_dir=" + dir + "/a");
  const ProcessResult straight = RunProcess(straight_args, {}, kTimeout);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  std::vector<std::string> args = common;
  args.insert(args.begin(), Runfile("examples/complete_example"));
  args.push_back("--output_dir=" + dir + "/b");
  args.push_back("--resume");
  const ProcessResult preempted =
      RunProcess(args, {}, kTimeout, [&](pid_t supervisor) {
        AwaitFile(dir + "/b/checkpoints/checkpoint_1/accelerator_state.pt");
        kill(supervisor, SIGTERM);
      });
  EXPECT_EQ(preempted.exit_code, 75) << preempted.output;
  EXPECT_EQ(
      Matches(preempted.output, "Preempted by SIGTERM at epoch [2-6] - saved")
          .size(),
      1u)
      << preempted.output;
  const ProcessResult resumed = RunProcess(args, {}, kTimeout);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto a = Weights(dir + "/a");
  const auto b = Weights(dir + "/b");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
  }
}

// A console that goes away (`| head`, a closed ssh session) must not stop
// training: the job finishes and saves, only its output is lost.
TEST(ExamplesTest, AClosedConsoleDoesNotStopTraining) {
  const std::string out = MakeTempDir("console") + "/out";
  const ProcessResult r =
      RunProcess({"/bin/bash", "-c",
                  "\"$0\" --num_processes=2 --epochs=6 --sleep_per_step_ms=10 "
                  "--main_process_port=0 --output_dir=\"$1\" 2>&1 | head -c 20 "
                  ">/dev/null; echo \"job exit ${PIPESTATUS[0]}\"",
                  Runfile("examples/train_demo"), out},
                 {}, kTimeout);
  EXPECT_THAT(r.output, HasSubstr("job exit 0")) << r.output;
  EXPECT_TRUE(Exists(out + "/accelerator_state.pt")) << r.output;
  EXPECT_TRUE(Exists(out + "/checkpoints/checkpoint_6/accelerator_state.pt"));
}

// Started with closed standard streams (a daemon, `>&- 2>&-`), the job
// runs as usual; before, rank 0's store socket became its stdout.
TEST(ExamplesTest, ClosedStandardStreamsAtLaunchChangeNothing) {
  const std::string out = MakeTempDir("closed") + "/out";
  const ProcessResult r =
      RunProcess({"/bin/bash", "-c",
                  "\"$0\" --num_processes=2 --epochs=2 --main_process_port=0 "
                  "--output_dir=\"$1\" <&- >&- 2>&- ; echo \"job exit $?\"",
                  Runfile("examples/train_demo"), out},
                 {}, kTimeout);
  EXPECT_THAT(r.output, HasSubstr("job exit 0")) << r.output;
  EXPECT_TRUE(Exists(out + "/accelerator_state.pt"));
  EXPECT_TRUE(Exists(out + "/random_states_1.pt"));
  EXPECT_LT(r.elapsed, std::chrono::seconds(20));
}

// A file-size limit (ulimit -f) ends a save with the I/O error, named, and
// nothing half-written stays; before, SIGXFSZ killed the rank, leaving a
// .partial file. At start-up it is as clear (shared memory counts too).
TEST(ExamplesTest, AFileSizeLimitIsAnIoErrorNotASignal) {
  const std::string out = MakeTempDir("fsize") + "/out";
  const ProcessResult r =
      RunProcess({"/bin/bash", "-c",
                  "ulimit -f 200; exec \"$0\" --num_processes=2 --epochs=2 "
                  "--hidden=2000 --main_process_port=0 --output_dir=\"$1\"",
                  Runfile("examples/train_demo"), out},
                 {{"ACCEL_SHARED_MEMORY", "0"}}, kTimeout);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("accelerator_state.pt'): File too large (the "
                                  "file-size limit, ulimit -f, is 204800 "
                                  "bytes)"))
      << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("signal 25")));
  const ProcessResult find =
      RunProcess({"/usr/bin/find", out, "-name", "*.partial*"}, {}, kTimeout);
  EXPECT_EQ(find.output, "");
  const ProcessResult start =
      RunProcess({"/bin/bash", "-c",
                  "ulimit -f 8; exec \"$0\" --num_processes=2 --epochs=1 "
                  "--main_process_port=0 --output_dir=\"$1\"",
                  Runfile("examples/train_demo"), out + "2"},
                 {}, kTimeout);
  EXPECT_EQ(start.exit_code, 1) << start.output;
  EXPECT_THAT(start.output,
              HasSubstr("sizing shared memory (counted against the file-size "
                        "limit): File too large (the file-size limit, ulimit "
                        "-f, is 8192 bytes)"));
}

// A second job writing into the same folder is refused on every rank,
// naming the first; once the first is gone (even by SIGKILL), the folder is
// free again.
TEST(ExamplesTest, ASecondJobInTheSameOutputFolderIsRefused) {
  const std::string out = MakeTempDir("two_jobs") + "/out";
  ProcessResult second;
  const ProcessResult first = RunProcess(
      {Runfile("examples/train_demo"), "--num_processes=2", "--epochs=50",
       "--sleep_per_step_ms=50", "--output_dir=" + out,
       "--main_process_port=0"},
      {}, kTimeout, [&](pid_t supervisor) {
        for (int i = 0; i < 3000 && ReadFile(out + "/accel.lock").empty();
             ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        second = RunExample("train_demo", {"--num_processes=2", "--epochs=1",
                                           "--output_dir=" + out});
        kill(-supervisor, SIGKILL);  // Its ranks die with it.
      });
  EXPECT_EQ(first.exit_code, 128 + SIGKILL) << first.output;
  EXPECT_EQ(second.exit_code, 1) << second.output;
  const std::string refusal =
      "project_dir '" + out + "' is in use by another job (pid ";
  EXPECT_THAT(second.output, HasSubstr("[rank 0/2] " + refusal))
      << second.output;
  EXPECT_THAT(second.output, HasSubstr("[rank 1/2] " + refusal));
  EXPECT_THAT(second.output, HasSubstr(": train_demo --num_processes=2"));
  // Nothing of the second job landed in the first job's checkpoints.
  EXPECT_THAT(second.output, ::testing::Not(HasSubstr("Epoch 1 - Accuracy")));
  for (int i = 0; i < 500 && !ChildrenOf(getpid()).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const ProcessResult third = RunExample(
      "train_demo",
      {"--num_processes=2", "--epochs=1", "--output_dir=" + out + "_third"});
  EXPECT_EQ(third.exit_code, 0) << third.output;
  const ProcessResult after = RunExample(
      "train_demo", {"--num_processes=2", "--epochs=1", "--output_dir=" + out});
  EXPECT_EQ(after.exit_code, 0) << after.output;
}

// The process the user started supervises its ranks as accel-launch, a
// small program run in its place: it does not keep LibTorch resident.
TEST(ExamplesTest, TheSupervisorOfASelfLaunchedJobIsSmall) {
  const std::string dir = MakeTempDir("supervisor");
  std::string name, status, zygote_name;
  size_t ranks = 0, children = 0;
  const ProcessResult r = RunProcess(
      {Runfile("examples/train_demo"), "--num_processes=2", "--epochs=2",
       "--sleep_per_step_ms=100", "--output_dir=" + dir + "/out",
       "--main_process_port=0"},
      {}, kTimeout, [&](pid_t supervisor) {
        // Once both ranks train, the supervisor has settled.
        for (int i = 0; i < 3000 && !Exists(dir + "/out/checkpoints"); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        const std::string proc = "/proc/" + std::to_string(supervisor);
        name = ReadFile(proc + "/comm");
        status = ReadFile(proc + "/status");
        ranks = RanksOf(supervisor).size();
        children = ChildrenOf(supervisor).size();
      });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ranks, 2u);
  EXPECT_EQ(children, 3u);  // And the zygote that forked them.
  EXPECT_EQ(name, "accel-launch\n");
  std::smatch rss;
  ASSERT_TRUE(std::regex_search(status, rss, std::regex("VmRSS:\\s+(\\d+) kB")))
      << status;
  EXPECT_LT(std::stol(rss[1]), 20 * 1024) << status;

  // It starts the ranks as the program would have: --backend=mpi through
  // mpirun.
  const ProcessResult mpi =
      RunExample("train_demo", {"--num_processes=2", "--backend=mpi",
                                "--epochs=1", "--output_dir=" + dir + "/mpi"});
  EXPECT_EQ(mpi.exit_code, 0) << mpi.output;
  EXPECT_THAT(mpi.output, HasSubstr("on 2 process(es) (mpi)"));

  // Asked to, it supervises in the program's own process, as before.
  const ProcessResult in_process = RunProcess(
      {Runfile("examples/train_demo"), "--num_processes=2", "--epochs=1",
       "--output_dir=" + dir + "/in_process", "--main_process_port=0"},
      {{"ACCEL_IN_PROCESS_LAUNCH", "1"}}, kTimeout);
  EXPECT_EQ(in_process.exit_code, 0) << in_process.output;
}

// A save killed before its last file (the only one, in the first epoch)
// left no checkpoint: --resume passes over it and starts afresh.
TEST(ExamplesTest, ResumeAfterAFirstSaveThatNeverFinishedStartsAfresh) {
  const std::string out = MakeTempDir("unfinished");
  const std::string unfinished = out + "/checkpoints/checkpoint_1";
  ASSERT_EQ(mkdir((out + "/checkpoints").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(unfinished.c_str(), 0755), 0);
  std::ofstream(unfinished + "/random_states_1.pt") << "half a save";
  const ProcessResult r = RunExample(
      "train_demo",
      {"--num_processes=2", "--epochs=1", "--resume", "--output_dir=" + out});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("skipped checkpoint " + unfinished +
                                  " (incomplete: its save did not finish)"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("Resumed from")));
  EXPECT_THAT(r.output, HasSubstr("Epoch 1 - Accuracy"));
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

// The final weights complete_example saved in `dir`/model.
std::map<std::string, torch::Tensor> Weights(const std::string& dir) {
  return LoadModelWeights(dir + "/model");
}

double MaxDifference(const std::map<std::string, torch::Tensor>& a,
                     const std::map<std::string, torch::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    worst = std::max(worst, (tensor - b.at(name)).abs().max().item<double>());
  }
  return worst;
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

TEST(ExamplesTest, CompleteExampleResumesInTheMiddleOfAnEpochBitForBit) {
  const std::string dir = MakeTempDir("complete_resume");
  const std::vector<std::string> common = {
      "--num_processes=2", "--checkpointing_steps=3",
      "--gradient_accumulation_steps=2", "--mixed_precision=bf16"};
  auto with = [&](std::vector<std::string> extra) {
    return Concat(common, std::move(extra));
  };
  const ProcessResult straight =
      RunExample("complete_example", with({"--output_dir=" + dir + "/a"}));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  // 10 optimizer steps per epoch: stopped after 4, saved after 3 (mid-epoch).
  const ProcessResult stopped =
      RunExample("complete_example",
                 with({"--output_dir=" + dir + "/b", "--stop_after_steps=4"}));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_THAT(stopped.output, HasSubstr("Stopped after 4 steps"));
  const ProcessResult resumed = RunExample(
      "complete_example", with({"--output_dir=" + dir + "/b", "--resume"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(
      resumed.output,
      HasSubstr("Resumed from " + dir +
                "/b/checkpoints/checkpoint_1 at epoch 1 after 72 samples"));
  const auto a = Weights(dir + "/a");
  const auto b = Weights(dir + "/b");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
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
