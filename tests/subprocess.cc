#include "tests/subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace accel::testing {

ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env,
                         std::chrono::milliseconds timeout,
                         const std::function<void(pid_t)>& on_start) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  if (on_start) on_start(pid);
  ProcessResult result;
  const auto deadline = start + timeout;
  char buffer[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd pfd{out[0], POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(out[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  return result;
}

std::string Runfile(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  if (root == nullptr) return path;
  return std::string(root) + "/accel/" + path;
}

std::string MakeTempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(root ? root : "/tmp") + "/" + name + "XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp");
  return dir;
}

bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // The state follows the command name in parentheses.
  const size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) {
    return false;
  }
  const char state = line[close_paren + 2];
  return state != 'Z' && state != 'X';
}

std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> children;
  std::ifstream file("/proc/" + std::to_string(pid) + "/task/" +
                     std::to_string(pid) + "/children");
  pid_t child;
  while (file >> child) children.push_back(child);
  return children;
}

std::vector<pid_t> RanksOf(pid_t supervisor) {
  std::vector<pid_t> ranks;
  for (const pid_t child : ChildrenOf(supervisor)) {
    if (ReadFile("/proc/" + std::to_string(child) + "/comm") !=
        "accel-zygote\n") {
      ranks.push_back(child);
    }
  }
  return ranks;
}

std::vector<pid_t> ReadPidFiles(const std::string& dir) {
  std::vector<pid_t> pids;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return pids;
  while (dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name.size() < 4 || name.substr(name.size() - 4) != ".pid") continue;
    std::ifstream file(dir + "/" + name);
    pid_t pid;
    if (file >> pid) pids.push_back(pid);
  }
  closedir(d);
  return pids;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace accel::testing
