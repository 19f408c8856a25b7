// The TensorBoard tracker's event files, read back independently: a Python
// reader (read_tensorboard_events.py) parses the TFRecord framing, checks
// every masked CRC, decodes the events with python3-protobuf from the same
// .proto files and compares each tag, step and value with a JSONL
// expectation written here by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/tracking/tensorboard_tracker.h"
#include "accel/tracking/tracker.h"
#include "tests/subprocess.h"

namespace accel {
namespace {

using ::testing::HasSubstr;
using testing::ProcessResult;

ProcessResult ReadBack(const std::string& events, const std::string& expect) {
  return testing::RunProcess(
      {"/usr/bin/python3",
       testing::Runfile("accel/tracking/read_tensorboard_events.py"),
       "--protoc=" + testing::Runfile("../accel_protobuf/bin/protoc"),
       "--proto_root=" + testing::Runfile(""),
       "--wkt_root=" + testing::Runfile("../accel_protobuf/include"),
       "--expect=" + expect, events},
      {}, std::chrono::seconds(120));
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The run the tests write, and what the reader must find in it.
constexpr char kExpected[] =
    R"({"config": {"lr": 0.0003, "batch_size": 32, "optimizer": "adamw", "shuffle": true}}
{"step": 1, "values": {"loss": 0.6931471805599453, "accuracy": 0.5}}
{"step": 2, "values": {"loss": 0.25, "accuracy": 0.75, "phase": "warmup done", "converged": false}}
{"step": 7, "values": {"loss": null, "lr": 1e-05, "samples_per_second": 1234.5}}
{"finished": true}
)";

std::string WriteRun(const std::string& dir) {
  std::unique_ptr<Tracker> tracker = CreateTracker("tensorboard", {"run", dir});
  EXPECT_EQ(tracker->name(), "tensorboard");
  tracker->store_init_configuration({{"lr", 3e-4},
                                     {"batch_size", 32},
                                     {"optimizer", "adamw"},
                                     {"shuffle", true}});
  tracker->log({{"loss", std::log(2.0)}, {"accuracy", 0.5}}, 1);
  tracker->log({{"loss", 0.25},
                {"accuracy", 0.75},
                {"phase", "warmup done"},
                {"converged", false}},
               2);
  tracker->log(
      {{"loss", std::nan("")}, {"lr", 1e-5}, {"samples_per_second", 1234.5}},
      7);
  tracker->finish();
  const std::string expect = dir + "/expected.jsonl";
  WriteFile(expect, kExpected);
  return expect;
}

std::string OnlyEventFile(const std::string& run_dir) {
  std::string found;
  for (const std::string& name : ListFolder(run_dir)) {
    if (name.rfind("events.out.tfevents.", 0) == 0) {
      EXPECT_TRUE(found.empty()) << "two event files";
      found = run_dir + "/" + name;
    }
  }
  return found;
}

TEST(TensorBoardTest, PythonReadsBackEveryCrcTagStepAndValue) {
  const std::string dir = testing::MakeTempDir("tensorboard");
  const std::string expect = WriteRun(dir);
  const ProcessResult r = ReadBack(dir + "/run", expect);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // file_version, hparams, three logs, session end: 6 records.
  EXPECT_THAT(r.output,
              HasSubstr("checked 1 files, 6 records, 6 length CRCs, 6 data "
                        "CRCs, 3 steps, 9 tags, 9 values, 4 hparams"));
  std::cout << r.output;
}

TEST(TensorBoardTest, TheFileIsNamedAsTensorFlowNamesIt) {
  const std::string dir = testing::MakeTempDir("tensorboard_name");
  WriteRun(dir);
  const std::string path = OnlyEventFile(dir + "/run");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_THAT(
      path, ::testing::MatchesRegex(".*/run/events\\.out\\.tfevents\\."
                                    "[0-9]{10}\\." +
                                    std::string(host) + "\\.[0-9]+\\.[0-9]+"));
}

// The reader can fail: a flipped byte, a cut file, a wrong value.
TEST(TensorBoardTest, TheReaderFindsAFlippedByte) {
  const std::string dir = testing::MakeTempDir("tensorboard_flip");
  const std::string expect = WriteRun(dir);
  const std::string path = OnlyEventFile(dir + "/run");
  std::string bytes = ReadFile(path);
  bytes[bytes.size() / 2] ^= 0x10;
  WriteFile(path, bytes);
  const ProcessResult r = ReadBack(path, expect);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, ::testing::MatchesRegex(
                            "(.|\n)*MISMATCH: .*(data|length) CRC(.|\n)*"));
}

TEST(TensorBoardTest, TheReaderFindsATruncatedFile) {
  const std::string dir = testing::MakeTempDir("tensorboard_cut");
  const std::string expect = WriteRun(dir);
  const std::string path = OnlyEventFile(dir + "/run");
  const std::string bytes = ReadFile(path);
  WriteFile(path, bytes.substr(0, bytes.size() - 3));
  const ProcessResult r = ReadBack(path, expect);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("truncated data"));
}

TEST(TensorBoardTest, TheReaderFindsAWrongValueStepOrHParam) {
  const std::string dir = testing::MakeTempDir("tensorboard_wrong");
  const std::string expect = WriteRun(dir);
  const std::string text = kExpected;
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"\"accuracy\": 0.75", "\"accuracy\": 0.76"},
      {"\"step\": 7", "\"step\": 8"},
      {"\"batch_size\": 32", "\"batch_size\": 33"},
      {"\"warmup done\"", "\"warmup\""},
      {"{\"finished\": true}\n", ""},
  };
  for (const auto& [from, to] : changes) {
    std::string changed = text;
    changed.replace(changed.find(from), from.size(), to);
    WriteFile(expect, changed);
    const ProcessResult r = ReadBack(dir + "/run", expect);
    EXPECT_EQ(r.exit_code, 1) << from << " -> " << to << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("MISMATCH")) << from;
  }
}

TEST(TensorBoardTest, AResumedRunAddsAFileThatTheReaderReadsInOrder) {
  const std::string dir = testing::MakeTempDir("tensorboard_resume");
  for (int64_t step : {1, 2}) {
    std::unique_ptr<Tracker> tracker =
        CreateTracker("tensorboard", {"run", dir});
    tracker->log({{"loss", 1.0 / step}}, step);
  }  // Not finished: no session end, as after a crash.
  WriteFile(dir + "/expected.jsonl",
            "{\"step\": 1, \"values\": {\"loss\": 1.0}}\n"
            "{\"step\": 2, \"values\": {\"loss\": 0.5}}\n");
  const ProcessResult r = ReadBack(dir + "/run", dir + "/expected.jsonl");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checked 2 files, 4 records"));
}

TEST(TensorBoardTest, AFolderThatCannotBeMadeIsAnErrorNamingIt) {
  const std::string dir = testing::MakeTempDir("tensorboard_blocked");
  WriteFile(dir + "/file", "in the way");
  try {
    CreateTracker("tensorboard", {"run", dir + "/file"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open '" + dir + "/file/run/"));
    EXPECT_THAT(e.what(), HasSubstr("for logging"));
  }
}

}  // namespace
}  // namespace accel
