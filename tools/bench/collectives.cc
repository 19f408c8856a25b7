// Collective latency and throughput of accel against Open MPI and
// torch.distributed, measured in the same run (a benchmark, not a test).
//
//   bazel run -c opt //tools/bench:collectives -- --num_processes=2
//   # accel's MPI backend instead (the ranks run under mpirun):
//   bazel run -c opt //tools/bench:collectives -- --num_processes=2
//   --backend=mpi
//
// Every row is timed the same way in each program (tools/bench/rows.h): a
// round is the median of many calls; each program runs --rounds rounds, and
// the whole comparison repeats --repetitions times, alternating accel, Open
// MPI (tools/bench/mpi_collectives.cc under mpirun) and torch.distributed
// (tools/bench/torch_collectives.py, Gloo), so that a change in the
// machine's load hits all three. Cells show min / median / max over all
// rounds; the ratios compare medians: the other's time over accel's (above
// 1: accel is faster). The machine's load average is printed with the
// table: on a shared machine, rerun when it is quiet.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/launch/mpirun.h"
#include "accel/runtime/launch/program.h"
#include "tools/bench/driver.h"
#include "tools/bench/rows.h"

DEFINE_string(sizes, "4096,65536,1048576,16777216,67108864",
              "Message sizes in bytes for the throughput rows.");
DEFINE_int32(latency_iterations, 200, "Calls per round of a latency row.");
DEFINE_int32(rounds, 5, "Rounds per row and program in each repetition.");
DEFINE_int32(repetitions, 3,
             "How many times to alternate accel, Open MPI and torch.");
DEFINE_bool(torch_baseline, true,
            "Also measure torch.distributed (python3-torch, Gloo).");
DEFINE_bool(mpi_baseline, true, "Also measure Open MPI (mpirun).");
DEFINE_string(python, "/usr/bin/python3",
              "Python with torch for the baseline.");

