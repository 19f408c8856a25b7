// //examples:nd_parallel (Accelerate's nd_parallel.py) end to end on the
// Markov text: one process, tp 2 x dp_shard 2 and dp_shard 2 x cp 2 at 4,
// dp_replicate 2 x dp_shard 2 x tp 2 and dp_shard 2 x cp 2 x tp 2 at 8 end
// on the same loss and parameter norm (other summation orders: not the
// same bits); a checkpoint written at 4 with split layers resumes at 1
// process; the whole model is saved; bad meshes are refused by name.
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

ProcessResult RunNdParallel(const std::string& output_dir, int processes,
                            std::vector<std::string> args) {
  args.insert(
      args.begin(),
      {Runfile("examples/nd_parallel"), "--output_dir=" + output_dir,
       "--main_process_port=0", "--num_processes=" + std::to_string(processes),
       "--text=markov", "--max_steps=6", "--batch_size=8", "--block_size=32",
       "--n_layer=2", "--n_embd=32", "--print_every=3"});
  return RunProcess(args, {}, kTimeout);
}

double Number(const std::string& output, const std::string& pattern) {
  std::smatch found;
  if (!std::regex_search(output, found, std::regex(pattern))) {
    ADD_FAILURE() << "no '" << pattern << "' in:\n" << output;
    return 0;
  }
  return std::strtod(found[1].str().c_str(), nullptr);
}

double Norm(const ProcessResult& r) {
  return Number(r.output, "Parameter norm: ([0-9.e+-]+)");
}
double Loss(const ProcessResult& r) {
  return Number(r.output, "Step 6 loss ([0-9.]+)");
}

TEST(NdParallelExampleTest, EveryMeshTrainsTheSameModel) {
  const ProcessResult one = RunNdParallel(MakeTempDir("nd_one"), 1, {});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string four_dir = MakeTempDir("nd_four");
  const ProcessResult four = RunNdParallel(
      four_dir, 4,
      {"--tp_size=2", "--dp_shard_size=2", "--checkpointing_steps=3"});
  ASSERT_EQ(four.exit_code, 0) << four.output;
  EXPECT_THAT(four.output, HasSubstr("dp_replicate 1 x dp_shard 2 x cp 1 x "
                                     "tp 2 zero_stage 3"));
  // With Megatron's sequence parallelism inside the tp groups.
  const ProcessResult eight =
      RunNdParallel(MakeTempDir("nd_eight"), 8,
                    {"--dp_replicate_size=2", "--dp_shard_size=2",
                     "--tp_size=2", "--sequence_parallel"});
  ASSERT_EQ(eight.exit_code, 0) << eight.output;
  // Ulysses' context parallelism, alone and beside tensor parallelism.
  const ProcessResult context = RunNdParallel(
      MakeTempDir("nd_cp"), 4, {"--dp_shard_size=2", "--cp_size=2"});
  ASSERT_EQ(context.exit_code, 0) << context.output;
  const ProcessResult all =
      RunNdParallel(MakeTempDir("nd_cp_tp"), 8,
                    {"--dp_shard_size=2", "--cp_size=2", "--tp_size=2"});
  ASSERT_EQ(all.exit_code, 0) << all.output;
  for (const ProcessResult* run : {&four, &eight, &context, &all}) {
    EXPECT_NEAR(Loss(*run), Loss(one), 1e-5 * Loss(one));
    EXPECT_NEAR(Norm(*run), Norm(one), 1e-6 * Norm(one));
  }
  // Not vacuous: training moved the weights (6 steps of AdamW at 1e-3).
  const ProcessResult none =
      RunNdParallel(MakeTempDir("nd_none"), 1, {"--max_steps=1", "--lr=1e-9"});
  EXPECT_GT(std::abs(Norm(none) - Norm(one)), 1e-3 * Norm(one));
  // The whole model, joined from the shares.
  EXPECT_EQ(RunProcess({"/bin/ls", four_dir + "/model/model.safetensors"}, {},
                       kTimeout)
                .exit_code,
            0);
  // Saved after step 3 at tp 2 x dp_shard 2, resumed at one process.
  const ProcessResult resumed = RunNdParallel(
      MakeTempDir("nd_resumed"), 1,
      {"--resume_from=" + four_dir + "/checkpoints/checkpoint_1"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("at step 3"));
  EXPECT_NEAR(Norm(resumed), Norm(one), 1e-6 * Norm(one));
}

TEST(NdParallelExampleTest, RefusesBadMeshesByName) {
  struct Bad {
    int processes;
    std::vector<std::string> args;
    std::string message;
  };
  for (const Bad& bad : std::vector<Bad>{
           {4, {"--tp_size=3"}, "is 3 processes, but the job has 4"},
           {3, {"--cp_size=3"}, "give a cp_size dividing it"},
           {4, {"--tp_size=4", "--n_head=2"}, "n_head is 2"},
           {2,
            {"--tp_size=2", "--sequence_parallel", "--block_size=31"},
            "this rank's are 31 token(s) long"},
           {2,
            {"--dp_shard_size=2", "--sequence_parallel"},
            "--sequence_parallel splits each sequence over the "
            "tensor-parallel ranks, but tp_size is 1"},
           {2,
            {"--dp_shard_size=2", "--batch_size=3"},
            "multiple of the data-parallel ranks (2)"}}) {
    const ProcessResult r =
        RunNdParallel(MakeTempDir("nd_bad"), bad.processes, bad.args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.output, HasSubstr(bad.message));
  }
}

}  // namespace
}  // namespace accel::testing
