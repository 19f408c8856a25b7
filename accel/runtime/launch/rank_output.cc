#include "accel/runtime/launch/rank_output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// Creates `path` and its parents.
void MakeDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw UsageError("--log_dir: cannot create " + prefix + ": " +
                       std::strerror(errno));
    }
    if (slash == std::string::npos) return;
  }
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // A full disk or closed console: keep the rank going.
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

RankOutput::RankOutput(std::string log_dir, int attempt)
    : dir_(std::move(log_dir) + "/attempt_" + std::to_string(attempt)) {
  MakeDirectories(dir_);
  if (pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    throw Error(std::string("launch: pipe failed: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { Relay(); });
}

RankOutput::~RankOutput() {
  Finish();
  for (Stream& s : streams_) {
    if (s.write_fd >= 0) close(s.write_fd);
    close(s.read_fd);
    close(s.file_fd);
  }
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
}

RankOutput::Pipes RankOutput::Add(int rank) {
  const std::string rank_dir = dir_ + "/rank_" + std::to_string(rank);
  MakeDirectories(rank_dir);
  Pipes pipes;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const char* name : {"stdout", "stderr"}) {
    const std::string path = rank_dir + "/" + name + ".log";
    const int file =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (file < 0) {
      throw UsageError("--log_dir: cannot create " + path + ": " +
                       std::strerror(errno));
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      close(file);
      throw Error(std::string("launch: pipe failed: ") + std::strerror(errno));
    }
    const bool is_out = std::strcmp(name, "stdout") == 0;
    streams_.push_back({rank, fds[0], fds[1], file, is_out ? 1 : 2});
    (is_out ? pipes.out : pipes.err) = fds[1];
  }
  const char byte = 0;
  ssize_t ignored = write(wake_pipe_[1], &byte, 1);
  (void)ignored;
  return pipes;
}

void RankOutput::StartedRank(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stream& s : streams_) {
    if (s.rank == rank && s.write_fd >= 0) {
      close(s.write_fd);
      s.write_fd = -1;
    }
  }
}

bool RankOutput::OutputPending() {
  std::vector<pollfd> fds;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Stream& stream : streams_) {
      if (stream.read_fd >= 0) fds.push_back({stream.read_fd, POLLIN, 0});
    }
  }
  if (fds.empty() || poll(fds.data(), fds.size(), 0) <= 0) return false;
  for (const pollfd& fd : fds) {
    if (fd.revents & POLLIN) return true;
  }
  return false;
}

void RankOutput::Message(const std::string& text) {
  // What a rank wrote before the event this message reports (its last
  // words before exiting) comes first: let the relay empty the pipes.
  for (int i = 0; i < 40 && OutputPending(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string line = (console_at_line_start_ ? "" : "\n") + text + "\n";
  WriteAll(2, line.data(), line.size());
  console_at_line_start_ = true;
}

void RankOutput::WriteConsole(Stream& stream, const char* data, size_t size) {
  std::string text;
  const std::string prefix = "[rank " + std::to_string(stream.rank) + "]: ";
  for (size_t i = 0; i < size; ++i) {
    if (stream.at_line_start) text += prefix;
    text += data[i];
    stream.at_line_start = data[i] == '\n';
  }
  WriteAll(stream.console_fd, text.data(), text.size());
  console_at_line_start_ = stream.at_line_start;
}

void RankOutput::Relay() {
  std::vector<pollfd> fds;
  std::vector<size_t> which;
  char buffer[65536];
  auto quiet_since = std::chrono::steady_clock::now();
  bool finish_seen = false;
  while (true) {
    if (finishing_ && !finish_seen) {
      finish_seen = true;
      quiet_since = std::chrono::steady_clock::now();
    }
    fds.clear();
    which.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = 0; i < streams_.size(); ++i) {
        if (streams_[i].read_fd < 0) continue;
        fds.push_back({streams_[i].read_fd, POLLIN, 0});
        which.push_back(i);
      }
    }
    if (finishing_ && which.empty()) return;
    // Once finishing, what a rank's leftover children keep open is not
    // waited for long.
    if (finishing_ && std::chrono::steady_clock::now() - quiet_since >
                          std::chrono::seconds(2)) {
      return;
    }
    if (poll(fds.data(), fds.size(), finishing_ ? 100 : -1) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      ssize_t ignored = read(wake_pipe_[0], buffer, sizeof(buffer));
      (void)ignored;
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const ssize_t n = read(fds[k].fd, buffer, sizeof(buffer));
      std::lock_guard<std::mutex> lock(mutex_);
      Stream& stream = streams_[which[k - 1]];
      if (n > 0) {
        WriteAll(stream.file_fd, buffer, static_cast<size_t>(n));
        WriteConsole(stream, buffer, static_cast<size_t>(n));
        quiet_since = std::chrono::steady_clock::now();
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(stream.read_fd);
        stream.read_fd = -1;
      }
    }
  }
}

void RankOutput::Finish() {
  if (!thread_.joinable()) return;
  finishing_ = true;
  const char byte = 0;
  ssize_t ignored = write(wake_pipe_[1], &byte, 1);
  (void)ignored;
  thread_.join();
}

}  // namespace accel
