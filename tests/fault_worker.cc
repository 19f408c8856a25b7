// Programs with the classic distributed-training bugs, for the fault
// injection tests: each must end on every rank with a clear error, fast.
//
//   fault_worker --num_processes=2 --scenario=main_only_wait
#include <signal.h>
#include <sys/resource.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "accel/accelerator.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/launch/program.h"

DEFINE_string(scenario, "main_only_wait",
              "main_only_wait, main_only_wait_then_exit, skip_gather, "
              "late_rank, wrong_device, stop_main, burst_then_stop, "
              "shape_mismatch, idle_then_save, error_on_rank0, error_on_rank1, "
              "uncaught_on_rank1, stage3_forward_alone, "
              "stage3_free_after_end, stage3_save_model_main_only, "
              "rank1_disk_full or "
              "accelerators_in_turn");
DEFINE_int32(late_s, 6, "How late rank 1 is in --scenario=late_rank.");
DEFINE_int32(idle_s, 6, "How long --scenario=idle_then_save idles.");
DEFINE_string(save_dir, "", "Where --scenario=idle_then_save saves.");

namespace {

// Several Accelerators in one process, as a program that makes one per
// phase does: they share the job; after end_training none can be made.
int AcceleratorsInTurn() {
  const torch::Tensor rank = torch::ones({1});
  {
    accel::Accelerator first;
    first.gather(rank);
  }
  {
    accel::Accelerator second;  // After the first.
    accel::Accelerator third;   // Beside the second.
    second.print("second gathered", second.gather(rank).size(0));
    third.print("third gathered", third.gather(rank).size(0));
    third.end_training();
  }
  try {
    accel::Accelerator late;
  } catch (const accel::UsageError& e) {
    std::printf("late: %s\n", e.what());
  }
  return 0;
}

int Main(int argc, char** argv) {
  if (FLAGS_scenario == "accelerators_in_turn") return AcceleratorsInTurn();
  accel::Accelerator accelerator;
  const torch::Tensor ones = torch::ones({2});
  accelerator.gather(ones);  // Every scenario starts in step.
  const bool main = accelerator.is_main_process();
  // The model scenarios prepare (under stage 3: two units) and its SGD.
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::Tanh(),
                            torch::nn::Linear(8, 2));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  if (FLAGS_scenario == "main_only_wait") {
    // The seed document's warning: a barrier inside `if (is_main_process)`.
    if (main) accelerator.wait_for_everyone();
    accelerator.gather(ones);
  } else if (FLAGS_scenario == "main_only_wait_then_exit") {
    if (main) accelerator.wait_for_everyone();
  } else if (FLAGS_scenario == "skip_gather") {
    if (!main) accelerator.gather(ones);
    accelerator.wait_for_everyone();
  } else if (FLAGS_scenario == "late_rank") {
    if (!main) std::this_thread::sleep_for(std::chrono::seconds(FLAGS_late_s));
    accelerator.gather(ones);
  } else if (FLAGS_scenario == "stage3_forward_alone") {
    // Under --zero_stage=3, rank 0 runs the model's forward (its units'
    // gathers) while rank 1 calls gather.
    auto [model, optimizer] = accelerator.prepare(net, sgd);
    if (main) {
      model->forward(torch::ones({1, 4}));
    } else {
      accelerator.gather(ones);
    }
  } else if (FLAGS_scenario == "stage3_save_model_main_only") {
    // save_model under stage 3 gathers on every rank; the main process
    // alone calls it here (the trial saw transport.h:57 named as its line).
    auto [model, optimizer] = accelerator.prepare(net, sgd);
    if (main) {
      accelerator.save_model(model, FLAGS_save_dir);  // save_model's line
    }
    accelerator.wait_for_everyone();
  } else if (FLAGS_scenario == "stage3_free_after_end") {
    // The trial's finding: free_memory after end_training under stage 3
    // called into the group's freed communicator (SIGSEGV, no message).
    auto [model, optimizer] = accelerator.prepare(net, sgd);
    accelerator.backward(model->forward(torch::ones({1, 4})).sum());
    optimizer.step();
    accelerator.end_training();
    try {
      accelerator.free_memory(model, optimizer);
    } catch (const accel::UsageError& e) {
      std::printf("after end_training: %s\n", e.what());
    }
  } else if (FLAGS_scenario == "wrong_device") {
    accelerator.gather(torch::ones({2}, torch::kComplexFloat));
  } else if (FLAGS_scenario == "stop_main") {
    // Rank 0, which hosts the store, stops answering altogether.
    if (main) raise(SIGSTOP);
    accelerator.gather(ones);
  } else if (FLAGS_scenario == "burst_then_stop") {
    // Many quick calls, then a rank stops before it can publish them.
    for (int i = 0; i < 50; ++i) accelerator.gather(ones);
    if (!main) raise(SIGSTOP);
    accelerator.gather(ones);
  } else if (FLAGS_scenario == "shape_mismatch") {
    accelerator.gather(torch::zeros({accelerator.process_index() + 1}));
  } else if (FLAGS_scenario == "error_on_rank0") {
    // Rank 0, which hosts the store, fails while rank 1 waits.
    if (main) throw accel::UsageError("--data_dir=/nonexistent holds no data");
    accelerator.gather(ones);
  } else if (FLAGS_scenario == "error_on_rank1" ||
             FLAGS_scenario == "uncaught_on_rank1") {
    // Rank 1 fails outside any collective while rank 0 waits in one.
    if (!main) {
      const accel::CheckpointError error("cannot read 'data.bin': disk gone");
      if (FLAGS_scenario == "error_on_rank1") throw error;
      // No handler: the exception reaches std::terminate.
      std::thread([&error] { throw error; }).join();
    }
    accelerator.gather(ones);
  } else if (FLAGS_scenario == "rank1_disk_full") {
    // Rank 1's disk is full (a file-size limit stands in): rank 0, which
    // wrote its file, is told which rank could not.
    torch::nn::Linear net(64, 64);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    accelerator.prepare(net, sgd);
    if (!main) {
      signal(SIGXFSZ, SIG_IGN);
      rlimit tiny{1024, 1024};
      setrlimit(RLIMIT_FSIZE, &tiny);
    }
    try {
      accelerator.save_state(FLAGS_save_dir);
    } catch (const accel::CheckpointError& e) {
      std::printf("rank %d: %s\n", accelerator.process_index(), e.what());
    }
  } else if (FLAGS_scenario == "idle_then_save") {
    // Strangers may crowd rank 0's store meanwhile; the job must not mind.
    std::this_thread::sleep_for(std::chrono::seconds(FLAGS_idle_s));
    accelerator.save_state(FLAGS_save_dir);
    accelerator.gather(ones);
    accelerator.print("saved");
  } else {
    throw accel::UsageError("unknown --scenario=" + FLAGS_scenario);
  }
  accelerator.print("no error");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
