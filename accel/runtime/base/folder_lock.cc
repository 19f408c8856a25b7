#include "accel/runtime/base/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>

namespace accel {
namespace {

constexpr size_t kMaxCommandChars = 200;

std::string CommandLine() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(file)), {});
  std::string command;
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    std::string arg = raw.substr(start, end - start);
    if (command.empty()) arg = arg.substr(arg.rfind('/') + 1);  // Its name.
    command += (command.empty() ? "" : " ") + arg;
    start = end + 1;
  }
  if (command.size() > kMaxCommandChars) {
    command = command.substr(0, kMaxCommandChars) + "...";
  }
  for (char& c : command) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return command;
}

std::string ReadHolder(int fd) {
  char text[512];
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  if (n <= 0) return "a process that has not written its name yet";
  std::string line(text, static_cast<size_t>(n));
  return line.substr(0, line.find('\n'));
}

}  // namespace

std::string DescribeThisProcess() {
  char host[256] = "unknown host";
  gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char since[32];
  std::strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S UTC", &utc);
  return "pid " + std::to_string(getpid()) + " on " + host + " since " + since +
         ": " + CommandLine();
}

FolderLock::FolderLock(int fd, std::string path, std::string unlocked_reason)
    : fd_(fd),
      path_(std::move(path)),
      unlocked_reason_(std::move(unlocked_reason)) {}

FolderLock::~FolderLock() {
  if (fd_ >= 0) close(fd_);  // Drops the flock.
}

std::unique_ptr<FolderLock> FolderLock::TryAcquire(const std::string& dir,
                                                   std::string* holder) {
  const std::string path = dir + "/accel.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    *holder = "cannot open '" + path + "': " + std::strerror(errno);
    return nullptr;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      *holder = ReadHolder(fd);
      close(fd);
      return nullptr;
    }
    // No locks on this file system: nothing to claim with.
    return std::unique_ptr<FolderLock>(new FolderLock(
        fd, path, "'" + path + "' cannot be locked: " + std::strerror(error)));
  }
  const std::string line = DescribeThisProcess() + "\n";
  if (ftruncate(fd, 0) == 0) {
    const ssize_t written = pwrite(fd, line.data(), line.size(), 0);
    (void)written;  // The lock holds either way; the line is for messages.
  }
  return std::unique_ptr<FolderLock>(new FolderLock(fd, path, ""));
}

}  // namespace accel
