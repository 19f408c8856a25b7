// End-to-end tests: real processes through the launcher, on free ports.
#include <arpa/inet.h>
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

const auto kTimeout = seconds(60);

std::string Launcher() { return Runfile("tools/launch"); }
std::string Worker() { return Runfile("tests/mp_worker"); }

void ExpectNoneAlive(const std::string& pid_dir, size_t expected_pids) {
  const std::vector<pid_t> pids = ReadPidFiles(pid_dir);
  EXPECT_EQ(pids.size(), expected_pids);
  // Reparented grandchildren are reaped asynchronously: allow a moment.
  for (int i = 0; i < 100; ++i) {
    bool any = false;
    for (pid_t pid : pids) any |= ProcessAlive(pid);
    if (!any) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << "pid " << pid;
}

class LaunchTest : public ::testing::TestWithParam<int> {};

TEST_P(LaunchTest, RanksRunEveryCollective) {
  const int n = GetParam();
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=" + std::to_string(n),
       "--main_process_port=0", "--", Worker(), "--scenario=collectives"},
      {}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double sum = n * (n + 1) / 2.0;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_THAT(r.output, HasSubstr("rank " + std::to_string(rank) + "/" +
                                    std::to_string(n) + " ok: sum=" +
                                    ::testing::PrintToString(sum)));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LaunchTest, ::testing::Values(1, 2, 3));

TEST(LaunchTest, ProgramLaunchesItselfWithNumProcesses) {
  const ProcessResult r = RunProcess(
      {Worker(), "--num_processes=2", "--main_process_port=0"}, {}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0/2 ok"));
  EXPECT_THAT(r.output, HasSubstr("rank 1/2 ok"));
}

TEST(LaunchTest, RankKilledMidCollectiveIsNamedByEveryoneAndNothingSurvives) {
  const std::string pid_dir = MakeTempDir("die");
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=3", "--main_process_port=0", "--", Worker(),
       "--scenario=die", "--die_rank=1", "--pid_dir=" + pid_dir},
      {}, kTimeout);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("accel launch: rank 1 (pid"));
  EXPECT_THAT(r.output, HasSubstr("killed by signal 9"));
  // Both survivors report the dead rank themselves, as peer errors.
  for (const char* survivor : {"rank 0/3", "rank 2/3"}) {
    EXPECT_THAT(r.output,
                HasSubstr(std::string("[gloo] ") + survivor + ": allreduce #"))
        << r.output;
  }
  EXPECT_THAT(r.output, HasSubstr("rank 1 crashed (its process left the job)"));
  EXPECT_LT(r.elapsed, seconds(15)) << r.output;
  ExpectNoneAlive(pid_dir, 6);
}

TEST(LaunchTest, SigtermToTheLauncherReachesEveryRankAndGrandchild) {
  const std::string pid_dir = MakeTempDir("term");
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=2", "--main_process_port=0", "--", Worker(),
       "--scenario=sleep", "--pid_dir=" + pid_dir},
      {}, kTimeout, [&](pid_t launcher) {
        // Wait until both ranks have written their pids, then stop the job.
        for (int i = 0; i < 1000 && ReadPidFiles(pid_dir).size() < 4; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        kill(launcher, SIGTERM);
      });
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_THAT(r.output, HasSubstr("got SIGTERM (Terminated); passing SIGTERM "
                                  "to the 2 running rank(s)"));
  EXPECT_LT(r.elapsed, seconds(30)) << r.output;
  ExpectNoneAlive(pid_dir, 4);
}

