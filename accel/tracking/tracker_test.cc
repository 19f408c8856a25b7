// The tracker interface, its registry and --report_to parsing, the JSONL
// tracker, and the TFRecord framing the TensorBoard tracker uses.
#include "accel/tracking/tracker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "accel/runtime/base/errors.h"
#include "accel/tracking/jsonl_tracker.h"
#include "accel/tracking/tfrecord_writer.h"
#include "tests/subprocess.h"
#include "tests/usage_error.h"

namespace accel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::UsageErrorOf;

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

TEST(TrackerValueTest, KeepsTheTypeItWasGiven) {
  EXPECT_TRUE(TrackerValue(3).is_integer());
  EXPECT_TRUE(TrackerValue(int64_t{1} << 40).is_integer());
  EXPECT_TRUE(TrackerValue(size_t{7}).is_integer());
  EXPECT_TRUE(TrackerValue(0.5).is_real());
  EXPECT_TRUE(TrackerValue(0.5f).is_real());
  EXPECT_TRUE(TrackerValue(true).is_bool());
  EXPECT_TRUE(TrackerValue("adamw").is_string());
  EXPECT_TRUE(TrackerValue(std::string("adamw")).is_string());
  // Above int64's range an unsigned value stays positive.
  EXPECT_EQ(TrackerValue(std::numeric_limits<uint64_t>::max()).number(),
            18446744073709551615.0);
  EXPECT_EQ(TrackerValue(true).number(), 1);
  EXPECT_EQ(TrackerValue(-3).number(), -3);
}

TEST(TrackerValueTest, PrintsTheShortestFormThatReadsBack) {
  EXPECT_EQ(TrackerValue(3e-4).ToString(), "0.0003");
  EXPECT_EQ(TrackerValue(0.1 + 0.2).ToString(), "0.30000000000000004");
  EXPECT_EQ(TrackerValue(32).ToString(), "32");
  EXPECT_EQ(TrackerValue(false).ToString(), "false");
  EXPECT_EQ(TrackerValue(std::nan("")).ToString(), "nan");
  EXPECT_EQ(TrackerValue(-HUGE_VAL).ToString(), "-inf");
  EXPECT_EQ(TrackerValue("a b").ToString(), "a b");
}

TEST(TrackerValueTest, AStringIsNotANumber) {
  EXPECT_THAT(UsageErrorOf([] { TrackerValue("adamw").number(); }),
              HasSubstr("\"adamw\" is a string, not a number"));
  EXPECT_THAT(UsageErrorOf([] { TrackerValue(2).string(); }),
              HasSubstr("2 is not a string"));
}

TEST(ParseTrackerNamesTest, ReadsReportTo) {
  EXPECT_THAT(ParseTrackerNames("jsonl,tensorboard"),
              ElementsAre("jsonl", "tensorboard"));
  EXPECT_THAT(ParseTrackerNames(" jsonl , tensorboard "),
              ElementsAre("jsonl", "tensorboard"));
  EXPECT_THAT(ParseTrackerNames("all"), ElementsAre("all"));
  EXPECT_TRUE(ParseTrackerNames("").empty());
  EXPECT_TRUE(ParseTrackerNames("none").empty());
}

TEST(ParseTrackerNamesTest, RejectsEmptyNamesAndMixedAll) {
  EXPECT_THAT(UsageErrorOf([] { ParseTrackerNames("jsonl,,tensorboard"); }),
              HasSubstr("has an empty name"));
  EXPECT_THAT(UsageErrorOf([] { ParseTrackerNames("jsonl,"); }),
              HasSubstr("has an empty name"));
  EXPECT_THAT(UsageErrorOf([] { ParseTrackerNames("all,jsonl"); }),
              HasSubstr("\"all\" cannot be combined with other trackers"));
}

TEST(TrackerRegistryTest, ResolvesAllToTheLinkedTrackers) {
  // This test links only the jsonl tracker.
  EXPECT_THAT(ResolveTrackerNames({"all"}), ElementsAre("jsonl"));
  EXPECT_THAT(ResolveTrackerNames({"jsonl", "jsonl"}), ElementsAre("jsonl"));
  const std::string error = UsageErrorOf([] {
    ResolveTrackerNames({"jsonl", "wandb"});
  });
  EXPECT_THAT(error, HasSubstr("unknown tracker 'wandb'"));
  EXPECT_THAT(error, HasSubstr("linked trackers: jsonl"));
}

TEST(TrackerRegistryTest, RejectsDuplicateAndReservedNames) {
  auto factory = [](const TrackerContext&) -> std::unique_ptr<Tracker> {
    return nullptr;
  };
  EXPECT_THAT(UsageErrorOf([&] { RegisterTracker("jsonl", factory); }),
              HasSubstr("tracker 'jsonl' is registered twice"));
  EXPECT_THAT(UsageErrorOf([&] { RegisterTracker("all", factory); }),
              HasSubstr("neither \"all\" nor \"none\""));
  EXPECT_THAT(UsageErrorOf([&] { RegisterTracker("a,b", factory); }),
              HasSubstr("without commas"));
  RegisterTracker("returns_null", factory, /*needs_logging_dir=*/false);
  EXPECT_FALSE(TrackerNeedsLoggingDir("returns_null"));
  EXPECT_TRUE(TrackerNeedsLoggingDir("jsonl"));
  EXPECT_THAT(UsageErrorOf([] {
                CreateTracker("returns_null", {"p", ""});
              }),
              HasSubstr("the factory of tracker 'returns_null' returned null"));
}

