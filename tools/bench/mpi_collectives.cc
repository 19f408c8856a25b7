// The Open MPI baseline of //tools/bench:collectives: the same rows, timed
// the same way, with plain MPI calls (no accel). Run by the benchmark as
//
//   mpirun -np 2 mpi_collectives --sizes=4096,1048576 --rounds=5
//
// Rank 0 prints one JSON object as its last line: {"key": [round medians in
// seconds], ...} (see rows.h).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench/rows.h"

namespace {

// --name=value from the command line, or `fallback`.
std::string Flag(int argc, char** argv, const std::string& name,
                 const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return argv[i] + prefix.size();
    }
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto sizes = accel::bench::ParseSizes(
      Flag(argc, argv, "sizes", "4096,65536,1048576,16777216,67108864"));
  const int latency_iterations =
      std::atoi(Flag(argc, argv, "latency_iterations", "200").c_str());
  const int rounds = std::atoi(Flag(argc, argv, "rounds", "5").c_str());

  nlohmann::json results;
  auto barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  for (const auto& row : accel::bench::Rows(sizes, latency_iterations)) {
    using Kind = accel::bench::Row::Kind;
    const MPI_Datatype type = row.int64 ? MPI_INT64_T : MPI_FLOAT;
    const int count = static_cast<int>(row.bytes / (row.int64 ? 8 : 4));
    std::vector<char> input(row.bytes + 8, 1), output(row.bytes * size + 8);
    std::function<void()> call;
    if (row.kind == Kind::kBarrier) {
      call = barrier;
    } else if (row.kind == Kind::kAllgather) {
      call = [&] {
        MPI_Allgather(input.data(), count, type, output.data(), count, type,
                      MPI_COMM_WORLD);
      };
    } else if (row.kind == Kind::kReduceScatter) {
      call = [&] {
        MPI_Reduce_scatter_block(output.data(), input.data(), count, type,
                                 MPI_SUM, MPI_COMM_WORLD);
      };
    } else {
      call = [&] {
        MPI_Allreduce(MPI_IN_PLACE, input.data(), count, type, MPI_SUM,
                      MPI_COMM_WORLD);
      };
    }
    std::vector<double> switches;
    results[row.key] = accel::bench::TimeRounds(call, row.iterations, rounds,
                                                barrier, &switches);
    results[accel::bench::SwitchesKey(row.key)] = switches;
  }
  if (rank == 0) std::printf("%s\n", results.dump().c_str());
  MPI_Finalize();
  return 0;
}
