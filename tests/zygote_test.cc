// End-to-end tests of the zygote (accel/runtime/launch/zygote.h): a
// self-launching LibTorch program forks its ranks from the loaded program,
// and each gets what an exec'd rank would.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const auto kTimeout = std::chrono::seconds(120);

std::string Program() { return Runfile("tests/zygote_program"); }

struct RankLine {
  int rank, loaded, self, parent, threads, blas_threads;
  std::string name;
  double gather;
};

std::vector<RankLine> RankLines(const std::string& output) {
  const std::regex line(
      R"(rank (\d+)/\d+: loaded in pid (\d+), runs as pid (\d+), parent )"
      R"((\d+), name (\S+), torch threads (\d+), blas threads (-?\d+), )"
      R"(gather (\S+))");
  std::vector<RankLine> lines;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    lines.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]),
                     std::stoi(m[4]), std::stoi(m[6]), std::stoi(m[7]), m[5],
                     std::stod(m[8])});
  }
  return lines;
}

// Runs `command`, a job of two ranks, into *result; its rank lines, or
// none (and a test failure) when it fails.
std::vector<RankLine> RunTwoRanks(const std::vector<std::string>& command,
                                  const std::map<std::string, std::string>& env,
                                  ProcessResult* result) {
  *result = RunProcess(command, env, kTimeout);
  EXPECT_EQ(result->exit_code, 0) << result->output;
  if (result->exit_code != 0) return {};
  return RankLines(result->output);
}

// Processes named accel-zygote whose command line holds `marker`.
std::vector<pid_t> Zygotes(const std::string& marker) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  while (dirent* entry = proc ? readdir(proc) : nullptr) {
    const pid_t pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    const std::string dir = "/proc/" + std::to_string(pid);
    if (ReadFile(dir + "/comm") == "accel-zygote\n" &&
        ReadFile(dir + "/cmdline").find(marker) != std::string::npos &&
        ProcessAlive(pid)) {
      found.push_back(pid);
    }
  }
  if (proc) closedir(proc);
  return found;
}

class ZygoteTest : public ::testing::Test {
 protected:
  // The launcher's value must be what the ranks see, not the test's.
  void SetUp() override { unsetenv("OMP_NUM_THREADS"); }
};

TEST_F(ZygoteTest, RanksAreForkedFromTheLoadedProgramWithTheirThreads) {
  for (const int threads : {1, 2}) {
    ProcessResult r;
    const std::vector<RankLine> lines = RunTwoRanks(
        {Program(), "--num_processes=2", "--main_process_port=0",
         "--num_cpu_threads_per_process=" + std::to_string(threads)},
        {}, &r);
    ASSERT_EQ(lines.size(), 2u) << r.output;
    for (const RankLine& line : lines) {
      // Loaded once, by the process that now supervises (exec keeps the
      // pid): the ranks are its children but never ran the loader.
      EXPECT_EQ(line.loaded, line.parent) << r.output;
      EXPECT_NE(line.loaded, line.self) << r.output;
      EXPECT_EQ(line.name, "zygote_program") << r.output;
      EXPECT_EQ(line.threads, threads) << r.output;
      EXPECT_EQ(line.blas_threads, threads) << r.output;
      EXPECT_EQ(line.gather, 1.0) << r.output;  // 0 + 1
    }
  }
}

// Each rank's "rank R signals: ..." line, in rank order.
std::vector<std::string> SignalLines(const std::string& output) {
  const std::regex line(R"(rank (\d+) signals: ([^\n]*))");
  std::map<int, std::string> by_rank;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    by_rank[std::stoi((*it)[1])] = (*it)[2];
  }
  std::vector<std::string> lines;
  for (const auto& [rank, text] : by_rank) lines.push_back(text);
  return lines;
}

