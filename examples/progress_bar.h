// A progress bar for a training loop, as tqdm draws one, that stays cheap in
// logs: on a terminal it redraws one line in place at most 10 times a
// second (and once more at the end); where the stream is not a terminal (a
// file, a pipe, the launcher's --log_dir) it writes whole lines, at most one
// every 10 seconds, so a long run still shows that it moves and a short one
// writes nothing.
//
//   ProgressBar bar(stderr);                  // once, for every epoch
//   for (...) {
//     bar.Update("Epoch 1/3", done, total, "loss 0.6931 12.3 it/s");
//   }
//
// train_demo --batch_size=2 --epochs=200 (6,400 steps in 6.5 s) wrote 6,400
// redraws (289 KB) with a redraw per step; now a log gets none, a terminal
// two per epoch.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace examples {

class ProgressBar {
 public:
  using Clock = std::chrono::steady_clock;
  // `terminal`: whether `stream` is one (isatty, unless a test says).
  explicit ProgressBar(std::FILE* stream);
  ProgressBar(std::FILE* stream, bool terminal);

  // Shows `label [done/total] text` when it is due; the last step of a bar
  // (done == total) ends the line on a terminal.
  void Update(const std::string& label, size_t done, size_t total,
              const std::string& text, Clock::time_point now = Clock::now());
  // Ends a line drawn in place (before other output, or when the loop
  // leaves early).
  void Break();

 private:
  std::FILE* stream_;
  bool terminal_;
  bool drawn_ = false;  // A line is drawn in place and not ended.
  Clock::time_point last_ = {};
  bool shown_ = false;  // Anything shown yet.
};

}  // namespace examples
