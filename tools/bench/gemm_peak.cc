// This machine's single-precision matrix-multiply peak as LibTorch reaches
// it: torch::mm on square float32 matrices (accel::MeasureMatmulPeak), with
// LibTorch's BLAS and intra-op threads. It is the denominator of the MFU
// that //examples:gpt and //tools/bench:lm print, so that MFU says how
// close training gets to what this CPU does, not to a datasheet.
//
//   bazel run -c opt //tools/bench:gemm_peak
//   bazel run -c opt //tools/bench:gemm_peak -- --repetitions=7 --max_size=4096
//
// Three rows, each min/median/max GFLOP/s over --repetitions (each the best
// square size of min_size..max_size, doubling):
//   1 process, 1 thread          one core's peak
//   1 process, default threads   what a lone process gets (Debian's
//                                OpenBLAS: every core)
//   N processes x 1 thread       every core at once, as an N-process job
//                                runs (the processes measure together and
//                                their peaks add up: the MFU denominator
//                                //examples:gpt uses at N processes)
// The last line gives the all-cores peak for --peak_gflops.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <gflags/gflags.h>
#include <torch/version.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "accel/throughput.h"
#include "tools/bench/driver.h"

DEFINE_int32(repetitions, 5, "Measurements per row.");
DEFINE_int64(min_size, 256, "Smallest square size.");
DEFINE_int64(max_size, 2048, "Largest square size.");
DEFINE_double(seconds, 0.3, "Timing per size.");
DEFINE_int32(processes, 0, "Processes of the last row (0: the cores).");
DEFINE_bool(worker, false, "Internal: measure once and print JSON.");
DEFINE_int32(threads, 1,
             "Internal: a worker's threads (0: LibTorch's and the BLAS's "
             "defaults).");

namespace {

accel::MatmulPeak Measure() {
  return accel::MeasureMatmulPeak({.min_size = FLAGS_min_size,
                                   .max_size = FLAGS_max_size,
                                   .seconds_per_size = FLAGS_seconds});
}

// GFLOP/s of `processes` workers of `threads` threads measuring at once,
// added up.
double Concurrent(int processes, int threads) {
  std::vector<std::thread> runners;
  std::vector<double> gflops(processes, 0);
  const std::string command = accel::bench::SelfPath() +
                              " --worker --threads=" + std::to_string(threads) +
                              " --min_size=" + std::to_string(FLAGS_min_size) +
                              " --max_size=" + std::to_string(FLAGS_max_size) +
                              " --seconds=" + std::to_string(FLAGS_seconds);
  for (int p = 0; p < processes; ++p) {
    runners.emplace_back([&, p] {
      gflops[p] = accel::bench::RunAndParse("worker", command)["gflops"];
    });
  }
  double sum = 0;
  for (int p = 0; p < processes; ++p) {
    runners[p].join();
    sum += gflops[p];
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_worker) {
    if (FLAGS_threads > 0) accel::SetCpuThreads(FLAGS_threads);
    const accel::MatmulPeak peak = Measure();
    std::printf("{\"gflops\": %.3f, \"size\": %lld}\n",
                peak.flops_per_second / 1e9, static_cast<long long>(peak.size));
    return 0;
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int processes = FLAGS_processes > 0 ? FLAGS_processes : cores;
  std::printf(
      "CPU: %s, %d cores; LibTorch %s: intra-op threads %d, BLAS "
      "threads %d\n",
      accel::bench::CpuModel().c_str(), cores, TORCH_VERSION,
      at::get_num_threads(), accel::BlasThreads());
  const std::string config = at::show_config();
  const size_t blas = config.find("BLAS_INFO=");
  std::printf(
      "BLAS: %s\n",
      blas == std::string::npos
          ? "unknown"
          : config
                .substr(blas + 10,
                        config.find_first_of(", \n", blas + 10) - blas - 10)
                .c_str());
  std::printf("load before: %s\n", accel::bench::LoadAverage().c_str());
  accel::bench::Spread one, all, each;
  for (int r = 0; r < FLAGS_repetitions; ++r) {
    // A different order each repetition: none always runs first.
    for (int row = 0; row < 3; ++row) {
      switch ((row + r) % 3) {
        case 0:
          one.values.push_back(Concurrent(1, 1));
          break;
        case 1:
          all.values.push_back(Concurrent(1, 0));
          break;
        default:
          each.values.push_back(Concurrent(processes, 1));
      }
    }
  }
  std::printf("load after: %s\n\n", accel::bench::LoadAverage().c_str());
  std::printf(
      "float32 torch::mm, square %lld..%lld, best size per run; "
      "GFLOP/s min/median/max over %d runs\n",
      static_cast<long long>(FLAGS_min_size),
      static_cast<long long>(FLAGS_max_size), FLAGS_repetitions);
  const auto row = [](const std::string& name, const accel::bench::Spread& s) {
    std::printf("%-34s %s\n", name.c_str(),
                accel::bench::Plain(s, "%.1f").c_str());
  };
  row("1 process, 1 thread", one);
  row("1 process, default threads", all);
  row(std::to_string(processes) + " processes x 1 thread (sum)", each);
  std::printf("\nall-cores peak (median): --peak_gflops=%.1f\n", each.median());
  // For //tools/bench:lm: the medians.
  std::printf(
      "{\"one_thread_gflops\": %.3f, \"default_gflops\": %.3f, "
      "\"processes_gflops\": %.3f}\n",
      one.median(), all.median(), each.median());
  return 0;
}
