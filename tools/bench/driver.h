// What the benchmarks that start their own ranks share: running a
// measurement as a child process and reading its JSON, and showing a
// figure over repetitions as min/median/max (and ratios of two).
//
//   accel::bench::Results r = accel::bench::RunAndParse(
//       "accel", accel::bench::SelfPath() + " --worker --num_processes=2");
//   accel::bench::Spread step;  step.values.push_back(r["step"]);
//   std::printf("%s\n", accel::bench::Ms(step).c_str());   // "1.0/1.2/1.5"
#pragma once

#include <map>
#include <string>
#include <vector>

namespace accel::bench {

using Results = std::map<std::string, double>;

double Median(std::vector<double> values);

// "1,2,4" -> {1, 2, 4}; "mlp,conv" -> {"mlp", "conv"}.
std::vector<int> ParseList(const std::string& text);
std::vector<std::string> ParseNames(const std::string& text);

// The machine's load averages, "1.02 0.87 0.66" (1, 5 and 15 minutes).
std::string LoadAverage();

// /proc/cpuinfo's first "model name", e.g. "AMD EPYC" (tables name the CPU
// they were measured on).
std::string CpuModel();

// This program's path (to start it again as a worker).
std::string SelfPath();

// Runs `command` (saying so on stderr) and returns its standard output.
std::string RunCommand(const std::string& name, const std::string& command);

// Runs `command`; its last line that starts with '{' is JSON of
// {"name": number}. Prints the command and, when it gave no results, its
// output (to stderr).
Results RunAndParse(const std::string& name, const std::string& command);

// One figure over the repetitions.
struct Spread {
  std::vector<double> values;
  bool empty() const { return values.empty(); }
  double min() const;
  double max() const;
  double median() const { return Median(values); }
};

// Seconds as milliseconds "min/median/max"; "n/a" when empty.
std::string Ms(const Spread& s);
// Each of min/median/max through the printf format.
std::string Plain(const Spread& s, const char* format);
// ours / theirs, min/median/max over the runs paired by repetition (each
// pair ran back to back).
std::string Ratio(const Spread& ours, const Spread& theirs);

}  // namespace accel::bench
