#include "accel/runtime/env/hostlist.h"

#include <cstdlib>

#include "accel/runtime/base/errors.h"

namespace accel::launch_env {
namespace {

[[noreturn]] void Malformed(const std::string& list, const std::string& why) {
  throw UsageError("malformed SLURM host list '" + list + "': " + why);
}

// Splits at commas outside brackets.
std::vector<std::string> TopLevelItems(const std::string& list) {
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) Malformed(list, "unbalanced ']'");
    if (c == ',' && depth == 0) {
      items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) Malformed(list, "unbalanced '['");
  items.push_back(current);
  return items;
}

bool AllDigits(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// "a,b,,c" -> {"a", "b", "", "c"}.
std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

// "01-03,07" -> {"01", "02", "03", "07"}.
std::vector<std::string> ExpandRanges(const std::string& ranges,
                                      const std::string& list) {
  std::vector<std::string> values;
  for (const std::string& part : SplitCommas(ranges)) {
    const size_t dash = part.find('-');
    const std::string low = part.substr(0, dash);
    const std::string high =
        dash == std::string::npos ? low : part.substr(dash + 1);
    if (!AllDigits(low) || !AllDigits(high)) {
      Malformed(list, "'" + part + "' is not a number or range");
    }
    const long first = std::strtol(low.c_str(), nullptr, 10);
    const long last = std::strtol(high.c_str(), nullptr, 10);
    if (last < first || last - first > 100000) {
      Malformed(list, "bad range '" + part + "'");
    }
    for (long n = first; n <= last; ++n) {
      std::string text = std::to_string(n);
      if (text.size() < low.size()) {
        text = std::string(low.size() - text.size(), '0') + text;
      }
      values.push_back(text);
    }
  }
  return values;
}

// Expands the bracket groups of one host pattern, left to right.
void ExpandPattern(const std::string& pattern, const std::string& list,
                   std::vector<std::string>* hosts) {
  const size_t open = pattern.find('[');
  if (open == std::string::npos) {
    if (pattern.empty()) Malformed(list, "empty host name");
    hosts->push_back(pattern);
    return;
  }
  const size_t close = pattern.find(']', open);
  const std::string prefix = pattern.substr(0, open);
  const std::string rest = pattern.substr(close + 1);
  for (const auto& value :
       ExpandRanges(pattern.substr(open + 1, close - open - 1), list)) {
    ExpandPattern(prefix + value + rest, list, hosts);
  }
}

}  // namespace

std::vector<std::string> ExpandHostList(const std::string& list) {
  std::vector<std::string> hosts;
  for (const auto& item : TopLevelItems(list)) {
    ExpandPattern(item, list, &hosts);
  }
  return hosts;
}

std::vector<int> ExpandTasksPerNode(const std::string& list) {
  std::vector<int> counts;
  for (const std::string& part : SplitCommas(list)) {
    const size_t paren = part.find("(x");
    const std::string count = part.substr(0, paren);
    std::string repeat = "1";
    if (paren != std::string::npos) {
      if (part.back() != ')') {
        throw UsageError("malformed SLURM tasks-per-node list '" + list + "'");
      }
      repeat = part.substr(paren + 2, part.size() - paren - 3);
    }
    if (!AllDigits(count) || !AllDigits(repeat)) {
      throw UsageError("malformed SLURM tasks-per-node list '" + list + "'");
    }
    const long times = std::strtol(repeat.c_str(), nullptr, 10);
    if (times > 100000) {
      throw UsageError("malformed SLURM tasks-per-node list '" + list + "'");
    }
    for (long i = 0; i < times; ++i) {
      counts.push_back(
          static_cast<int>(std::strtol(count.c_str(), nullptr, 10)));
    }
  }
  return counts;
}

}  // namespace accel::launch_env
