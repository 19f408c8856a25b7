#include "accel/runtime/env/env_value.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"

namespace accel {

std::optional<int64_t> EnvInt64(const char* name, int64_t min, int64_t max) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  // strtoll would skip leading blanks.
  const bool starts_well = std::isdigit(static_cast<unsigned char>(*text)) ||
                           *text == '-' || *text == '+';
  if (!starts_well || *end != '\0' || errno != 0 || value < min ||
      value > max) {
    std::string range;
    if (min != std::numeric_limits<int64_t>::min() ||
        max != std::numeric_limits<int64_t>::max()) {
      range = " in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    }
    throw UsageError(std::string("environment variable ") + name +
                     " must be an integer" + range + ", found " +
                     Excerpt(text));
  }
  return value;
}

std::optional<bool> EnvSwitch(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") {
    return true;
  }
  if (lower == "0" || lower == "false" || lower == "off" || lower == "no") {
    return false;
  }
  throw UsageError(std::string("environment variable ") + name +
                   " must be 1 or 0 (true/false, on/off, yes/no), found " +
                   Excerpt(text));
}

void CheckOmpNumThreads(const char* value) {
  if (value == nullptr) return;
  const std::string text = value;
  if (text.empty() ||
      text.find_first_not_of("0123456789,") != std::string::npos) {
    throw UsageError(
        "environment variable OMP_NUM_THREADS must be a number of threads (or "
        "a comma-separated list of them), found " +
        Excerpt(text));
  }
}

void CheckEnvLength(const char* name, const std::string& value,
                    size_t max_bytes) {
  if (value.size() <= max_bytes) return;
  throw UsageError(std::string("environment variable ") + name + " is " +
                   std::to_string(value.size()) + " bytes long; at most " +
                   std::to_string(max_bytes) + " are allowed");
}

}  // namespace accel
