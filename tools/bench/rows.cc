#include "tools/bench/rows.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <sstream>

namespace accel::bench {

std::vector<Row> Rows(const std::vector<size_t>& sizes,
                      int latency_iterations) {
  using Kind = Row::Kind;
  std::vector<Row> rows = {
      {Kind::kBarrier, "barrier", "barrier", 0, false, true,
       latency_iterations},
      {Kind::kAllgather, "allgather_3xint64", "allgather 3 x int64", 24, true,
       true, latency_iterations},
      {Kind::kAllreduce, "allreduce_1xfloat32", "allreduce 1 x float32", 4,
       false, true, latency_iterations},
  };
  auto iterations = [](size_t bytes) {
    return static_cast<int>(std::clamp<size_t>((256u << 20) / bytes, 3, 50));
  };
  for (size_t size : sizes) {
    rows.push_back({Kind::kAllgather, "allgather_" + std::to_string(size),
                    "allgather (per rank)", size, false, false,
                    iterations(size)});
  }
  for (size_t size : sizes) {
    rows.push_back({Kind::kAllreduce, "allreduce_" + std::to_string(size),
                    "allreduce", size, false, false, iterations(size)});
  }
  for (size_t size : sizes) {
    rows.push_back(
        {Kind::kReduceScatter, "reduce_scatter_" + std::to_string(size),
         "reduce-scatter (out)", size, false, false, iterations(size)});
  }
  return rows;
}

std::vector<size_t> ParseSizes(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) sizes.push_back(std::stoull(item));
  }
  return sizes;
}

namespace {

long ContextSwitches() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_nvcsw + usage.ru_nivcsw;
}

}  // namespace

std::vector<double> TimeRounds(const std::function<void()>& call,
                               int iterations, int rounds,
                               const std::function<void()>& align,
                               std::vector<double>* switches) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> medians;
  std::vector<double> samples(iterations);
  for (int round = 0; round < rounds; ++round) {
    align();
    const long switches_before = ContextSwitches();
    for (int i = 0; i < iterations; ++i) {
      const auto start = Clock::now();
      call();
      samples[i] = std::chrono::duration<double>(Clock::now() - start).count();
    }
    if (switches != nullptr) {
      switches->push_back(
          static_cast<double>(ContextSwitches() - switches_before) /
          iterations);
    }
    std::nth_element(samples.begin(), samples.begin() + iterations / 2,
                     samples.end());
    medians.push_back(samples[iterations / 2]);
  }
  return medians;
}

}  // namespace accel::bench