// An ssh hangup, SLURM's --signal and Ctrl-\\ reach the ranks as SIGTERM
// does, and the launcher says what happened, rather than dying silently and
// taking the ranks with it.
TEST(LaunchTest, HangupUser1AndQuitArePassedOnAndSaid) {
  for (const auto& [signal_number, said] :
       std::vector<std::pair<int, std::string>>{
           {SIGHUP, "got SIGHUP (Hangup); passing SIGTERM"},
           {SIGUSR1, "got SIGUSR1 (User defined signal 1); passing SIGUSR1"},
           {SIGQUIT, "got SIGQUIT (Quit); passing SIGTERM"}}) {
    const std::string pid_dir = MakeTempDir("signal");
    const ProcessResult r = RunProcess(
        {Launcher(), "--num_processes=2", "--main_process_port=0", "--",
         Worker(), "--scenario=sleep", "--pid_dir=" + pid_dir},
        {}, kTimeout, [&](pid_t launcher) {
          for (int i = 0; i < 1000 && ReadPidFiles(pid_dir).size() < 4; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          kill(launcher, signal_number);
        });
    EXPECT_EQ(r.exit_code, 128 + signal_number) << r.output;
    EXPECT_THAT(r.output, HasSubstr(said + " to the 2 running rank(s)"))
        << r.output;
    EXPECT_LT(r.elapsed, seconds(30)) << r.output;
    ExpectNoneAlive(pid_dir, 4);
  }
}

// Listening TCP sockets ("ip:port", ip as in /proc/net/tcp) of processes.
std::vector<std::pair<std::string, int>> ListeningSockets(
    const std::vector<pid_t>& pids) {
  std::set<std::string> inodes;
  for (pid_t pid : pids) {
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* dir = opendir(fd_dir.c_str());
    if (dir == nullptr) continue;
    while (dirent* entry = readdir(dir)) {
      char target[256] = {};
      const std::string link = fd_dir + "/" + entry->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::strncmp(target, "socket:[", 8) == 0) {
        inodes.insert(std::string(target + 8, std::strlen(target) - 9));
      }
    }
    closedir(dir);
  }
  std::vector<std::pair<std::string, int>> sockets;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // Header.
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, skip, inode;
      fields >> slot >> local >> remote >> state;
      for (int i = 0; i < 5; ++i) fields >> skip;
      fields >> inode;
      if (state != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
      const size_t colon = local.find(':');
      sockets.emplace_back(local.substr(0, colon),
                           std::stoi(local.substr(colon + 1), nullptr, 16));
    }
  }
  return sockets;
}

void SendAndClose(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  close(fd);
}

TEST(LaunchTest, StrangersAndGarbageOnTheJobsPortsLeaveTheJobAlone) {
  std::vector<std::pair<std::string, int>> listening;
  ProcessResult stranger;
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=3", "--main_process_port=0", "--", Worker(),
       "--scenario=loop", "--steps=400"},
      {}, kTimeout, [&](pid_t launcher) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        listening = ListeningSockets(ChildrenOf(launcher));
        std::string random(100000, '\0');
        for (size_t i = 0; i < random.size(); ++i) random[i] = char(i * 7919);
        for (const auto& [ip, port] : listening) {
          SendAndClose(port, random);                              // Garbage.
          SendAndClose(port, std::string("\xff\xff\xff\x7f", 4));  // Huge.
          SendAndClose(port, std::string("\x11\x00", 2));          // Cut off.
          SendAndClose(port, "GET / HTTP/1.0\r\n\r\n");
          // A process of another run, with its own secret, tries to join.
          stranger = RunProcess({Worker(), "--timeout_ms=3000"},
                                {{"RANK", "1"},
                                 {"WORLD_SIZE", "3"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", std::to_string(port)},
                                 {"ACCEL_RUN_SECRET", "not-the-secret"}},
                                std::chrono::seconds(30));
        }
      });
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(r.output,
                HasSubstr("rank " + std::to_string(rank) + "/3 ok: 400 steps"));
  }
  // One port (the rendezvous store), on loopback only: 127.0.0.1 in
  // /proc/net/tcp's little-endian hex.
  ASSERT_EQ(listening.size(), 1u);
  EXPECT_EQ(listening[0].first, "0100007F");
  EXPECT_EQ(stranger.exit_code, 1) << stranger.output;
  EXPECT_THAT(stranger.output, HasSubstr("rejected this process: it belongs "
                                         "to another run"));
}

TEST(LaunchTest, UnknownBackendListsTheAvailableOnes) {
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--backend=nope", "--", Worker()},
                 {}, kTimeout);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("unknown backend 'nope'; available backends: gloo"));
  EXPECT_LT(r.elapsed, seconds(15)) << r.output;
}

TEST(LaunchTest, MissingProgramIsAClearError) {
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=2", "--", "/no/such/program"},
                 {}, kTimeout);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("cannot run '/no/such/program': No such file "
                                  "or directory"));
}

