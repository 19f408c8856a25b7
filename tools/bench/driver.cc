#include "tools/bench/driver.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace accel::bench {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> values;
  for (const std::string& item : ParseNames(text)) {
    values.push_back(std::stoi(item));
  }
  return values;
}

std::vector<std::string> ParseNames(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) names.push_back(item);
  }
  return names;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

std::string SelfPath() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return std::string(self, n > 0 ? n : 0);
}

std::string RunCommand(const std::string& name, const std::string& command) {
  std::fprintf(stderr, "measuring %s: %s\n", name.c_str(), command.c_str());
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"),
                                             pclose);
  std::string output;
  if (!pipe) return output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe.get())) {
    output.append(buffer, n);
  }
  return output;
}

Results RunAndParse(const std::string& name, const std::string& command) {
  const std::string output = RunCommand(name, command);
  Results results;
  const size_t open = output.rfind('{');
  try {
    if (open == std::string::npos) throw std::runtime_error("no JSON line");
    const nlohmann::json parsed = nlohmann::json::parse(output.substr(open));
    for (const auto& item : parsed.items()) {
      results[item.key()] = item.value().get<double>();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s gave no results (%s); its output:\n%s\n",
                 name.c_str(), e.what(), output.c_str());
  }
  return results;
}

double Spread::min() const {
  return *std::min_element(values.begin(), values.end());
}

double Spread::max() const {
  return *std::max_element(values.begin(), values.end());
}

std::string Ms(const Spread& s) {
  if (s.empty()) return "n/a";
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f/%.1f/%.1f", s.min() * 1e3,
                s.median() * 1e3, s.max() * 1e3);
  return text;
}

std::string Plain(const Spread& s, const char* format) {
  if (s.empty()) return "n/a";
  char a[32], b[32], c[32];
  std::snprintf(a, sizeof(a), format, s.min());
  std::snprintf(b, sizeof(b), format, s.median());
  std::snprintf(c, sizeof(c), format, s.max());
  return std::string(a) + "/" + b + "/" + c;
}

std::string Ratio(const Spread& ours, const Spread& theirs) {
  if (ours.empty() || theirs.empty()) return "n/a";
  Spread ratio;
  for (size_t i = 0; i < std::min(ours.values.size(), theirs.values.size());
       ++i) {
    ratio.values.push_back(ours.values[i] / theirs.values[i]);
  }
  return Plain(ratio, "%.2f");
}

}  // namespace accel::bench
