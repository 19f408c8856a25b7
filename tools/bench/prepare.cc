// What prepare() costs for a model of many tensors (a benchmark, not a
// test): the collectives it issues and the time it takes, min/median/max
// over repetitions, at the process count it is launched with.
//
//   bazel run -c opt //tools/bench:prepare -- --num_processes=4
//   bazel run -c opt //tools/bench:prepare -- --num_processes=2 --layers=100
//       --width=64 --repetitions=20   (one line)
//
// The model is --layers Linear(width, width) layers: 2 x layers parameters
// (100 layers: 200 tensors). Collectives are counted from the
// communicator's sequence numbers (a barrier before and after each prepare).
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"

DEFINE_int32(layers, 100, "Linear layers in the model (2 tensors each).");
DEFINE_int32(width, 64, "Features of each layer.");
DEFINE_int32(repetitions, 20, "prepare() calls timed.");

namespace {

torch::nn::Sequential MakeModel() {
  torch::nn::Sequential model;
  for (int i = 0; i < FLAGS_layers; ++i) {
    model->push_back(torch::nn::Linear(FLAGS_width, FLAGS_width));
  }
  return model;
}

int Main(int, char**) {
  accel::Accelerator accelerator;
  std::vector<double> ms;
  uint64_t collectives = 0;
  for (int i = 0; i < FLAGS_repetitions + 1; ++i) {
    torch::nn::Sequential model = MakeModel();
    const uint64_t before = accelerator.communicator().barrier();
    const auto start = std::chrono::steady_clock::now();
    auto prepared = accelerator.prepare(model);
    const auto end = std::chrono::steady_clock::now();
    const uint64_t after = accelerator.communicator().barrier();
    collectives = after - before - 1;
    if (i > 0) {  // The first is a warm-up.
      ms.push_back(
          std::chrono::duration<double, std::milli>(end - start).count());
    }
    accelerator.free_memory();
  }
  std::sort(ms.begin(), ms.end());
  if (accelerator.is_main_process()) {
    std::printf("%-10s %-8s %-12s %-9s %-9s %-9s\n", "processes", "tensors",
                "collectives", "min ms", "median ms", "max ms");
    std::printf("%-10d %-8d %-12llu %-9.3f %-9.3f %-9.3f\n",
                accelerator.num_processes(), 2 * FLAGS_layers,
                static_cast<unsigned long long>(collectives), ms.front(),
                ms[ms.size() / 2], ms.back());
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
