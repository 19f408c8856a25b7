// A checkpoint saved in the middle of an epoch resumes at any number of
// processes, every rank a real process: no sample of the epoch is skipped
// or trained twice (beyond even_batches' padding, which gather_for_metrics
// drops). Before, positions were batches per rank: saved at 2 processes
// after 3 steps, a resume at 3 never trained 12 of 64 samples, at 1 trained
// 12 twice.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

const auto kTimeout = std::chrono::seconds(60);

// The sample ids after "trained:" in a run's output.
std::vector<int64_t> Trained(const ProcessResult& r) {
  const size_t at = r.output.find("trained:");
  EXPECT_NE(at, std::string::npos) << r.output;
  std::istringstream line(
      r.output.substr(at + 8, r.output.find('\n', at) - at - 8));
  std::vector<int64_t> ids;
  for (int64_t id; line >> id;) ids.push_back(id);
  return ids;
}

ProcessResult RunWorker(int processes, std::vector<std::string> args) {
  args.insert(args.begin(), {Runfile("tests/resume_worker"),
                             "--num_processes=" + std::to_string(processes),
                             "--main_process_port=0"});
  return RunProcess(args, {}, kTimeout);
}

TEST(ResumeTest, AnEpochResumedAtAnotherProcessCountTrainsEverySampleOnce) {
  struct Case {
    int saved_at, resumed_at, samples;
    bool split;
    int saved_stage = 0, resumed_stage = 0;  // --zero_stage (0: DDP).
  };
  for (const Case& c : std::vector<Case>{{2, 3, 64, false},
                                         {2, 1, 64, false},
                                         {3, 2, 64, false},
                                         {1, 4, 30, false},
                                         {4, 2, 30, true},
                                         {2, 4, 64, true},
                                         // A sharded (ZeRO) checkpoint
                                         // at another count and stage.
                                         {2, 3, 64, false, 3, 0},
                                         {2, 1, 64, false, 3, 3},
                                         {2, 4, 64, false, 3, 1},
                                         {4, 2, 64, false, 3, 2}}) {
    const std::string where = "saved at " + std::to_string(c.saved_at) +
                              ", resumed at " + std::to_string(c.resumed_at) +
                              (c.split ? ", split_batches" : "") + ", stages " +
                              std::to_string(c.saved_stage) + " -> " +
                              std::to_string(c.resumed_stage);
    SCOPED_TRACE(where);
    const std::string dir = MakeTempDir("resume") + "/state";
    const std::vector<std::string> common = {
        "--dir=" + dir, "--samples=" + std::to_string(c.samples),
        std::string("--split_batches=") + (c.split ? "true" : "false"),
        c.split ? "--batch_size=8" : "--batch_size=4"};
    std::vector<std::string> first = common;
    first.push_back("--save_after_steps=3");
    first.push_back("--zero_stage=" + std::to_string(c.saved_stage));
    const ProcessResult saved = RunWorker(c.saved_at, first);
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
    std::vector<std::string> second = common;
    second.push_back("--resume");
    second.push_back("--zero_stage=" + std::to_string(c.resumed_stage));
    const ProcessResult resumed = RunWorker(c.resumed_at, second);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    std::vector<int64_t> all = Trained(saved);
    const std::vector<int64_t> rest = Trained(resumed);
    all.insert(all.end(), rest.begin(), rest.end());
    std::map<int64_t, int> count;
    for (int64_t id : all) ++count[id];
    EXPECT_EQ(all.size(), static_cast<size_t>(c.samples));
    EXPECT_EQ(count.size(), static_cast<size_t>(c.samples));
    for (const auto& [id, times] : count) {
      EXPECT_EQ(times, 1) << "sample " << id;
    }
  }
}

TEST(ResumeTest, ASplitBatchThatTheNewCountCannotDivideFailsBeforeAnyStep) {
  const std::string dir = MakeTempDir("indivisible") + "/state";
  const ProcessResult saved =
      RunWorker(2, {"--dir=" + dir, "--split_batches", "--batch_size=8",
                    "--save_after_steps=2"});
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const ProcessResult resumed = RunWorker(
      3, {"--dir=" + dir, "--split_batches", "--batch_size=8", "--resume"});
  EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
  for (const char* rank : {"rank 0/3", "rank 1/3", "rank 2/3"}) {
    EXPECT_THAT(resumed.output,
                HasSubstr(std::string("[") + rank +
                          "] DataLoader: with split_batches, batch_size (8) "
                          "must be a multiple of the number of processes (3)"))
        << resumed.output;
  }
  EXPECT_THAT(resumed.output, ::testing::Not(HasSubstr("trained:")));
}

// save_state returns on each rank only once the checkpoint is complete: a
// load right after it finds this save's files (on 3 of 3 tries rank 1 had
// returned while rank 0 still wrote its shared file, and its load found
// "'random_states_1.pt' comes from another save than 'accelerator_state.pt'").
TEST(ResumeTest, ALoadRightAfterASaveFindsTheCompleteCheckpoint) {
  for (int processes : {2, 3}) {
    const std::string dir = MakeTempDir("reload") + "/best";
    const ProcessResult r =
        RunWorker(processes, {"--dir=" + dir, "--reload_rounds=3",
                              "--ballast=4000000", "--samples=16"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Trained(r).size(), 16u) << r.output;
  }
}

}  // namespace
}  // namespace accel::testing