TEST(LaunchTest, BadEnvironmentIsAClearErrorNotAHang) {
  const ProcessResult r = RunProcess({Worker()},
                                     {{"RANK", "2"},
                                      {"WORLD_SIZE", "2"},
                                      {"MASTER_ADDR", "127.0.0.1"},
                                      {"MASTER_PORT", "29500"}},
                                     kTimeout);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr("error: RANK must be in [0, WORLD_SIZE) = [0, 2), "
                        "found 2"));
}

// Every variable accel reads is checked, and the message names it.
TEST(LaunchTest, EveryVariableAccelReadsIsCheckedByName) {
  const std::map<std::string, std::string> rank = {{"RANK", "1"},
                                                   {"WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", "29500"}};
  auto rank_with = [&](const std::string& name, const std::string& value) {
    auto env = rank;
    env[name] = value;
    return RunProcess({Worker(), "--timeout_ms=1500"}, env, kTimeout);
  };
  const ProcessResult steady = rank_with("ACCEL_LAUNCH_STEADY_NS", "garbage");
  EXPECT_EQ(steady.exit_code, 1) << steady.output;
  EXPECT_THAT(steady.output,
              HasSubstr("environment variable ACCEL_LAUNCH_STEADY_NS must be "
                        "an integer in [0, "));
  EXPECT_THAT(steady.output, ::testing::Not(HasSubstr("too busy")));
  const ProcessResult shm =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--", Worker()},
                 {{"ACCEL_SHARED_MEMORY", "sometimes"}}, kTimeout);
  EXPECT_THAT(shm.output, HasSubstr("ACCEL_SHARED_MEMORY must be 1 or 0"));
  // A secret longer than the store takes: refused at once, with the limit,
  // by the launcher and by a rank (before: 60 s, then blamed on the
  // network).
  const std::string long_secret(5000, 's');
  const ProcessResult launcher =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--", Worker()},
                 {{"ACCEL_RUN_SECRET", long_secret}}, kTimeout);
  EXPECT_EQ(launcher.exit_code, 2) << launcher.output;
  EXPECT_THAT(launcher.output,
              HasSubstr("error: environment variable ACCEL_RUN_SECRET is 5000 "
                        "bytes long; at most 1024 are allowed"));
  EXPECT_LT(launcher.elapsed, seconds(5));
  const ProcessResult secret = rank_with("ACCEL_RUN_SECRET", long_secret);
  EXPECT_THAT(secret.output, HasSubstr("ACCEL_RUN_SECRET is 5000 bytes long"));
  EXPECT_LT(secret.elapsed, seconds(5));
  const ProcessResult threads =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--", Worker()},
                 {{"OMP_NUM_THREADS", "many"}}, kTimeout);
  EXPECT_EQ(threads.exit_code, 2) << threads.output;
  EXPECT_THAT(threads.output,
              HasSubstr("OMP_NUM_THREADS must be a number of threads"));
  const ProcessResult in_process =
      RunProcess({Worker(), "--num_processes=2", "--main_process_port=0"},
                 {{"ACCEL_IN_PROCESS_LAUNCH", "perhaps"}}, kTimeout);
  EXPECT_THAT(in_process.output,
              HasSubstr("ACCEL_IN_PROCESS_LAUNCH must be 1 or 0"));
  const ProcessResult zygote =
      RunProcess({Worker(), "--num_processes=2", "--main_process_port=0"},
                 {{"ACCEL_ZYGOTE", "perhaps"}}, kTimeout);
  EXPECT_EQ(zygote.exit_code, 2) << zygote.output;
  EXPECT_THAT(zygote.output, HasSubstr("ACCEL_ZYGOTE must be 1 or 0"));
  EXPECT_LT(zygote.elapsed, seconds(5));
}

TEST(LaunchTest, MissingRankTimesOutNamingTheRendezvous) {
  // Rank 1 of 2 alone: rank 0 never comes, so the store is unreachable.
  const ProcessResult r = RunProcess({Worker(), "--timeout_ms=1500"},
                                     {{"RANK", "1"},
                                      {"WORLD_SIZE", "2"},
                                      {"MASTER_ADDR", "127.0.0.1"},
                                      {"MASTER_PORT", "1"}},
                                     kTimeout);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("rank 1/2: rendezvous failed: could not "
                                  "connect to the rendezvous store (hosted by "
                                  "rank 0) at "
                                  "127.0.0.1:1"));
  EXPECT_LT(r.elapsed, seconds(10));
}

