#include "examples/digits.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/base/files.h"

namespace accel_examples {
namespace {

constexpr int kPixels = 64;
constexpr int kTestEvery = 5;

// SplitMix64: a well-mixed value of (seed, epoch, index).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One line's 64 grey levels and label, or false.
bool ParseLine(const std::string& line, std::vector<float>& pixels,
               int64_t& label) {
  pixels.clear();
  const char* at = line.c_str();
  for (int field = 0; field <= kPixels; ++field) {
    char* end = nullptr;
    const long value = std::strtol(at, &end, 10);
    if (end == at || value < 0 || value > (field < kPixels ? 16 : 9)) {
      return false;
    }
    if (field < kPixels) {
      pixels.push_back(static_cast<float>(value) / 16.0f);
    } else {
      label = value;
    }
    at = end;
    if (field < kPixels && *at++ != ',') return false;
  }
  return *at == '\0' || *at == '\r';
}

// The next line of `file` (without its newline), however long; false at
// the end.
bool ReadLine(gzFile file, std::string& line) {
  line.clear();
  char buffer[4096];
  while (gzgets(file, buffer, sizeof(buffer)) != nullptr) {
    line += buffer;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      return true;
    }
    if (line.size() > (1u << 20)) return true;  // Reported as a bad line.
  }
  return !line.empty();
}

// A truncated or corrupt gzip stream, named as such (closes `file`).
void ThrowIfUnreadable(gzFile file, const std::string& path) {
  int error = Z_OK;
  const char* message = gzerror(file, &error);
  if (error != Z_OK && error != Z_STREAM_END) {
    const std::string why = message != nullptr ? message : "";
    gzclose(file);
    throw accel::UsageError("cannot read " + path + ": " + why +
                            " (a truncated or corrupt gzip file?)");
  }
}

}  // namespace

std::string FindDigits(const std::string& path) {
  const std::string chosen = path.empty() ? kDigitsPath : path;
  struct stat info;
  if (stat(chosen.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    throw accel::UsageError(chosen + " is not a file");
  }
  if (!accel::IsFile(chosen)) {
    throw accel::UsageError(
        chosen + " is missing" +
        (path.empty() ? std::string("; install python3-sklearn (tools/setup.sh "
                                    "does), or give --data_file")
                      : std::string()));
  }
  return chosen;
}

DigitSplits ReadDigits(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw accel::UsageError("cannot open " + path + ": " +
                            accel::ErrnoText(errno));
  }
  std::vector<float> train_pixels, test_pixels, pixels;
  std::vector<int64_t> train_labels, test_labels;
  std::string line;
  int number = 0;
  while (ReadLine(file, line)) {
    ++number;
    ThrowIfUnreadable(file, path);
    int64_t label = 0;
    if (!ParseLine(line, pixels, label)) {
      gzclose(file);
      throw accel::UsageError(path + ":" + std::to_string(number) +
                              ": expected 64 grey levels (0-16) and a digit, "
                              "found " +
                              accel::Excerpt(line));
    }
    const bool test = (number - 1) % kTestEvery == 0;
    auto& into = test ? test_pixels : train_pixels;
    into.insert(into.end(), pixels.begin(), pixels.end());
    (test ? test_labels : train_labels).push_back(label);
  }
  ThrowIfUnreadable(file, path);
  gzclose(file);
  if (test_labels.empty()) throw accel::UsageError(path + " has no images");
  auto to_set = [](std::vector<float>& images, std::vector<int64_t>& labels) {
    const int64_t n = static_cast<int64_t>(labels.size());
    return DigitSet{torch::tensor(images).reshape({n, 1, 8, 8}),
                    torch::tensor(labels, torch::kLong)};
  };
  return {to_set(train_pixels, train_labels), to_set(test_pixels, test_labels)};
}

torch::data::Example<> Digits::get(size_t i) {
  const int64_t index = static_cast<int64_t>(i);
  torch::Tensor image = set_.images[index];
  if (augment_) {
    const uint64_t draw =
        Mix(seed_ ^ Mix(static_cast<uint64_t>(epoch_->load()) ^ Mix(i)));
    const int64_t dy = static_cast<int64_t>(draw % 3) - 1;
    const int64_t dx = static_cast<int64_t>((draw / 3) % 3) - 1;
    // Shifted in, with the uncovered row and column left empty.
    image = torch::roll(image, {dy, dx}, {1, 2});
    if (dy != 0) image.select(1, dy > 0 ? 0 : 7).zero_();
    if (dx != 0) image.select(2, dx > 0 ? 0 : 7).zero_();
  }
  return {image, set_.labels[index]};
}

}  // namespace accel_examples
