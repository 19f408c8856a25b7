// accel-estimate-memory and accel-test run as a user runs them: the
// figures of docs/parallelism.md's table for a size and for a weights file,
// accel-test passing at 2 processes in seconds, and a clear error for bad input
// to each.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <regex>

#include "accel/checkpoint/model_weights.h"
#include "accel/checkpoint/safetensors.h"
#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// accel-test must answer well within this on 2 cores (it takes about a
// second); a hang fails here instead of blocking CI.
const auto kTimeout = std::chrono::seconds(60);

ProcessResult RunTool(const std::string& tool, std::vector<std::string> args) {
  args.insert(args.begin(), Runfile("tools/" + tool));
  return RunProcess(args, {}, kTimeout);
}

size_t Count(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos;
       at = text.find(part, at + 1)) {
    ++count;
  }
  return count;
}

TEST(EstimateMemoryTest, ParametersGiveTheReadmeTable) {
  const ProcessResult r = RunTool("estimate_memory", {"--parameters=1.3B"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1,300,000,000 parameters"));
  // 16, 4 + 4 + 8/N, 4 + 12/N and 16/N bytes times 1.3e9, in GiB, at 1, 2,
  // 4 and 8 processes; the same in each precision's table.
  for (const std::string row : {
           "0 (DDP)            16.00    19.4 GiB     16.00    19.4 GiB     "
           "16.00    19.4 GiB     16.00    19.4 GiB\n",
           "1 (ZeRO 1)         16.00    19.4 GiB     12.00    14.5 GiB     "
           "10.00    12.1 GiB      9.00    10.9 GiB\n",
           "2 (ZeRO 2)         16.00    19.4 GiB     10.00    12.1 GiB      "
           "7.00     8.5 GiB      5.50     6.7 GiB\n",
           "3 (ZeRO 3)*        16.00    19.4 GiB      8.00     9.7 GiB      "
           "4.00     4.8 GiB      2.00     2.4 GiB\n",
       }) {
    EXPECT_EQ(Count(r.output, row), 3u) << row << "in:\n" << r.output;
  }
  for (const std::string precision :
       {"--mixed_precision=no (fp32)", "--mixed_precision=bf16",
        "--mixed_precision=fp16"}) {
    EXPECT_THAT(r.output, HasSubstr(precision + "\n"));
  }
  EXPECT_THAT(r.output, HasSubstr("keeps fp32 parameters"));
  EXPECT_THAT(r.output, HasSubstr("Not counted: activations"));
}

TEST(EstimateMemoryTest, CountsAWeightsFileFromItsHeader) {
  const std::string dir = MakeTempDir("weights");
  // 64,000 + 10 parameters; the int64 buffer is not one.
  safetensors::Save({{"embed.weight", torch::zeros({1000, 64})},
                     {"out.bias", torch::zeros({10}, torch::kBFloat16)},
                     {"position_ids", torch::zeros({7}, torch::kLong)}},
                    dir + "/model.safetensors");
  const ProcessResult r =
      RunTool("estimate_memory", {"--model=" + dir + "/model.safetensors",
                                  "--num_processes=4", "--mixed_precision=no"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("64,010 parameters (" + dir +
                                  "/model.safetensors):\n  2 floating-point "
                                  "tensors (BF16, F32"));
  EXPECT_THAT(r.output, HasSubstr("1 integer or bool tensors (7 elements)"));
  // 16 x 64,010 = 1,024,160 bytes; 4 x 64,010 = 256,040.
  EXPECT_THAT(r.output, HasSubstr("0 (DDP)            16.00  1000.2 KiB\n"));
  EXPECT_THAT(r.output, HasSubstr("3 (ZeRO 3)*         4.00   250.0 KiB\n"));
  EXPECT_THAT(r.output, Not(HasSubstr("--mixed_precision=bf16")));
  EXPECT_THAT(r.output, HasSubstr("3 x 4 bytes x 64,000 elements = 750.0 KiB"));

  // The folder save_model writes, sharded, counts the same.
  torch::nn::Linear linear(300, 100);
  const std::string sharded = MakeTempDir("sharded");
  SaveModelWeights(*linear, sharded, "50KB");
  const ProcessResult folder =
      RunTool("estimate_memory", {"--model=" + sharded, "--num_processes=2"});
  ASSERT_EQ(folder.exit_code, 0) << folder.output;
  EXPECT_THAT(folder.output, HasSubstr("30,100 parameters"));
}

TEST(EstimateMemoryTest, BadInputIsOneErrorLine) {
  ProcessResult r = RunTool("estimate_memory", {"--parameters=12X"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("error: --parameters: expected a whole number of "
                        "parameters, plain or with K, M, B or G"));
  EXPECT_THAT(r.output, HasSubstr("found '12X'"));
  r = RunTool("estimate_memory",
              {"--model=" + MakeTempDir("empty") + "/absent"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("error: --model: cannot read"));
  r = RunTool("estimate_memory", {"--parameters=1B", "--num_processes=0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("error: --num_processes: expected"));
  r = RunTool("estimate_memory", {"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--parameters=\"\""));
  // Its own flags, not LibTorch's hundreds.
  EXPECT_LT(Count(r.output, "\n"), 15u) << r.output;
}

TEST(SelfTestTest, PassesAtTwoProcessesInSeconds) {
  const ProcessResult r = RunTool("self_test", {});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.timed_out);
  EXPECT_THAT(r.output, HasSubstr("accel-test: 2 processes, backend gloo"));
  EXPECT_THAT(r.output, HasSubstr("PASS process state: ranks 0, 1 of 2"));
  EXPECT_THAT(r.output, HasSubstr("PASS reduce: sum 3, mean 1.5\n"));
  EXPECT_THAT(r.output,
              HasSubstr("PASS gather_for_metrics: each of the 13 samples "
                        "exactly once (gather gave 16)"));
  EXPECT_THAT(r.output, HasSubstr("PASS DDP: equal to one process"));
  EXPECT_THAT(r.output, HasSubstr("accel-test: PASS (10 checks in "));
  EXPECT_EQ(Count(r.output, "\nPASS "), 10u) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("FAIL")));
  // The checkpoint's temporary folder is gone.
  std::smatch folder;
  ASSERT_TRUE(std::regex_search(r.output, folder,
                                std::regex("bit for bit; (\\S+) removed")))
      << r.output;
  struct stat info;
  EXPECT_NE(stat(folder[1].str().c_str(), &info), 0) << folder[1];
  EXPECT_LT(r.elapsed, kTimeout);
}

TEST(SelfTestTest, BadInputIsOneErrorLine) {
  ProcessResult r = RunTool("self_test", {"--zero_stage=2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("error: accel-test takes --num_processes, --backend "
                        "and --main_process_port (--help), found "
                        "'--zero_stage=2'"));
  r = RunTool("self_test", {"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--num_processes=2"));
  EXPECT_LT(Count(r.output, "\n"), 15u) << r.output;
}

}  // namespace
}  // namespace accel::testing