// Started as a script's `nohup ... &` would start it, through a symlink,
// with SIGUSR2 blocked and OPENBLAS_NUM_THREADS set, forked and exec'd ranks
// must agree: the file's name, exec's signal dispositions and mask, each
// library's thread count.
TEST_F(ZygoteTest, ForkedRanksStartAsExecdOnes) {
  const std::string link = MakeTempDir("zygote_link") + "/zp-link";
  ASSERT_EQ(symlink(Program().c_str(), link.c_str()), 0);
  // sh's `trap ""` ignores a signal, and exec keeps it ignored.
  const std::vector<std::string> command = {
      "/bin/sh",
      "-c",
      "trap '' QUIT HUP USR1; exec \"$0\" \"$@\"",
      link,
      "--num_processes=2",
      "--main_process_port=0",
      "--num_cpu_threads_per_process=2"};
  std::map<std::string, std::vector<std::string>> signals;
  // Blocked in this thread, inherited by the program (fork keeps the mask).
  sigset_t usr2, before;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, &before);
  struct RestoreMask {
    sigset_t mask;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{before};
  for (const char* zygote : {"1", "0"}) {
    ProcessResult r;
    const std::vector<RankLine> lines = RunTwoRanks(
        command, {{"ACCEL_ZYGOTE", zygote}, {"OPENBLAS_NUM_THREADS", "1"}}, &r);
    ASSERT_EQ(lines.size(), 2u) << r.output;
    for (const RankLine& line : lines) {
      EXPECT_EQ(line.loaded == line.parent, std::string(zygote) == "1")
          << r.output;
      EXPECT_EQ(line.name, "zygote_program") << r.output;
      EXPECT_EQ(line.threads, 2) << r.output;
      EXPECT_EQ(line.blas_threads, 1) << r.output;
    }
    signals[zygote] = SignalLines(r.output);
    ASSERT_EQ(signals[zygote].size(), 2u) << r.output;
  }
  // The launcher passes QUIT and USR1 on, so exec resets them; a SIGHUP
  // ignored at the start stays ignored (nohup).
  for (const std::string& line : signals["1"]) {
    EXPECT_EQ(line,
              "INT=dfl TERM=dfl HUP=ign QUIT=dfl USR1=dfl USR2=dfl/blocked");
  }
  EXPECT_EQ(signals["1"], signals["0"]);
}

// OpenBLAS's count as OpenBLAS itself reads it in an exec'd rank: 0 passes
// to the next variable, and a count is capped at the CPUs the rank may use.
TEST_F(ZygoteTest, BlasThreadsFollowOpenBlasRules) {
  struct Case {
    std::vector<std::string> prefix;
    std::map<std::string, std::string> env;
    int threads, blas_threads;
  };
  const Case cases[] = {
      {{}, {{"OPENBLAS_NUM_THREADS", "0"}}, 1, 1},
      {{"/usr/bin/taskset", "-c", "0"}, {}, 2, 1},
  };
  for (const Case& c : cases) {
    for (const char* zygote : {"1", "0"}) {
      std::vector<std::string> command = c.prefix;
      command.insert(
          command.end(),
          {Program(), "--num_processes=2", "--main_process_port=0",
           "--num_cpu_threads_per_process=" + std::to_string(c.threads)});
      std::map<std::string, std::string> env = c.env;
      env["ACCEL_ZYGOTE"] = zygote;
      ProcessResult r;
      const std::vector<RankLine> lines = RunTwoRanks(command, env, &r);
      ASSERT_EQ(lines.size(), 2u) << r.output;
      for (const RankLine& line : lines) {
        EXPECT_EQ(line.threads, c.threads) << r.output;
        EXPECT_EQ(line.blas_threads, c.blas_threads) << r.output;
      }
    }
  }
}