TEST(LaunchTest, RanksShowTheProgramsNameInPs) {
  for (const bool self_launch : {false, true}) {
    const std::string pid_dir = MakeTempDir(self_launch ? "self" : "launch");
    std::vector<std::string> args = {Launcher(), "--num_processes=2",
                                     "--main_process_port=0", "--", Worker()};
    if (self_launch)
      args = {Worker(), "--num_processes=2", "--main_process_port=0"};
    args.push_back("--scenario=sleep");
    args.push_back("--pid_dir=" + pid_dir);
    std::vector<std::string> names, commands;
    RunProcess(args, {}, kTimeout, [&](pid_t launcher) {
      for (int i = 0; i < 1000 && ReadPidFiles(pid_dir).size() < 4; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (int rank = 0; rank < 2; ++rank) {
        const std::string pid =
            ReadFile(pid_dir + "/rank" + std::to_string(rank) + ".pid");
        // What ps, top and pgrep show.
        names.push_back(ReadFile("/proc/" + pid + "/comm"));
        std::string command = ReadFile("/proc/" + pid + "/cmdline");
        commands.push_back(command.substr(0, command.find('\0')));
      }
      kill(launcher, SIGTERM);
    });
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(names[rank], "mp_worker\n") << "self launch: " << self_launch;
      EXPECT_THAT(commands[rank], ::testing::EndsWith("/mp_worker"));
    }
  }
}

TEST(LaunchTest, NumProcessesBelowOneIsAnErrorInSelfLaunchToo) {
  for (const char* count : {"0", "-1"}) {
    const ProcessResult r = RunProcess(
        {Worker(), std::string("--num_processes=") + count}, {}, kTimeout);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output,
                HasSubstr(std::string("--num_processes must be at least 1, "
                                      "found ") +
                          count));
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr(" ok")));
  }
}

TEST(LaunchTest, MoreProcessesThanCoresIsAOneLineWarning) {
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const int n = cores + 1;
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=" + std::to_string(n),
       "--main_process_port=0", "--", Worker(), "--scenario=collectives"},
      {}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("accel launch: warning: " + std::to_string(n) +
                        " processes on this machine's " +
                        std::to_string(cores) + " cores"));
}

TEST(LaunchTest, ARankThatFailsWhileOthersStartStopsTheLaunch) {
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=64", "--main_process_port=0",
                  "--", "/bin/sh", "-c", "exit 3"},
                 {}, kTimeout);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("exited with code 3 while ranks were "
                                  "starting ("));
}

TEST(LaunchTest, PortZeroIsHeldFromChoiceUntilRank0ServesIt) {
  // Rank 1 tries to take rank 0's port before rank 0 can serve it (rank 0
  // waits a second first).
  const std::string grab =
      "import os, socket, time\n"
      "if os.environ['RANK'] == '0': time.sleep(1)\n"
      "else:\n"
      "  s = socket.socket()\n"
      "  try:\n"
      "    s.bind(('127.0.0.1', int(os.environ['MASTER_PORT'])))\n"
      "    print('port was free', flush=True)\n"
      "  except OSError:\n"
      "    print('port was held', flush=True)\n"
      "  s.close()\n"
      "os.execv(os.environ['WORKER'], [os.environ['WORKER'],\n"
      "         '--scenario=collectives'])\n";
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--", "/usr/bin/python3", "-c", grab},
                 {{"WORKER", Worker()}}, kTimeout);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("port was held"));
  EXPECT_THAT(r.output, HasSubstr("rank 0/2 ok"));
}

