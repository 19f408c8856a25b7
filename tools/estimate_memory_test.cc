// accel-estimate-memory's arithmetic and parsing (tools/memory_estimate.h):
// docs/parallelism.md's bytes per parameter at every stage, the flags' values
// and their errors, the report's figures, and counting a weights file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "accel/checkpoint/model_weights.h"
#include "accel/checkpoint/safetensors.h"
#include "accel/runtime/base/errors.h"
#include "tests/subprocess.h"
#include "tests/tensor_files.h"
#include "tools/memory_estimate.h"

namespace accel::memory_estimate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseParameterCountTest, AcceptsIntegersAndSuffixes) {
  EXPECT_EQ(ParseParameterCount("350000"), 350000);
  EXPECT_EQ(ParseParameterCount("1"), 1);
  EXPECT_EQ(ParseParameterCount("125M"), 125'000'000);
  EXPECT_EQ(ParseParameterCount("125m"), 125'000'000);
  EXPECT_EQ(ParseParameterCount("1.3B"), 1'300'000'000);
  EXPECT_EQ(ParseParameterCount("1.30b"), 1'300'000'000);
  EXPECT_EQ(ParseParameterCount("7G"), 7'000'000'000);
  EXPECT_EQ(ParseParameterCount("2.5K"), 2500);
  EXPECT_EQ(ParseParameterCount("0.5k"), 500);
  EXPECT_EQ(ParseParameterCount("1.000K"), 1000);
  // Exactly, with no floating-point rounding: 0.1 has no exact double.
  EXPECT_EQ(ParseParameterCount("123456789.123456789B"),
            123'456'789'123'456'789);
  EXPECT_EQ(ParseParameterCount("9223372036854775807"),
            std::numeric_limits<int64_t>::max());
}

TEST(ParseParameterCountTest, RejectsEverythingElseNamingTheFlag) {
  for (const std::string bad :
       {"", "-5", "+5", "1.3", "1.2345K", "1e9", "12X", "1.3T", "K", ".5B",
        "1.B", " 125M", "125M ", "1,000", "1.2.3B", "0x10"}) {
    EXPECT_THAT([&] { ParseParameterCount(bad); },
                ::testing::ThrowsMessage<UsageError>(::testing::AllOf(
                    HasSubstr("--parameters: expected a whole number"),
                    HasSubstr("found '" + bad + "'"))))
        << bad;
  }
  // Well formed, but no model: said so, not "expected a whole number".
  for (const std::string zero : {"0", "0K"}) {
    EXPECT_THAT([&] { ParseParameterCount(zero); },
                ::testing::ThrowsMessage<UsageError>(
                    HasSubstr("a model has at least 1 parameter")))
        << zero;
  }
  for (const std::string huge :
       {"9223372036854775808", "10000000000B", "18446744073G"}) {
    EXPECT_THAT([&] { ParseParameterCount(huge); },
                ::testing::ThrowsMessage<UsageError>(
                    HasSubstr("is more than the 9.2e18 parameters")))
        << huge;
  }
}

TEST(ParseProcessCountsTest, ListsInOrder) {
  EXPECT_THAT(ParseProcessCounts("1,2,4,8"), ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(ParseProcessCounts("16"), ElementsAre(16));
  EXPECT_THAT(ParseProcessCounts("8,2,8"), ElementsAre(8, 2));
  for (const std::string bad :
       {"", "0", "1,", ",1", "1,,2", "two", "-1", "1000001", "2 ,4", "1.5"}) {
    EXPECT_THAT([&] { ParseProcessCounts(bad); },
                ::testing::ThrowsMessage<UsageError>(::testing::AllOf(
                    HasSubstr("--num_processes: expected a comma-separated"),
                    HasSubstr("found '" + bad + "'"))))
        << bad;
  }
}

TEST(ParsePrecisionsTest, NamesOrAll) {
  EXPECT_THAT(ParsePrecisions("all"), ElementsAre("no", "bf16", "fp16"));
  EXPECT_THAT(ParsePrecisions("bf16"), ElementsAre("bf16"));
  EXPECT_THAT(ParsePrecisions("no"), ElementsAre("no"));
  EXPECT_THAT([] { ParsePrecisions("fp8"); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("--mixed_precision: expected one of no, bf16, "
                            "fp16, all; found 'fp8'")));
}

// docs/parallelism.md's table "model-state bytes per parameter (fp32 AdamW, N
// ranks)", term by term.
TEST(BytesPerParameterTest, FollowsTheReadmeTable) {
  for (const int n : {1, 2, 3, 4, 8, 64}) {
    EXPECT_DOUBLE_EQ(BytesPerParameter(0, n), 16) << n;
    EXPECT_DOUBLE_EQ(BytesPerParameter(1, n), 4 + 4 + 8.0 / n) << n;
    EXPECT_DOUBLE_EQ(BytesPerParameter(2, n), 4 + 4.0 / n + 8.0 / n) << n;
    EXPECT_DOUBLE_EQ(BytesPerParameter(3, n), 16.0 / n) << n;
    EXPECT_DOUBLE_EQ(BytesPerParameter(3, n, 24), 16.0 / n + 12.0 / 24) << n;
  }
  EXPECT_DOUBLE_EQ(BytesPerParameter(1, 4), 10);
  EXPECT_DOUBLE_EQ(BytesPerParameter(2, 4), 7);
  EXPECT_DOUBLE_EQ(BytesPerParameter(3, 2, 24), 8.5);
  // One unit: nothing to prefetch, its parameters and gradients (8/L).
  EXPECT_DOUBLE_EQ(BytesPerParameter(3, 2, 1), 8 + 8);
  // The units do not change stages 0-2.
  EXPECT_DOUBLE_EQ(BytesPerParameter(2, 4, 8), 7);
  EXPECT_THROW(BytesPerParameter(4, 2), UsageError);
  EXPECT_THROW(BytesPerParameter(-1, 2), UsageError);
  EXPECT_THROW(BytesPerParameter(1, 0), UsageError);
}

TEST(HumanBytesTest, BinaryUnitsOneDecimal) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(2.0 * (1 << 30)), "2.0 GiB");
  EXPECT_EQ(HumanBytes(16.0 * 1.3e9), "19.4 GiB");
  // Rounded into the next unit rather than printed as 1024.0.
  EXPECT_EQ(HumanBytes(1024.0 * 1024 - 10), "1.0 MiB");
  EXPECT_EQ(HumanBytes(1024.0 * 1024 * 1024 * 1024 * 3), "3.0 TiB");
}

TEST(ReportTest, TablesPerPrecisionWithTheFigures) {
  EstimateOptions options;
  options.process_counts = {1, 2, 4, 8};
  const std::string report =
      Report(ModelOfSize(1'300'000'000, "--parameters=1.3B"), options);
  EXPECT_THAT(report,
              HasSubstr("1,300,000,000 parameters (--parameters=1.3B)"));
  for (const std::string precision : {"no (fp32)", "bf16", "fp16"}) {
    EXPECT_THAT(report, HasSubstr("--mixed_precision=" + precision + "\n"));
  }
  // Stage 0 everywhere 16 bytes = 19.4 GiB; stage 3 at 8 processes 2 bytes
  // = 2.4 GiB; stage 2 at 4: 7 bytes = 8.5 GiB; stage 1 at 2: 12 = 14.5 GiB.
  EXPECT_THAT(report, HasSubstr("0 (DDP)            16.00    19.4 GiB"));
  EXPECT_THAT(report, HasSubstr("   2.00     2.4 GiB\n"));
  EXPECT_THAT(report, HasSubstr("   7.00     8.5 GiB"));
  EXPECT_THAT(report, HasSubstr("  12.00    14.5 GiB"));
  EXPECT_THAT(report, HasSubstr("3 (ZeRO 3)*"));
  EXPECT_THAT(report, HasSubstr("give --units=L to add it"));
  EXPECT_THAT(report, HasSubstr("keeps fp32 parameters"));
  EXPECT_THAT(report, HasSubstr("Not counted: activations"));
  EXPECT_THAT(report, HasSubstr("the fp16 loss scaler"));

  // One precision, other counts, with the units: 16/2 + 12/24 = 8.5.
  options.process_counts = {2};
  options.precisions = {"bf16"};
  options.units = 24;
  const std::string bf16 =
      Report(ModelOfSize(1000, "--parameters=1K"), options);
  EXPECT_THAT(bf16, Not(HasSubstr("--mixed_precision=no")));
  EXPECT_THAT(bf16, HasSubstr("--mixed_precision=bf16\n"));
  EXPECT_THAT(bf16, HasSubstr("3 (ZeRO 3)          8.50     8.3 KiB\n"));
  EXPECT_THAT(bf16, HasSubstr("12/L with L = 24 units (0.50 bytes"));
  EXPECT_THAT(bf16, Not(HasSubstr("4 processes")));
}

TEST(ModelFromWeightsTest, CountsFloatingPointTensorsFromTheHeaders) {
  const std::string dir = testing::MakeTempDir("weights");
  // 10x20 + 20 floats, 5 bf16 values, and an int64 buffer of 3.
  safetensors::Save({{"layer.weight", torch::zeros({10, 20})},
                     {"layer.bias", torch::zeros({20})},
                     {"norm.scale", torch::zeros({5}, torch::kBFloat16)},
                     {"steps", torch::zeros({3}, torch::kLong)}},
                    dir + "/model.safetensors");
  for (const std::string& path : {dir, dir + "/model.safetensors"}) {
    const Model model = ModelFromWeights(path);
    EXPECT_EQ(model.parameters, 225) << path;
    EXPECT_EQ(model.largest_parameter, 200) << path;
    EXPECT_EQ(model.source, path);
    EXPECT_THAT(model.details,
                HasSubstr("3 floating-point tensors (BF16, F32"));
    EXPECT_THAT(model.details, HasSubstr("1 integer or bool tensors (3 "));
  }
  // Stage 2's transient from the largest tensor: 3 x 4 bytes x 200.
  EXPECT_THAT(Report(ModelFromWeights(dir), EstimateOptions()),
              HasSubstr("3 x 4 bytes x 200 elements = 2.3 KiB here."));
  // Shards and their index count the same.
  torch::nn::Linear linear(300, 100);
  const std::string sharded = testing::MakeTempDir("sharded");
  SaveModelWeights(*linear, sharded, "50KB");
  EXPECT_EQ(
      ModelFromWeights(sharded + "/model.safetensors.index.json").parameters,
      300 * 100 + 100);
  EXPECT_EQ(ModelFromWeights(sharded).parameters, 300 * 100 + 100);

  EXPECT_THAT([&] { ModelFromWeights(dir + "/absent.safetensors"); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "--model: cannot read '" + dir + "/absent.safetensors'")));
  // A file that is not safetensors is the reader's CheckpointError.
  testing::WriteBytes(dir + "/junk.safetensors", "junk");
  EXPECT_THROW(ModelFromWeights(dir + "/junk.safetensors"), CheckpointError);
  safetensors::Save({{"ids", torch::zeros({4}, torch::kLong)}},
                    dir + "/ints.safetensors");
  EXPECT_THAT([&] { ModelFromWeights(dir + "/ints.safetensors"); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("holds no floating-point tensor")));
}

}  // namespace
}  // namespace accel::memory_estimate
