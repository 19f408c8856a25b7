#include "accel/runtime/base/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace accel {
namespace {

std::atomic<int> g_rank{-1};
std::atomic<int> g_world_size{0};

// glog prints its prefix on every line once the user asks for verbose
// output: then accel's notes line up with the rest.
bool Verbose() { return FLAGS_v > 0 || !FLAGS_vmodule.empty(); }

std::string WithRank(const char* message, size_t length) {
  const std::string label = RankLabel();
  std::string line;
  if (!label.empty()) line = "[" + label + "] ";
  line.append(message, length);
  return line;
}

void Write(const std::string& line) {
  // One write per line, so that threads and ranks do not interleave parts.
  std::string text = line;
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

class Sink : public google::LogSink {
 public:
  explicit Sink(bool verbose_lines) : verbose_lines_(verbose_lines) {}

  void send(google::LogSeverity severity, const char* full_filename,
            const char* base_filename, int line,
            const google::LogMessageTime& time, const char* message,
            size_t message_len) override {
    const std::string text = WithRank(message, message_len);
    if (verbose_lines_ || Verbose()) {
      Write(ToString(severity, base_filename, line, time, text.data(),
                     text.size()));
      return;
    }
    const char* kind = severity == google::GLOG_INFO      ? "note"
                       : severity == google::GLOG_WARNING ? "warning"
                                                          : "error";
    Write(std::string("accel: ") + kind + ": " + text);
  }

 private:
  const bool verbose_lines_;
};

}  // namespace

std::string RankLabel() {
  int rank = g_rank.load();
  int size = g_world_size.load();
  if (size == 0) {
    const char* r = std::getenv("RANK");
    const char* n = std::getenv("WORLD_SIZE");
    if (r == nullptr || n == nullptr) return "";
    rank = std::atoi(r);
    size = std::atoi(n);
  }
  if (size <= 1 || rank < 0 || rank >= size) return "";
  return "rank " + std::to_string(rank) + "/" + std::to_string(size);
}

void SetLogRank(int rank, int world_size) {
  g_rank = rank;
  g_world_size = world_size;
}

namespace logging_internal {

google::LogSink* NoteSink() {
  static Sink* sink = new Sink(/*verbose_lines=*/false);
  return sink;
}

google::LogSink* VerboseSink() {
  static Sink* sink = new Sink(/*verbose_lines=*/true);
  return sink;
}

}  // namespace logging_internal
}  // namespace accel