TEST_F(ZygoteTest, AccelZygoteZeroExecsEachRankAsBefore) {
  ProcessResult r;
  const std::vector<RankLine> lines =
      RunTwoRanks({Program(), "--num_processes=2", "--main_process_port=0",
                   "--num_cpu_threads_per_process=1"},
                  {{"ACCEL_ZYGOTE", "0"}}, &r);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const RankLine& line : lines) {
    EXPECT_EQ(line.loaded, line.self) << r.output;
    EXPECT_EQ(line.threads, 1) << r.output;
    EXPECT_EQ(line.blas_threads, 1) << r.output;
  }
}

TEST_F(ZygoteTest, RestartedRanksAreForkedAgain) {
  const ProcessResult r =
      RunProcess({Program(), "--num_processes=2", "--main_process_port=0",
                  "--max_restarts=1", "--fail_rank=1"},
                 {}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 fails on purpose"));
  EXPECT_THAT(r.output, HasSubstr("restarting all ranks (restart 1 of 1"));
  const std::vector<RankLine> lines = RankLines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;  // Only the second attempt's.
  for (const RankLine& line : lines) {
    EXPECT_EQ(line.loaded, line.parent) << r.output;
  }
}

TEST_F(ZygoteTest, NothingOutlivesTheJobEvenWhenTheLauncherIsKilled) {
  const std::string marker = MakeTempDir("zygote_kill");
  std::vector<pid_t> during;
  const ProcessResult r = RunProcess(
      {Program(), "--num_processes=2", "--main_process_port=0",
       "--pid_dir=" + marker},
      {}, kTimeout, [&](pid_t launcher) {
        for (int i = 0; i < 1000 && ReadPidFiles(marker).size() < 2; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        during = Zygotes(marker);
        kill(launcher, SIGKILL);
      });
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_EQ(during.size(), 1u) << r.output;
  const std::vector<pid_t> ranks = ReadPidFiles(marker);
  ASSERT_EQ(ranks.size(), 2u) << r.output;
  bool any = true;
  for (int i = 0; i < 250 && any; ++i) {
    any = !Zygotes(marker).empty();
    for (const pid_t pid : ranks) any |= ProcessAlive(pid);
    if (any) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(any) << "a rank or the zygote survived the launcher";
}

// Waits until `dir` holds `count` pid files; false after 20 s.
bool WaitForPidFiles(const std::string& dir, size_t count) {
  for (int i = 0; i < 1000; ++i) {
    if (ReadPidFiles(dir).size() >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Runs a 2-rank job that may restart once. When both ranks have started,
// sends the zygote `to_zygote` and kills rank 1, so that the launcher asks
// the zygote again; then `after(launcher)` runs and, if it returns true,
// the launcher gets SIGTERM once the restarted ranks run. Sets *zygote to
// the zygote's pid.
ProcessResult RestartWithZygote(int to_zygote, pid_t* zygote,
                                const std::function<bool(pid_t)>& after) {
  const std::string marker = MakeTempDir("zygote_restart");
  return RunProcess(
      {Program(), "--num_processes=2", "--main_process_port=0",
       "--max_restarts=1", "--pid_dir=" + marker},
      {}, kTimeout, [&](pid_t launcher) {
        if (!WaitForPidFiles(marker, 2)) return;
        const std::vector<pid_t> zygotes = Zygotes(marker);
        if (zygotes.size() != 1) return;
        *zygote = zygotes[0];
        kill(*zygote, to_zygote);
        const pid_t rank1 = std::atoi(ReadFile(marker + "/rank1.pid").c_str());
        for (const char* file : {"/rank0.pid", "/rank1.pid"}) {
          unlink((marker + file).c_str());
        }
        kill(rank1, SIGKILL);  // The launcher restarts both ranks.
        if (after(launcher) && WaitForPidFiles(marker, 2)) {
          kill(launcher, SIGTERM);
        }
      });
}

// A program whose file is deleted as it starts (rebuilt): the launcher, run
// from memory, must still exec the program's own file, not itself.
TEST_F(ZygoteTest, ExecdRanksRunTheProgramEvenOnceItsFileIsDeleted) {
  const std::string copy = MakeTempDir("zygote_deleted") + "/zp-copy";
  ASSERT_EQ(RunProcess({"/bin/cp", Program(), copy}, {}, kTimeout).exit_code,
            0);
  // Started through a descriptor of the file, once the file is gone.
  const ProcessResult r =
      RunProcess({"/bin/sh", "-c",
                  "exec 3<\"$0\" && rm \"$0\" && exec /proc/self/fd/3 \"$@\"",
                  copy, "--num_processes=2", "--main_process_port=0"},
                 {{"ACCEL_ZYGOTE", "0"}}, kTimeout);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(RankLines(r.output).size(), 2u) << r.output;
}

// Forked in the first attempt, exec'd in the second.
void ExpectForkedThenExecd(const ProcessResult& r) {
  EXPECT_THAT(r.output, HasSubstr("restarting all ranks (restart 1 of 1"));
  EXPECT_THAT(r.output, HasSubstr("exec'ing the ranks instead"));
  const std::vector<RankLine> lines = RankLines(r.output);
  ASSERT_EQ(lines.size(), 4u) << r.output;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(lines[i].loaded, lines[i].parent) << r.output;        // Forked.
    EXPECT_EQ(lines[2 + i].loaded, lines[2 + i].self) << r.output;  // Exec'd.
  }
}

TEST_F(ZygoteTest, AZygoteThatDiedLeavesTheRestartToExec) {
  pid_t zygote = 0;
  const ProcessResult r =
      RestartWithZygote(SIGKILL, &zygote, [](pid_t) { return true; });
  ASSERT_GT(zygote, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the zygote is gone"));
  ExpectForkedThenExecd(r);
}

// A zygote stopped (SIGSTOP) never answers: after 10 s the launcher execs
// the ranks and kills the zygote, rather than hang.
TEST_F(ZygoteTest, AStoppedZygoteIsEndedAndTheRestartExecs) {
  pid_t zygote = 0;
  bool zygote_ended = false;
  const ProcessResult r =
      RestartWithZygote(SIGSTOP, &zygote, [&](pid_t launcher) {
        for (int i = 0; i < 1000 && !zygote_ended; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          zygote_ended = !ProcessAlive(zygote);
        }
        return true;
      });
  ASSERT_GT(zygote, 0) << r.output;
  EXPECT_TRUE(zygote_ended) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the zygote did not answer in 10 s"));
  ExpectForkedThenExecd(r);
}

// Nor does a stopped zygote hold a Ctrl-C.
TEST_F(ZygoteTest, CtrlCWhileTheZygoteIsStoppedStopsTheJob) {
  pid_t zygote = 0;
  std::chrono::steady_clock::time_point interrupted;
  const ProcessResult r =
      RestartWithZygote(SIGSTOP, &zygote, [&](pid_t launcher) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        interrupted = std::chrono::steady_clock::now();
        kill(launcher, SIGINT);
        return false;
      });
  const auto stopped_in = std::chrono::steady_clock::now() - interrupted;
  ASSERT_GT(zygote, 0) << r.output;
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_LT(stopped_in, std::chrono::seconds(5)) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("exec'ing the ranks instead")));
  bool zygote_alive = true;
  for (int i = 0; i < 250 && zygote_alive; ++i) {
    zygote_alive = ProcessAlive(zygote);
    if (zygote_alive)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(zygote_alive);
}

TEST_F(ZygoteTest, TheZygoteEndsWithANormalJob) {
  const std::string marker = "--fail_rank=-7";  // Unique in cmdline.
  const ProcessResult r = RunProcess(
      {Program(), "--num_processes=2", "--main_process_port=0", marker}, {},
      kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<pid_t> left = Zygotes(marker);
  for (int i = 0; i < 100 && !left.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = Zygotes(marker);
  }
  EXPECT_TRUE(left.empty());
}

}  // namespace
}  // namespace accel::testing
