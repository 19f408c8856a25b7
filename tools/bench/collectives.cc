// Collective latency and throughput of accel against torch.distributed, both
// over Gloo, measured in the same run (a benchmark, not a test).
//
//   bazel run -c opt //tools/bench:collectives -- --num_processes=2
//
// Each figure is the median of many timed iterations on rank 0. The ratio
// column is torch.distributed's time divided by accel's: above 1 means accel
// is faster.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "accel/runtime/errors.h"
#include "accel/runtime/process_group.h"
#include "accel/runtime/program.h"

DEFINE_string(sizes, "4096,65536,1048576,16777216,67108864",
              "Message sizes in bytes for the throughput rows.");
DEFINE_int32(latency_iterations, 200, "Timed iterations per latency row.");
DEFINE_bool(baseline, true, "Also measure torch.distributed (python3-torch).");
DEFINE_string(python, "/usr/bin/python3",
              "Python with torch for the baseline.");
DEFINE_string(torch_script, "",
              "Path of torch_collectives.py (default: runfiles).");

namespace {

using Clock = std::chrono::steady_clock;

double MedianSeconds(const std::function<void()>& fn, int iterations) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    const auto start = Clock::now();
    fn();
    samples.push_back(
        std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2,
                   samples.end());
  return samples[samples.size() / 2];
}

std::vector<size_t> ParseSizes() {
  std::vector<size_t> sizes;
  std::stringstream in(FLAGS_sizes);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) sizes.push_back(std::stoull(item));
  }
  return sizes;
}

std::map<std::string, double> MeasureAccel(accel::Communicator& comm) {
  std::map<std::string, double> results;
  results["barrier"] =
      MedianSeconds([&] { comm.barrier(); }, FLAGS_latency_iterations);
  std::vector<int64_t> small = {0, 1, 2};
  std::vector<int64_t> gathered(3 * comm.size());
  results["allgather_3xint64"] = MedianSeconds(
      [&] {
        comm.allgather(small.data(), gathered.data(), 3, accel::DType::kInt64);
      },
      FLAGS_latency_iterations);
  float one = 1;
  results["allreduce_1xfloat32"] = MedianSeconds(
      [&] {
        comm.allreduce(&one, 1, accel::DType::kFloat32, accel::ReduceOp::kSum);
      },
      FLAGS_latency_iterations);
  for (size_t size : ParseSizes()) {
    const size_t count = size / 4;
    const int iterations =
        static_cast<int>(std::clamp<size_t>((256u << 20) / size, 3, 50));
    std::vector<float> buffer(count, 1.0f);
    std::vector<float> output(count * comm.size());
    results["allgather_" + std::to_string(size)] = MedianSeconds(
        [&] {
          comm.allgather(buffer.data(), output.data(), count,
                         accel::DType::kFloat32);
        },
        iterations);
    results["allreduce_" + std::to_string(size)] = MedianSeconds(
        [&] {
          comm.allreduce(buffer.data(), count, accel::DType::kFloat32,
                         accel::ReduceOp::kSum);
        },
        iterations);
  }
  comm.barrier();
  return results;
}

std::string ScriptPath() {
  if (!FLAGS_torch_script.empty()) return FLAGS_torch_script;
  const std::string relative = "tools/bench/torch_collectives.py";
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return std::string(self, n > 0 ? n : 0) + ".runfiles/accel/" + relative;
}

// Runs the torch.distributed baseline; its last output line is JSON of
// {"name": seconds}. Parsed by hand: flat, numbers only.
std::map<std::string, double> MeasureTorch(int world_size) {
  const std::string command =
      FLAGS_python + " " + ScriptPath() +
      " --world_size=" + std::to_string(world_size) +
      " --sizes=" + FLAGS_sizes +
      " --latency_iterations=" + std::to_string(FLAGS_latency_iterations);
  std::fprintf(stderr, "measuring torch.distributed: %s\n", command.c_str());
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"),
                                             pclose);
  std::map<std::string, double> results;
  if (!pipe) return results;
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe.get())) {
    output.append(buffer, n);
  }
  const size_t open = output.rfind('{');
  if (open == std::string::npos) return results;
  std::stringstream in(output.substr(open + 1));
  std::string entry;
  while (std::getline(in, entry, ',')) {
    const size_t colon = entry.find(':');
    const size_t q1 = entry.find('"');
    const size_t q2 = entry.find('"', q1 + 1);
    if (colon == std::string::npos || q2 == std::string::npos) continue;
    results[entry.substr(q1 + 1, q2 - q1 - 1)] =
        std::stod(entry.substr(colon + 1));
  }
  return results;
}

std::string HumanBytes(size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

void PrintTable(int world_size, const std::map<std::string, double>& ours,
                const std::map<std::string, double>& torch) {
  std::printf("\nCollectives over Gloo, %d ranks on this host (median)\n",
              world_size);
  std::printf("%-24s %10s %16s %20s %8s\n", "operation", "size", "accel",
              "torch.distributed", "ratio");
  auto row = [&](const std::string& label, const std::string& size,
                 const std::string& key, size_t bytes) {
    auto format = [&](const std::map<std::string, double>& m) -> std::string {
      auto it = m.find(key);
      if (it == m.end()) return "n/a";
      char text[64];
      if (bytes == 0) {
        std::snprintf(text, sizeof(text), "%.1f us", it->second * 1e6);
      } else {
        std::snprintf(text, sizeof(text), "%.3f GB/s",
                      bytes / it->second / 1e9);
      }
      return text;
    };
    std::string ratio = "n/a";
    if (ours.count(key) && torch.count(key)) {
      char text[32];
      std::snprintf(text, sizeof(text), "%.2fx", torch.at(key) / ours.at(key));
      ratio = text;
    }
    std::printf("%-24s %10s %16s %20s %8s\n", label.c_str(), size.c_str(),
                format(ours).c_str(), format(torch).c_str(), ratio.c_str());
  };
  row("barrier", "-", "barrier", 0);
  row("allgather 3 x int64", "24 B", "allgather_3xint64", 0);
  row("allreduce 1 x float32", "4 B", "allreduce_1xfloat32", 0);
  for (size_t size : ParseSizes()) {
    row("allgather (per rank)", HumanBytes(size),
        "allgather_" + std::to_string(size), size);
  }
  for (size_t size : ParseSizes()) {
    row("allreduce", HumanBytes(size), "allreduce_" + std::to_string(size),
        size);
  }
  std::printf(
      "ratio = torch.distributed time / accel time (above 1: accel faster)\n");
}

int Main(int argc, char** argv) {
  std::map<std::string, double> ours;
  int world_size;
  int rank;
  {
    accel::ProcessGroupOptions options;
    options.backend = FLAGS_backend;
    auto group = accel::ProcessGroup::Join(
        accel::DistributedEnvironment::FromProcess(), options);
    world_size = group->communicator().size();
    rank = group->communicator().rank();
    ours = MeasureAccel(group->communicator());
  }
  if (rank != 0) return 0;
  std::map<std::string, double> torch;
  if (FLAGS_baseline) torch = MeasureTorch(world_size);
  PrintTable(world_size, ours, torch);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