TEST(TrackerRegistryTest, ATrackerThatWritesFilesNeedsALoggingDir) {
  EXPECT_THAT(UsageErrorOf([] {
                CreateTracker("jsonl", {"run", ""});
              }),
              HasSubstr("tracker 'jsonl' needs a logging directory: pass "
                        "--logging_dir=DIR"));
}

TEST(BlankTrackerTest, IgnoresEverything) {
  Tracker& blank = BlankTracker();
  blank.store_init_configuration({{"lr", 1.0}});
  blank.log({{"loss", 1.0}}, 3);
  blank.finish();
  EXPECT_EQ(blank.name(), "blank");
}

TEST(JsonlTrackerTest, WritesOneLinePerLogWithStepTimeAndTypedValues) {
  const std::string dir = testing::MakeTempDir("jsonl");
  std::unique_ptr<Tracker> tracker = CreateTracker("jsonl", {"run", dir});
  EXPECT_EQ(tracker->name(), "jsonl");
  tracker->store_init_configuration(
      {{"lr", 3e-4}, {"batch_size", 32}, {"optimizer", "adamw"}});
  tracker->log({{"loss", 0.25}, {"epoch", 1}, {"converged", false}}, 10);
  tracker->log({{"loss", std::nan("")}, {"note", "diverged"}}, 11);
  tracker->finish();

  const std::vector<nlohmann::json> lines =
      ReadLines(dir + "/run/metrics.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["config"],
            nlohmann::json::parse(
                R"({"lr": 0.0003, "batch_size": 32, "optimizer": "adamw"})"));
  EXPECT_EQ(lines[1]["step"], 10);
  EXPECT_EQ(lines[1]["values"],
            nlohmann::json::parse(
                R"({"loss": 0.25, "epoch": 1, "converged": false})"));
  EXPECT_TRUE(lines[1]["values"]["epoch"].is_number_integer());
  EXPECT_EQ(lines[2]["step"], 11);
  EXPECT_TRUE(lines[2]["values"]["loss"].is_null());  // NaN: JSON has none.
  EXPECT_EQ(lines[2]["values"]["note"], "diverged");
  for (const auto& line : lines) {
    const double wall_time = line["wall_time"].get<double>();
    EXPECT_GT(wall_time, 1.6e9);  // Seconds since the epoch, not since start.
  }
  EXPECT_LE(lines[1]["wall_time"].get<double>(),
            lines[2]["wall_time"].get<double>());
}

TEST(JsonlTrackerTest, AResumedRunAppendsToTheSameFile) {
  const std::string dir = testing::MakeTempDir("jsonl_resume");
  for (int64_t step : {1, 2}) {
    std::unique_ptr<Tracker> tracker = CreateTracker("jsonl", {"run", dir});
    tracker->log({{"loss", 1.0 / step}}, step);
    tracker->finish();
  }
  const std::vector<nlohmann::json> lines =
      ReadLines(dir + "/run/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[1]["step"], 2);
}

TEST(JsonlTrackerTest, AFolderThatCannotBeMadeIsAnErrorNamingIt) {
  const std::string dir = testing::MakeTempDir("jsonl_blocked");
  std::ofstream(dir + "/file") << "in the way";
  try {
    CreateTracker("jsonl", {"run", dir + "/file"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open '" + dir +
                                    "/file/run/metrics.jsonl' for logging"));
  }
}

TEST(JsonlTrackerTest, LoggingAfterFinishIsAnError) {
  const std::string dir = testing::MakeTempDir("jsonl_closed");
  std::unique_ptr<Tracker> tracker = CreateTracker("jsonl", {"run", dir});
  tracker->finish();
  tracker->finish();  // Twice is fine.
  try {
    tracker->log({{"loss", 1.0}}, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("was closed; cannot log to it"));
  }
}

TEST(TfRecordTest, Crc32cMatchesTheStandardCheckValues) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);  // The CRC catalogue's check.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);  // RFC 3720 B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
}

TEST(TfRecordTest, FrameIsLengthCrcDataCrc) {
  const std::string frame = TfRecordFrame("abc");
  ASSERT_EQ(frame.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(frame.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) {
      v = (v << 8) | static_cast<unsigned char>(frame[at + i]);
    }
    return v;
  };
  EXPECT_EQ(u32(8), MaskedCrc32c(frame.substr(0, 8)));
  EXPECT_EQ(frame.substr(12, 3), "abc");
  EXPECT_EQ(u32(15), MaskedCrc32c("abc"));
  const uint32_t crc = Crc32c("abc");
  EXPECT_EQ(MaskedCrc32c("abc"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace accel
