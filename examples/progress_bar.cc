#include "examples/progress_bar.h"

#include <unistd.h>

namespace examples {
namespace {

constexpr auto kTerminalInterval = std::chrono::milliseconds(100);
constexpr auto kLogInterval = std::chrono::seconds(10);

}  // namespace

ProgressBar::ProgressBar(std::FILE* stream)
    : ProgressBar(stream, isatty(fileno(stream)) != 0) {}

ProgressBar::ProgressBar(std::FILE* stream, bool terminal)
    : stream_(stream), terminal_(terminal) {}

void ProgressBar::Update(const std::string& label, size_t done, size_t total,
                         const std::string& text, Clock::time_point now) {
  const bool last = done >= total;
  if (!shown_) {
    // A log's first line comes after one interval, like the others.
    last_ = now;
    shown_ = true;
  }
  const std::string line = label + " [" + std::to_string(done) + "/" +
                           std::to_string(total) + "] " + text;
  if (terminal_) {
    if (!last && drawn_ && now - last_ < kTerminalInterval) return;
    std::fprintf(stream_, "\r%s\x1b[K%s", line.c_str(), last ? "\n" : "");
    drawn_ = !last;
  } else {
    if (now - last_ < kLogInterval) return;
    std::fprintf(stream_, "%s\n", line.c_str());
  }
  std::fflush(stream_);
  last_ = now;
}

void ProgressBar::Break() {
  if (!drawn_) return;
  std::fprintf(stream_, "\n");
  std::fflush(stream_);
  drawn_ = false;
}

}  // namespace examples
