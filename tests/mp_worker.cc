// A rank program for the end-to-end tests of the launcher and the backends.
//
//   launch --num_processes=3 -- mp_worker --scenario=collectives
//
// Scenarios: collectives (every operation, checked), loop (--steps checked
// allreduces, 10 ms apart), die (rank --die_rank
// kills itself with SIGKILL mid-training while the others keep reducing),
// rendezvous (rank 0 prints how long joining took), sleep (ranks wait to
// be signalled). With --pid_dir each rank writes its pid
// and the pid of a child it spawns, so tests can prove nothing outlives them.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/launch/program.h"

DEFINE_string(scenario, "collectives",
              "collectives, loop, die, rendezvous or sleep");
DEFINE_int32(die_rank, 1, "The rank that kills itself in --scenario=die.");
DEFINE_string(pid_dir, "", "Folder for <rank>.pid files.");
DEFINE_int32(timeout_ms, 20000, "Collective timeout.");
DEFINE_int32(steps, 300, "Steps of --scenario=loop.");
DEFINE_int32(start_delay_ms, 0,
             "Sleep before joining, as a rank on a busy machine starts late.");

namespace {

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

void WritePids(int rank) {
  if (FLAGS_pid_dir.empty()) return;
  const pid_t child = fork();
  if (child == 0) {
    // A grandchild of the launcher, which must not outlive the job.
    execl("/bin/sleep", "sleep", "1000", static_cast<char*>(nullptr));
    _exit(1);
  }
  std::ofstream(FLAGS_pid_dir + "/rank" + std::to_string(rank) + ".pid")
      << getpid();
  std::ofstream(FLAGS_pid_dir + "/child" + std::to_string(rank) + ".pid")
      << child;
}

void RunCollectives(accel::Communicator& comm) {
  const int n = comm.size();
  const int rank = comm.rank();
  std::vector<int64_t> mine = {rank, rank * 10, rank * 100};
  std::vector<int64_t> all(3 * n);
  comm.allgather(mine.data(), all.data(), 3, accel::DType::kInt64);
  for (int r = 0; r < n; ++r) Check(all[3 * r + 1] == r * 10, "allgather");
  double sum = rank + 1;
  comm.allreduce(&sum, 1, accel::DType::kFloat64, accel::ReduceOp::kSum);
  Check(sum == n * (n + 1) / 2.0, "allreduce");
  int32_t value = rank == n - 1 ? 42 : 0;
  comm.broadcast(&value, 1, accel::DType::kInt32, n - 1);
  Check(value == 42, "broadcast");
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r;
  std::vector<float> part(rank, static_cast<float>(rank));
  std::vector<float> gathered(n * (n - 1) / 2);
  comm.allgatherv(part.data(), gathered.data(), counts, accel::DType::kFloat32);
  Check(gathered.empty() || gathered.back() == n - 1, "allgatherv");
  comm.barrier();
  std::printf("rank %d/%d ok: sum=%g\n", rank, n, sum);
}

void RunDie(accel::Communicator& comm) {
  std::vector<float> gradients(1000, 1.0f);
  for (int step = 0; step < 100000; ++step) {
    if (comm.rank() == FLAGS_die_rank && step == 3) raise(SIGKILL);
    comm.allreduce(gradients.data(), gradients.size(), accel::DType::kFloat32,
                   accel::ReduceOp::kMax);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int Main(int argc, char** argv) {
  accel::ProcessGroupOptions options;
  options.backend = accel::flags::backend.value();
  options.communicator.timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
  options.rendezvous_timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
  options.network_timeout =
      std::chrono::seconds(accel::flags::network_timeout_s.value());
  std::this_thread::sleep_for(std::chrono::milliseconds(FLAGS_start_delay_ms));
  const auto join_start = std::chrono::steady_clock::now();
  auto group = accel::ProcessGroup::Join(
      accel::DistributedEnvironment::FromProcess(), options);
  accel::Communicator& comm = group->communicator();
  WritePids(comm.rank());
  if (FLAGS_scenario == "collectives") {
    RunCollectives(comm);
  } else if (FLAGS_scenario == "die") {
    RunDie(comm);
  } else if (FLAGS_scenario == "loop") {
    // Steady traffic for a while, each result checked.
    for (int step = 0; step < FLAGS_steps; ++step) {
      double value = 1;
      comm.allreduce(&value, 1, accel::DType::kFloat64, accel::ReduceOp::kSum);
      Check(value == comm.size(), "allreduce in loop");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::printf("rank %d/%d ok: %d steps\n", comm.rank(), comm.size(),
                FLAGS_steps);
  } else if (FLAGS_scenario == "rendezvous") {
    // How long joining took, as rank 0 saw it (it waits for the last rank
    // to start and connect), up to the first barrier.
    comm.barrier();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - join_start)
                        .count();
    if (comm.rank() == 0) {
      std::printf("rendezvous of %d ranks: %lld ms\n", comm.size(),
                  static_cast<long long>(ms));
    }
  } else if (FLAGS_scenario == "sleep") {
    comm.barrier();
    std::printf("rank %d sleeping\n", comm.rank());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::minutes(10));
  } else {
    throw accel::UsageError("unknown --scenario=" + FLAGS_scenario);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A program that ignores SIGCHLD itself before InitProgram.
  if (std::getenv("MP_WORKER_IGNORE_SIGCHLD") != nullptr) {
    signal(SIGCHLD, SIG_IGN);
  }
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
