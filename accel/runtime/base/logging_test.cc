// accel's diagnostics: short notes by default, glog's format with --v, the
// rank on every line, one --v=2 line per collective, glog's flags obeyed.
#include "accel/runtime/base/logging.h"

#include <gflags/gflags.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/comm/communicator.h"
#include "tests/thread_ranks.h"

namespace accel {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

// What the body wrote to stderr.
template <typename Fn>
std::string Stderr(Fn&& body) {
  std::fflush(stderr);
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/stderrXXXXXX";
  const int file = mkstemp(path.data());
  const int saved = dup(2);
  dup2(file, 2);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path.c_str());
  return text.str();
}

// Sets glog flags for one test, as --v=... on the command line would.
class Flags {
 public:
  Flags(std::initializer_list<std::pair<const char*, const char*>> flags) {
    for (const auto& [name, value] : flags) {
      saved_.emplace_back(
          name, gflags::GetCommandLineFlagInfoOrDie(name).current_value);
      gflags::SetCommandLineOption(name, value);
    }
  }
  ~Flags() {
    for (const auto& [name, value] : saved_) {
      gflags::SetCommandLineOption(name.c_str(), value.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override { SetLogRank(-1, 0); }
  void TearDown() override { SetLogRank(-1, 0); }
};

TEST_F(LoggingTest, NotesAndWarningsAreOneShortLineByDefault) {
  const std::string out = Stderr([] {
    ACCEL_LOG(INFO) << "skipped checkpoint " << 3;
    ACCEL_LOG(WARNING) << "the store has no secret";
  });
  EXPECT_EQ(out,
            "accel: note: skipped checkpoint 3\n"
            "accel: warning: the store has no secret\n");
}

TEST_F(LoggingTest, EveryLineCarriesTheRankOnceItIsKnown) {
  SetLogRank(1, 2);
  EXPECT_EQ(RankLabel(), "rank 1/2");
  EXPECT_EQ(Stderr([] { ACCEL_LOG(INFO) << "hello"; }),
            "accel: note: [rank 1/2] hello\n");
  SetLogRank(0, 1);  // One process: no label.
  EXPECT_EQ(RankLabel(), "");
  EXPECT_EQ(Stderr([] { ACCEL_LOG(INFO) << "hello"; }), "accel: note: hello\n");
}

TEST_F(LoggingTest, VerboseLinesNeedTheirLevelAndAreNotEvaluatedOtherwise) {
  int evaluated = 0;
  auto count = [&evaluated] { return ++evaluated; };
  EXPECT_EQ(Stderr([&] { ACCEL_VLOG(1) << "joined " << count(); }), "");
  EXPECT_EQ(evaluated, 0);

  Flags verbose({{"v", "1"}});
  SetLogRank(0, 2);
  const std::string out = Stderr([&] {
    ACCEL_VLOG(1) << "joined " << count();
    ACCEL_VLOG(2) << "not at --v=1 " << count();
  });
  EXPECT_EQ(evaluated, 1);
  // glog's own prefix: severity, date, time, thread, file:line.
  EXPECT_THAT(out, ContainsRegex("^I[0-9]{8} [0-9:.]+ +[0-9]+ "
                                 "logging_test.cc:[0-9]+\\] \\[rank 0/2\\] "
                                 "joined 1\n$"));
  // With --v, notes line up with glog's format too.
  EXPECT_THAT(Stderr([] { ACCEL_LOG(WARNING) << "w"; }),
              ContainsRegex("^W[0-9]{8} .* logging_test.cc:[0-9]+\\] "
                            "\\[rank 0/2\\] w\n$"));
}

TEST_F(LoggingTest, MinloglevelHidesNotesThenWarnings) {
  {
    Flags quieter({{"minloglevel", "1"}});
    EXPECT_EQ(Stderr([] {
                ACCEL_LOG(INFO) << "note";
                ACCEL_LOG(WARNING) << "warning";
              }),
              "accel: warning: warning\n");
  }
  Flags quiet({{"minloglevel", "2"}});
  EXPECT_EQ(Stderr([] { ACCEL_LOG(WARNING) << "warning"; }), "");
}

TEST_F(LoggingTest, AccelLinesStayOutOfGlogsOwnOutput) {
  // glog itself, uninitialized, would announce "Logging before
  // InitGoogleLogging()": accel's lines do not go through it.
  const std::string out = Stderr([] { ACCEL_LOG(WARNING) << "mine"; });
  EXPECT_THAT(out, Not(HasSubstr("InitGoogleLogging")));
}

TEST_F(LoggingTest, VerboseTwoLogsEveryCollectiveOnceWithBytesAndTime) {
  Flags verbose({{"v", "2"}});
  const std::string out = Stderr([] {
    testing::RunRanks("gloo", 2, [](Communicator& comm) {
      std::vector<float> values(256, 1.0f);
      comm.allreduce(values.data(), values.size(), DType::kFloat32,
                     ReduceOp::kSum);
      std::vector<int64_t> all(2);
      const int64_t mine = comm.rank();
      comm.allgather(&mine, all.data(), 1, DType::kInt64);
      comm.barrier();
    });
  });
  // Two ranks, three collectives each.
  const auto lines = [&out](const std::string& pattern) {
    std::regex re(pattern);
    return std::distance(std::sregex_iterator(out.begin(), out.end(), re),
                         std::sregex_iterator());
  };
  EXPECT_EQ(lines("\\[gloo\\] allreduce #1 \\(logging_test.cc:[0-9]+\\): "
                  "allreduce sum float32 x 256, 1024 bytes, [0-9]+\\.[0-9]{3} "
                  "ms\n"),
            2)
      << out;
  EXPECT_EQ(lines("\\[gloo\\] allgather #2 \\(logging_test.cc:[0-9]+\\): "
                  "allgather int64 x 1, 8 bytes, [0-9.]+ ms\n"),
            2)
      << out;
  EXPECT_EQ(lines("\\[gloo\\] barrier #3 \\(logging_test.cc:[0-9]+\\): "
                  "barrier, 0 bytes, [0-9.]+ ms\n"),
            2)
      << out;
}

}  // namespace
}  // namespace accel
