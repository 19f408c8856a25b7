// A small MPI program for mpi_failure_test: one scenario per run, each a way
// for a job to go wrong (or right).
//
//   mpirun -np 2 mpi_fault_worker --scenario=mismatch
//   mpi_fault_worker --num_processes=2 --backend=mpi --scenario=sum
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/launch/program.h"
#include "backends/mpi/mpi_transport.h"

DEFINE_string(
    scenario, "sum",
    "sum (allreduce and report), caller_comm (a communicator on "
    "the program's MPI communicator), thread_single (the program "
    "initialized MPI without threads), mismatch (rank 0 waits, rank 1 "
    "gathers), timeout (rank 1 never calls), departed (rank 1 "
    "leaves the job but keeps running), killed (rank 1 is "
    "SIGKILLed)");

namespace {

int Main(int argc, char** argv) {
  if (FLAGS_scenario == "thread_single") {
    // The program owns MPI, at a thread level accel cannot work with.
    MPI_Init(&argc, &argv);
  }
  accel::ProcessGroupOptions options;
  options.backend = accel::flags::backend.value();
  auto group = accel::ProcessGroup::Join(
      accel::DistributedEnvironment::FromProcess(), options);
  accel::Communicator& comm = group->communicator();
  const int rank = comm.rank();
  if (FLAGS_scenario == "sum") {
    int64_t value = rank + 1;
    comm.allreduce(&value, 1, accel::DType::kInt64, accel::ReduceOp::kSum);
    std::printf("rank %d of %d (%s): sum %lld\n", rank, comm.size(),
                comm.backend_name().c_str(), static_cast<long long>(value));
  } else if (FLAGS_scenario == "caller_comm") {
    // A communicator over the program's own MPI communicator: the world with
    // the ranks in reverse order.
    MPI_Comm reversed;
    MPI_Comm_split(MPI_COMM_WORLD, 0, comm.size() - 1 - rank, &reversed);
    accel::BackendContext context;
    context.rank = comm.size() - 1 - rank;
    context.size = comm.size();
    std::unique_ptr<accel::Communicator> mine =
        accel::MakeMpiCommunicator(context, reversed);
    std::vector<int32_t> world_ranks(mine->size());
    const int32_t world_rank = rank;
    mine->allgather(&world_rank, world_ranks.data(), 1, accel::DType::kInt32);
    std::string order;
    for (int32_t r : world_ranks) order += " " + std::to_string(r);
    std::printf(
        "rank %d is rank %d of the reversed communicator, which holds "
        "world ranks%s\n",
        rank, mine->rank(), order.c_str());
    mine.reset();
    MPI_Comm_free(&reversed);
  } else if (FLAGS_scenario == "mismatch") {
    float values[4] = {};
    accel::CollectiveOptions call{};  // {}: records this line.
    if (rank == 0) {
      call.api = "wait_for_everyone";
      comm.barrier(call);
    } else {
      call.api = "gather";
      comm.allgather(values, values, 1, accel::DType::kFloat32, call);
    }
  } else if (FLAGS_scenario == "timeout") {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(30));
      std::printf("rank 1 finished\n");
    } else {
      comm.barrier({std::chrono::milliseconds(500)});
    }
  } else if (FLAGS_scenario == "departed") {
    comm.barrier();
    if (rank == 1) {
      group.reset();  // Leaves the store: the job sees rank 1 exit.
      std::this_thread::sleep_for(std::chrono::seconds(30));
      std::printf("rank 1 finished\n");
      return 0;
    }
    comm.barrier();
  } else if (FLAGS_scenario == "killed") {
    comm.barrier();
    if (rank == 1) raise(SIGKILL);
    comm.barrier();
  } else {
    throw accel::UsageError("unknown --scenario=" + FLAGS_scenario);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
