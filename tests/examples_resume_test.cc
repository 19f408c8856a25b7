// The examples, end to end: a job that stops and goes on. Resumed
// training equals uninterrupted training bit for bit (--resume_from,
// --resume, mid-epoch, after a save that never finished), a killed rank is
// restarted (--max_restarts), a preempted job saves and leaves (exit code
// 75); and a job's surroundings change nothing they should not: a closed
// console or standard streams, a file-size limit, a second job in the same
// folder, the supervisor's size.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/example_runs.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

// `first`, then `then`.
std::vector<std::string> Concat(std::vector<std::string> first,
                                const std::vector<std::string>& then) {
  first.insert(first.end(), then.begin(), then.end());
  return first;
}

// Waits until `path` exists (at most 30 s).
void AwaitFile(const std::string& path) {
  for (int i = 0; i < 3000 && !Exists(path); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
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
// The limit is below each rank's shard file (about 159 KB at 2 processes).
TEST(ExamplesTest, AFileSizeLimitIsAnIoErrorNotASignal) {
  const std::string out = MakeTempDir("fsize") + "/out";
  const ProcessResult r =
      RunProcess({"/bin/bash", "-c",
                  "ulimit -f 100; exec \"$0\" --num_processes=2 --epochs=2 "
                  "--hidden=2000 --main_process_port=0 --output_dir=\"$1\"",
                  Runfile("examples/train_demo"), out},
                 {{"ACCEL_SHARED_MEMORY", "0"}}, kTimeout);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("-of-00002.safetensors'): File too large "
                                  "(the file-size limit, ulimit -f, is 102400 "
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

}  // namespace
}  // namespace accel::testing