TEST(LaunchTest, HelpIsShortListsTheProgramsAndAccelsFlagsAndExitsZero) {
  for (const std::string& program : {Worker(), Runfile("tests/fault_worker")}) {
    const ProcessResult r = RunProcess({program, "--help"}, {}, kTimeout);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("--scenario="));
    EXPECT_THAT(r.output, HasSubstr("--num_processes=1"));
    EXPECT_THAT(r.output, HasSubstr("--rendezvous_timeout_s="));
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("caffe2")));
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("SetUsageMessage")));
    EXPECT_LT(std::count(r.output.begin(), r.output.end(), '\n'), 60)
        << r.output;
  }
  const ProcessResult launch = RunProcess({Launcher(), "--help"}, {}, kTimeout);
  EXPECT_EQ(launch.exit_code, 0);
  EXPECT_THAT(launch.output, HasSubstr("--num_processes="));
  EXPECT_THAT(launch.output, HasSubstr("--log_dir="));
  EXPECT_THAT(launch.output, ::testing::Not(HasSubstr("--seed")));
}

TEST(LaunchTest, LaunchRejectsFlagsItDoesNotUseAndPassesOnRankFlags) {
  const ProcessResult rejected =
      RunProcess({Launcher(), "--num_processes=1", "--seed=3", "--", Worker()},
                 {}, kTimeout);
  EXPECT_NE(rejected.exit_code, 0);
  EXPECT_THAT(rejected.output,
              HasSubstr("launch has no flag --seed; a flag of the program "
                        "goes after `--`"));
  EXPECT_THAT(rejected.output, ::testing::Not(HasSubstr(" ok")));
  // A misspelt launcher flag says which it resembles.
  const ProcessResult misspelt = RunProcess(
      {Launcher(), "--num_proceses=2", "--", Worker()}, {}, kTimeout);
  EXPECT_EQ(misspelt.exit_code, 2);
  EXPECT_THAT(misspelt.output,
              HasSubstr("launch has no flag --num_proceses (did you mean "
                        "--num_processes?); a flag of the program goes after "
                        "`--`"));
  const ProcessResult passed =
      RunProcess({Launcher(), "--num_processes=1", "--main_process_port=0",
                  "--timeout_s=7", "--rendezvous_timeout_s=9", "--", "/bin/sh",
                  "-c", "echo args: \"$@\"", "sh"},
                 {}, kTimeout);
  EXPECT_EQ(passed.exit_code, 0) << passed.output;
  EXPECT_THAT(passed.output, HasSubstr("--timeout_s=7"));
  EXPECT_THAT(passed.output, HasSubstr("--rendezvous_timeout_s=9"));
}

// The rendezvous timeout counts from the launch: ranks that start later than
// that (an overloaded machine) fail as they arrive, saying why.
TEST(LaunchTest, RanksThatStartAfterTheRendezvousTimeoutFailAtOnce) {
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--", Worker(), "--timeout_ms=1500", "--start_delay_ms=2500"},
                 {}, kTimeout);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "rank [01]/2: started [0-9]+\\.[0-9] s after the "
                            "launcher started the job, past the rendezvous "
                            "timeout \\(1\\.5 s\\)"));
  EXPECT_LT(r.elapsed, seconds(15));
}

// Under `bazel run`, PROGRAM relative to where the user ran Bazel.
TEST(LaunchTest, ARelativeProgramIsTheUsersUnderBazelRun) {
  const std::string user_dir = std::getenv("TEST_SRCDIR");
  const ProcessResult r =
      RunProcess({Launcher(), "--num_processes=2", "--main_process_port=0",
                  "--", "accel/tests/mp_worker"},
                 {{"BUILD_WORKING_DIRECTORY", user_dir}}, kTimeout);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1/2 ok"));
}

TEST(LaunchTest, LogDirKeepsEachRanksOutputAndACopyOnTheConsole) {
  const std::string logs = MakeTempDir("logs");
  const ProcessResult r = RunProcess(
      {Launcher(), "--num_processes=2", "--main_process_port=0",
       "--log_dir=" + logs, "--", Worker(), "--scenario=collectives"},
      {}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string dir = logs + "/attempt_0/rank_" + std::to_string(rank);
    EXPECT_THAT(ReadFile(dir + "/stdout.log"),
                HasSubstr("rank " + std::to_string(rank) + "/2 ok"));
    EXPECT_EQ(access((dir + "/stderr.log").c_str(), F_OK), 0);
    EXPECT_THAT(r.output,
                HasSubstr("[rank " + std::to_string(rank) + "]: rank " +
                          std::to_string(rank) + "/2 ok"));
  }
}

