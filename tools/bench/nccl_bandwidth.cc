// Bandwidth of accel's nccl backend on device buffers (run by hand or by
// tools/gpu_check.sh on a GPU machine; a benchmark, not a test).
//
//   nccl_bandwidth [--num_processes=N] [--sizes=1048576,...]
//
// Prints, on rank 0, the median time and the bus bandwidth of allreduce and
// allgather for each size (bus bandwidth as nccl-tests define it:
// algorithm bytes times 2(n-1)/n for allreduce and (n-1)/n for allgather).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/launch/program.h"

DEFINE_string(sizes, "1048576,16777216,268435456,1073741824",
              "Bytes per rank for each row.");
DEFINE_int32(iterations, 20, "Timed iterations per row.");

namespace {

double MedianSeconds(accel::Communicator& comm, int iterations,
                     const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    fn();
    samples.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int Main(int argc, char** argv) {
  accel::ProcessGroupOptions options;
  options.backend = "nccl";
  auto group = accel::ProcessGroup::Join(
      accel::DistributedEnvironment::FromProcess(), options);
  accel::Communicator& comm = group->communicator();
  const int n = comm.size();
  if (comm.rank() == 0) {
    std::printf("nccl backend, %d rank(s), device buffers (median of %d)\n", n,
                FLAGS_iterations);
    std::printf("%-10s %14s %12s %14s %12s\n", "bytes", "allreduce us",
                "busbw GB/s", "allgather us", "busbw GB/s");
  }
  std::stringstream in(FLAGS_sizes);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t bytes = std::stoull(item);
    const size_t count = bytes / sizeof(float);
    void* buffer = nullptr;
    void* gathered = nullptr;
    if (cudaMalloc(&buffer, bytes) != cudaSuccess ||
        cudaMalloc(&gathered, bytes * n) != cudaSuccess) {
      throw accel::Error("cudaMalloc of " + item + " bytes failed");
    }
    cudaMemset(buffer, 0, bytes);
    const double reduce = MedianSeconds(comm, FLAGS_iterations, [&] {
      comm.allreduce(buffer, count, accel::DType::kFloat32,
                     accel::ReduceOp::kSum);
    });
    const double gather = MedianSeconds(comm, FLAGS_iterations, [&] {
      comm.allgather(buffer, gathered, count, accel::DType::kFloat32);
    });
    if (comm.rank() == 0) {
      const double reduce_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
      const double gather_factor = n > 1 ? double(n - 1) : 1.0;
      std::printf("%-10zu %14.1f %12.2f %14.1f %12.2f\n", bytes, reduce * 1e6,
                  bytes * reduce_factor / reduce / 1e9, gather * 1e6,
                  bytes * gather_factor / gather / 1e9);
      std::fflush(stdout);
    }
    cudaFree(buffer);
    cudaFree(gathered);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