namespace {

using accel::bench::Row;
// Per row key: every round's median call time, in seconds.
using Samples = std::map<std::string, std::vector<double>>;

std::string Runfile(const std::string& relative) {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return std::string(self, n > 0 ? n : 0) + ".runfiles/accel/" + relative;
}

void Append(Samples& to, const Samples& from) {
  for (const auto& [key, values] : from) {
    to[key].insert(to[key].end(), values.begin(), values.end());
  }
}

Samples MeasureAccel(accel::Communicator& comm, const std::vector<Row>& rows) {
  Samples results;
  auto barrier = [&] { comm.barrier(); };
  for (const Row& row : rows) {
    const size_t element = row.int64 ? 8 : 4;
    const size_t count = row.bytes / element;
    const accel::DType dtype =
        row.int64 ? accel::DType::kInt64 : accel::DType::kFloat32;
    std::vector<char> input(row.bytes + 8, 1);
    std::vector<char> output(row.bytes * comm.size() + 8);
    std::function<void()> call;
    if (row.kind == Row::Kind::kBarrier) {
      call = barrier;
    } else if (row.kind == Row::Kind::kAllgather) {
      call = [&] { comm.allgather(input.data(), output.data(), count, dtype); };
    } else if (row.kind == Row::Kind::kReduceScatter) {
      // Each rank reduces size() segments of `count` elements (in `output`,
      // which is large enough) and keeps its own.
      const std::vector<size_t> counts(comm.size(), count);
      call = [&, counts] {
        comm.reduce_scatter(output.data(), input.data(), counts, dtype,
                            accel::ReduceOp::kSum);
      };
    } else {
      call = [&] {
        comm.allreduce(input.data(), count, dtype, accel::ReduceOp::kSum);
      };
    }
    results[row.key] =
        accel::bench::TimeRounds(call, row.iterations, FLAGS_rounds, barrier,
                                 &results[accel::bench::SwitchesKey(row.key)]);
  }
  return results;
}

// Runs a baseline program; its last output line is JSON of {"key":
// [seconds, ...]}.
Samples RunBaseline(const std::string& name,
                    const std::vector<std::string>& argv) {
  std::string command;
  // A baseline started from inside an MPI job (--backend=mpi) must not
  // think it is part of that job.
  for (char** env = environ; *env != nullptr; ++env) {
    const std::string entry = *env;
    for (const char* prefix : {"OMPI_", "PMIX_", "OPAL_", "ORTE_"}) {
      if (entry.rfind(prefix, 0) == 0) {
        command += "-u " + entry.substr(0, entry.find('=')) + " ";
      }
    }
  }
  command = "env " + command;
  for (const auto& arg : argv) command += "'" + arg + "' ";
  const std::string output = accel::bench::RunCommand(name, command);
  Samples results;
  const size_t open = output.rfind("\n{");
  const std::string last =
      output.substr(open == std::string::npos ? 0 : open + 1);
  try {
    const nlohmann::json parsed = nlohmann::json::parse(last);
    for (const auto& item : parsed.items()) {
      results[item.key()] = item.value().get<std::vector<double>>();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s gave no results (%s); its output:\n%s\n",
                 name.c_str(), e.what(), output.c_str());
  }
  return results;
}

std::string HumanBytes(size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// "min / median / max" of a row, in us or GB/s.
std::string Cell(const Row& row, const Samples& samples) {
  auto it = samples.find(row.key);
  if (it == samples.end() || it->second.empty()) return "n/a";
  const auto [low, high] =
      std::minmax_element(it->second.begin(), it->second.end());
  const double median = Median(it->second);
  char text[96];
  if (row.latency) {
    std::snprintf(text, sizeof(text), "%.2f / %.2f / %.2f us", *low * 1e6,
                  median * 1e6, *high * 1e6);
  } else {
    // Throughput: the slowest round is the lowest figure.
    const double gb = row.bytes / 1e9;
    std::snprintf(text, sizeof(text), "%.2f / %.2f / %.2f GB/s", gb / *high,
                  gb / median, gb / *low);
  }
  return text;
}

// The other's median time over accel's: above 1, accel is faster.
double Ratio(const Row& row, const Samples& ours, const Samples& theirs) {
  auto a = ours.find(row.key);
  auto b = theirs.find(row.key);
  if (a == ours.end() || b == theirs.end() || a->second.empty() ||
      b->second.empty()) {
    return 0;
  }
  return Median(b->second) / Median(a->second);
}

// How steady a row is across repetitions: the largest repetition median over
// the smallest (each repetition appends --rounds samples in order).
double Spread(const Row& row, const Samples& samples) {
  auto it = samples.find(row.key);
  if (it == samples.end() || it->second.empty()) return 0;
  std::vector<double> medians;
  for (size_t at = 0; at < it->second.size(); at += FLAGS_rounds) {
    const size_t end = std::min(it->second.size(), at + FLAGS_rounds);
    medians.push_back(
        Median({it->second.begin() + at, it->second.begin() + end}));
  }
  const auto [low, high] = std::minmax_element(medians.begin(), medians.end());
  return *high / *low;
}

std::string RatioText(double ratio) {
  if (ratio == 0) return "n/a";
  char text[32];
  std::snprintf(text, sizeof(text), "%.2fx", ratio);
  return text;
}

void PrintTable(int world_size, const std::string& backend,
                const std::vector<Row>& rows, const Samples& ours,
                const Samples& mpi, const Samples& torch,
                const std::string& load_before) {
  const char* shared = std::getenv("ACCEL_SHARED_MEMORY");
  std::printf(
      "\nCollectives, %d ranks on this host (%ld CPUs), accel backend %s%s\n"
      "load average (1, 5, 15 min): %s before, %s after\n"
      "cells: min / median / max over %d repetitions x %d rounds; a round "
      "is the median of its calls\n",
      world_size, sysconf(_SC_NPROCESSORS_ONLN), backend.c_str(),
      backend == "gloo" ? (shared != nullptr && std::string(shared) == "0"
                               ? " (TCP only)"
                               : " (shared memory on this host)")
                        : "",
      load_before.c_str(), accel::bench::LoadAverage().c_str(),
      FLAGS_repetitions, FLAGS_rounds);
  std::printf("%-22s %7s %28s %28s %28s %7s %7s %7s\n", "operation", "size",
              "accel", "Open MPI", "torch.distributed", "vs MPI", "vs torch",
              "spread");
  for (const Row& row : rows) {
    std::printf("%-22s %7s %28s %28s %28s %7s %7s %7s\n", row.label.c_str(),
                row.bytes == 0 ? "-" : HumanBytes(row.bytes).c_str(),
                Cell(row, ours).c_str(), Cell(row, mpi).c_str(),
                Cell(row, torch).c_str(),
                RatioText(Ratio(row, ours, mpi)).c_str(),
                RatioText(Ratio(row, ours, torch)).c_str(),
                RatioText(Spread(row, ours)).c_str());
  }
  std::printf(
      "vs X = X's median time / accel's (above 1: accel faster); spread = "
      "accel's slowest repetition median / its fastest\n\n");
  std::printf("context switches per call on rank 0, all threads (median):\n");
  std::printf("%-22s %7s %10s %10s %18s\n", "operation", "size", "accel",
              "Open MPI", "torch.distributed");
  auto switches = [](const Row& row, const Samples& samples) -> std::string {
    auto it = samples.find(accel::bench::SwitchesKey(row.key));
    if (it == samples.end() || it->second.empty()) return "n/a";
    char text[32];
    std::snprintf(text, sizeof(text), "%.2f", Median(it->second));
    return text;
  };
  for (const Row& row : rows) {
    std::printf("%-22s %7s %10s %10s %18s\n", row.label.c_str(),
                row.bytes == 0 ? "-" : HumanBytes(row.bytes).c_str(),
                switches(row, ours).c_str(), switches(row, mpi).c_str(),
                switches(row, torch).c_str());
  }
  std::printf(
      "\n"
      "Targets (issue 22): barrier and 4 B allreduce at least 0.5x Open "
      "MPI; every throughput row at least 0.8x Open MPI.\n");
  int below = 0;
  for (const Row& row : rows) {
    const bool latency_target =
        row.key == "barrier" || row.key == "allreduce_1xfloat32";
    if (row.latency && !latency_target) continue;
    const double vs_mpi = Ratio(row, ours, mpi);
    const bool met = vs_mpi >= (latency_target ? 0.5 : 0.8);
    if (!met) ++below;
    std::printf("  %-22s %7s vs MPI %-7s %s\n", row.label.c_str(),
                row.bytes == 0 ? "-" : HumanBytes(row.bytes).c_str(),
                RatioText(vs_mpi).c_str(), met ? "met" : "below");
  }
  std::printf("%d row(s) below target\n", below);
}

int Main(int argc, char** argv) {
  const std::string load_before = accel::bench::LoadAverage();
  accel::ProcessGroupOptions options;
  options.backend = accel::flags::backend.value();
  auto group = accel::ProcessGroup::Join(
      accel::DistributedEnvironment::FromProcess(), options);
  accel::Communicator& comm = group->communicator();
  const std::vector<size_t> sizes = accel::bench::ParseSizes(FLAGS_sizes);
  const std::vector<Row> rows =
      accel::bench::Rows(sizes, FLAGS_latency_iterations);
  Samples ours, mpi, torch;
  for (int repetition = 0; repetition < FLAGS_repetitions; ++repetition) {
    Append(ours, MeasureAccel(comm, rows));
    if (comm.rank() == 0 && FLAGS_mpi_baseline) {
      std::vector<std::string> argv = accel::MpirunCommand(
          comm.size(), {Runfile("tools/bench/mpi_collectives")}, {});
      for (const std::string& flag :
           {"--sizes=" + FLAGS_sizes,
            "--latency_iterations=" + std::to_string(FLAGS_latency_iterations),
            "--rounds=" + std::to_string(FLAGS_rounds)}) {
        argv.push_back(flag);
      }
      Append(mpi, RunBaseline("Open MPI", argv));
    }
    if (comm.rank() == 0 && FLAGS_torch_baseline) {
      Append(torch, RunBaseline("torch.distributed",
                                {FLAGS_python,
                                 Runfile("tools/bench/torch_collectives.py"),
                                 "--world_size=" + std::to_string(comm.size()),
                                 "--sizes=" + FLAGS_sizes,
                                 "--latency_iterations=" +
                                     std::to_string(FLAGS_latency_iterations),
                                 "--rounds=" + std::to_string(FLAGS_rounds)}));
    }
    // The other ranks wait (asleep) while rank 0 runs the baselines.
    comm.barrier({std::chrono::hours(1)});
  }
  if (comm.rank() == 0) {
    PrintTable(comm.size(), comm.backend_name(), rows, ours, mpi, torch,
               load_before);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
