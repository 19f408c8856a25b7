// The examples' progress bar stays cheap in logs: rate-limited redraws on a
// terminal, sparse whole lines elsewhere (train_demo --batch_size=2
// --epochs=200 wrote 6,400 redraws, 289 KB, into a log).
#include "examples/progress_bar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace examples {
namespace {

using std::chrono::milliseconds;

// What the bar wrote into a temporary file.
class Written {
 public:
  Written() : file_(std::tmpfile()) {}
  ~Written() { std::fclose(file_); }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    std::string all;
    std::rewind(file_);
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file_)) > 0;) {
      all.append(buffer, n);
    }
    return all;
  }

 private:
  std::FILE* file_;
};

size_t Count(const std::string& text, char c) {
  size_t n = 0;
  for (char x : text) n += x == c;
  return n;
}

// 200 epochs of 32 steps in 6.4 s, 1 ms a step.
void TwoHundredShortEpochs(ProgressBar& bar) {
  auto now = ProgressBar::Clock::time_point{} + std::chrono::hours(1);
  for (int epoch = 1; epoch <= 200; ++epoch) {
    for (size_t step = 1; step <= 32; ++step) {
      now += milliseconds(1);
      bar.Update("Epoch " + std::to_string(epoch) + "/200", step, 32,
                 "loss 0.6931", now);
    }
  }
}

TEST(ProgressBarTest, ALogGetsNoRedrawsAndALineEveryTenSeconds) {
  Written out;
  ProgressBar bar(out.file(), /*terminal=*/false);
  TwoHundredShortEpochs(bar);
  EXPECT_EQ(out.text(), "");  // 6.4 s: under one interval.

  Written longer;
  ProgressBar slow(longer.file(), /*terminal=*/false);
  auto now = ProgressBar::Clock::time_point{} + std::chrono::hours(1);
  for (size_t step = 1; step <= 100; ++step) {
    now += std::chrono::seconds(1);
    slow.Update("Epoch 1/1", step, 100, "", now);
  }
  const std::string text = longer.text();
  EXPECT_EQ(Count(text, '\n'), 9u) << text;  // At 11, 21, ... 91 s.
  EXPECT_EQ(Count(text, '\r'), 0u);
  EXPECT_NE(text.find("Epoch 1/1 [11/100] \n"), std::string::npos) << text;
}

TEST(ProgressBarTest, ATerminalGetsAtMostTenRedrawsASecondAndEachEnd) {
  Written out;
  ProgressBar bar(out.file(), /*terminal=*/true);
  TwoHundredShortEpochs(bar);
  const std::string text = out.text();
  // Each 32 ms epoch: its first step and its last (which ends the line).
  EXPECT_EQ(Count(text, '\r'), 400u);
  EXPECT_EQ(Count(text, '\n'), 200u);
  EXPECT_LT(text.size(), 20000u);
  EXPECT_NE(text.find("\rEpoch 200/200 [32/32] loss 0.6931\x1b[K\n"),
            std::string::npos);
}

TEST(ProgressBarTest, BreakEndsALineLeftOpen) {
  Written out;
  ProgressBar bar(out.file(), /*terminal=*/true);
  bar.Update("Epoch 1/3", 5, 10, "");
  bar.Break();
  bar.Break();  // Nothing left open.
  EXPECT_EQ(out.text(), "\rEpoch 1/3 [5/10] \x1b[K\n");
}

}  // namespace
}  // namespace examples
