// Runs a program to completion for end-to-end tests, with a hard timeout so
// that a hang fails the test instead of blocking CI.
//
//   accel::testing::ProcessResult r = accel::testing::RunProcess(
//       {Runfile("tools/launch"), "--num_processes=2", "--", worker}, {},
//       std::chrono::seconds(60));
//   EXPECT_EQ(r.exit_code, 0) << r.output;
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace accel::testing {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed.
  std::string output;  // stdout and stderr, interleaved.
  bool timed_out = false;
  std::chrono::milliseconds elapsed{0};
};

// `env` is added to this process's environment. `on_start` (optional) runs
// once the child is running, with its pid.
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env,
                         std::chrono::milliseconds timeout,
                         const std::function<void(pid_t)>& on_start = {});

// Path of a file built into this test's runfiles, e.g. "tools/launch".
std::string Runfile(const std::string& path);

// A fresh empty folder under the test's temporary directory.
std::string MakeTempDir(const std::string& name);

// Whether a process with this pid is still alive (zombies count as dead).
bool ProcessAlive(pid_t pid);

// Child processes of `pid`, from /proc.
std::vector<pid_t> ChildrenOf(pid_t pid);

// The children of a supervisor but its zygote (accel-zygote, which a
// self-launching program forks to start its ranks: see
// accel/runtime/launch/zygote.h).
std::vector<pid_t> RanksOf(pid_t supervisor);

// A file's whole contents ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// Pids written as "<pid>" into every *.pid file of `dir`.
std::vector<pid_t> ReadPidFiles(const std::string& dir);

}  // namespace accel::testing
