// The rows of //tools/bench:collectives and how each is timed, shared by
// accel's side and the Open MPI baseline (torch_collectives.py mirrors
// them for torch.distributed).
//
//   for (const accel::bench::Row& row : accel::bench::Rows(sizes, 200)) {
//     std::vector<double> rounds = accel::bench::TimeRounds(
//         [&] { run(row); }, row.iterations, 5, [&] { barrier(); });
//   }
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace accel::bench {

struct Row {
  enum class Kind { kBarrier, kAllgather, kAllreduce, kReduceScatter };
  Kind kind;
  std::string key;    // "allreduce_1048576": the same in every program
  std::string label;  // "allreduce", for the table
  size_t bytes;       // Per rank (reduce-scatter: each rank's output); 0
                      // for barrier
  bool int64;         // int64 elements (else float32)
  bool latency;       // Reported in microseconds, else GB/s
  int iterations;     // Calls per round
};

// barrier, allgather of 3 int64, allreduce of 1 float32, then allgather,
// allreduce and reduce-scatter (sum) of float32 at each size.
std::vector<Row> Rows(const std::vector<size_t>& sizes, int latency_iterations);

// "4096,65536" -> {4096, 65536}.
std::vector<size_t> ParseSizes(const std::string& text);

// Warms up, then times `rounds` rounds of `iterations` calls and returns
// each round's median call time in seconds. `align` runs before each round
// (a barrier, so that ranks start rounds together). With `switches`, also
// each round's context switches per call, over all of the process's
// threads: a transport that hands data between threads shows there.
std::vector<double> TimeRounds(const std::function<void()>& call,
                               int iterations, int rounds,
                               const std::function<void()>& align,
                               std::vector<double>* switches = nullptr);

// The key under which a row's context switches per call are reported.
inline std::string SwitchesKey(const std::string& key) {
  return key + ":switches";
}

}  // namespace accel::bench