// In a log file the launcher's messages start on the line after the ranks'
// output, with no blank line between (a line break went before each).
TEST(LaunchTest, LauncherMessagesInALogFileAddNoBlankLine) {
  const std::string dir = MakeTempDir("log");
  for (const auto& [program, expected] :
       std::vector<std::pair<std::string, std::string>>{
           {"echo 'Epoch 3 - Accuracy: 0.5' >&2; exit 4",
            "Epoch 3 - Accuracy: 0.5\naccel launch: rank 0"},
           {"printf 'Epoch 1/3 [5/10]' >&2; exit 4",
            "[5/10]\naccel launch: rank 0"}}) {
    const std::string log = dir + "/stderr.log";
    const std::string command = "'" + Launcher() +
                                "' --num_processes=1 --main_process_port=0 "
                                "-- /bin/sh -c \"" +
                                program + "\" 2>'" + log + "'";
    const ProcessResult r =
        RunProcess({"/bin/sh", "-c", command}, {}, kTimeout);
    EXPECT_EQ(r.exit_code, 4) << r.output;
    const std::string text = ReadFile(log);
    EXPECT_THAT(text, HasSubstr(expected)) << text;
    EXPECT_EQ(text.find("\n\n"), std::string::npos) << text;
  }
}

TEST(LaunchTest, LauncherMessagesStartOnAFreshLine) {
  // A rank that leaves a progress bar unfinished, then fails.
  for (const bool with_logs : {false, true}) {
    // Port 0: the default port may be another job's on a shared machine.
    std::vector<std::string> args = {Launcher(), "--num_processes=1",
                                     "--main_process_port=0"};
    if (with_logs) args.push_back("--log_dir=" + MakeTempDir("bar"));
    for (const char* arg :
         {"--", "/bin/sh", "-c", "printf 'Epoch 1/3 [5/10]' >&2; exit 4"}) {
      args.push_back(arg);
    }
    const ProcessResult r = RunProcess(args, {}, kTimeout);
    EXPECT_EQ(r.exit_code, 4);
    EXPECT_THAT(r.output, HasSubstr("[5/10]\naccel launch: rank 0"))
        << r.output;
  }
}

// A SIGCHLD ignored by the parent survives exec and made the kernel reap
// the ranks: every launch hung after training (killed at 45 s), and a
// killed rank was never reported. Reset at start, by the launcher, the
// program launching itself (zygote or not) and InitProgram.
TEST(LaunchTest, AnIgnoredSigchldFromTheParentChangesNothing) {
  const std::string ignore = Runfile("tests/ignore_sigchld");
  const auto expect_ok = [](const ProcessResult& r, const std::string& how) {
    EXPECT_EQ(r.exit_code, 0)
        << how << (r.timed_out ? " (timed out)" : "") << "\n"
        << r.output;
    EXPECT_THAT(r.output, HasSubstr("rank 1/2 ok")) << how;
    EXPECT_LT(r.elapsed, seconds(20)) << how;
  };
  const auto quick = seconds(30);
  expect_ok(RunProcess({ignore, Launcher(), "--num_processes=2",
                        "--main_process_port=0", "--", Worker()},
                       {}, quick),
            "launcher");
  expect_ok(RunProcess({ignore, Worker(), "--num_processes=2",
                        "--main_process_port=0"},
                       {}, quick),
            "self-launch");
  expect_ok(RunProcess({ignore, Worker(), "--num_processes=2",
                        "--main_process_port=0"},
                       {{"ACCEL_ZYGOTE", "0"}}, quick),
            "self-launch without the zygote");
  expect_ok(RunProcess({Worker(), "--num_processes=2", "--main_process_port=0"},
                       {{"MP_WORKER_IGNORE_SIGCHLD", "1"}}, quick),
            "ignored by the program before InitProgram");
  // A rank killed with SIGKILL is reported, and the job ends.
  const ProcessResult killed =
      RunProcess({ignore, Worker(), "--num_processes=3",
                  "--main_process_port=0", "--scenario=die", "--die_rank=1"},
                 {}, quick);
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_FALSE(killed.timed_out) << killed.output;
  EXPECT_THAT(killed.output, HasSubstr("accel launch: rank 1 (pid"));
  EXPECT_THAT(killed.output, HasSubstr("killed by signal 9"));
}

}  // namespace
}  // namespace accel::testing
