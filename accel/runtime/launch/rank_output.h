// Copies each rank's stdout and stderr to its own log files and to the
// launcher's console, as torchrun's --log_dir with --tee does.
//
//   accel::RankOutput output("/tmp/logs", /*attempt=*/0);
//   accel::RankOutput::Pipes pipes = output.Add(/*rank=*/3);
//   // fork; the child dup2s pipes.out / pipes.err onto 1 and 2; then:
//   output.StartedRank(3);
//   ...
//   output.Message("accel launch: rank 3 exited with code 1");
//   output.Finish();  // once the ranks have exited
//
// Files: <log_dir>/attempt_<n>/rank_<r>/stdout.log and stderr.log, exactly
// what the rank wrote. On the console each line is prefixed "[rank r]: ".
// Because every byte passes through here, launcher messages start on a
// fresh line even after a progress bar that ended without one.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace accel {

class RankOutput {
 public:
  RankOutput(std::string log_dir, int attempt);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  // The write ends a rank's stdout and stderr go to. UsageError (with path
  // and errno) when a log file cannot be created.
  struct Pipes {
    int out = -1;
    int err = -1;
  };
  Pipes Add(int rank);
  // Called once the rank runs: closes our copies of its write ends.
  void StartedRank(int rank);
  // Writes a launcher message on stderr, on a line of its own.
  void Message(const std::string& text);
  // Copies what is left and stops; call after every rank has exited.
  void Finish();

 private:
  struct Stream {
    int rank;
    int read_fd;
    int write_fd;
    int file_fd;
    int console_fd;  // 1 or 2
    bool at_line_start = true;
  };
  void Relay();
  // Whether a rank's pipe holds output the relay has not read yet.
  bool OutputPending();
  void WriteConsole(Stream& stream, const char* data, size_t size);

  const std::string dir_;
  std::mutex mutex_;
  std::vector<Stream> streams_;
  bool console_at_line_start_ = true;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> finishing_{false};
  std::thread thread_;
};

}  // namespace accel
