// Optimizer steps on the CPU: LibTorch's AdamW, Adam and SGD (momentum 0.9)
// against accel's fused ones (accel/optim/fused_optimizers.h) and the
// memory-bandwidth floor, on the parameters of //tools/bench:ddp's 25M-
// parameter MLP (Linear(1024,4096), ReLU, Linear(4096,4096), ReLU,
// Linear(4096,1024)) with random gradients (a benchmark, not a test).
//
//   bazel run -c opt //tools/bench:optimizer
//   bazel run -c opt //tools/bench:optimizer -- --threads=1,2 --repetitions=7
//
// The floor of a step is the time to move its bytes once at the bandwidth
// this machine achieves for the same access pattern: float32 Adam and AdamW
// read the parameter, gradient and both moments and write the parameter and
// the moments (16 + 12 = 28 bytes per parameter), SGD with momentum reads
// the parameter, gradient and buffer and writes the parameter and buffer
// (20 bytes). It is measured in the same run by a STREAM-like pass that
// does exactly those reads and writes with one add each (p += g, m += g,
// v += g), over buffers as large as the optimizer's, split into the same
// tensors and over the same threads (at::parallel_for, ATen's grain) as the
// optimizers; "GB/s" is the bytes it moved over its time.
//
// As in an accel program, freed memory stays in the process
// (--reuse_host_memory): LibTorch's steps allocate temporaries as large as
// a parameter, which glibc would otherwise unmap on free and fault in again
// on the next step (about half of LibTorch's AdamW step here).
//
// Each repetition times --steps steps of every row in turn (so that load
// from elsewhere on the machine falls on all rows alike) and keeps each
// row's mean step; the table shows min/median/max over --repetitions, the
// fused rows' ratios to LibTorch's row (paired by repetition) and to the
// floor. Both run once per --threads value (0: LibTorch's default count).
#include <ATen/Parallel.h>
#include <gflags/gflags.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel/optim/fused_optimizers.h"
#include "accel/runtime/base/host_memory.h"
#include "tools/bench/driver.h"

DEFINE_int32(repetitions, 7, "Rounds of every row; the table's spread.");
DEFINE_int32(steps, 3, "Timed steps per row and repetition.");
DEFINE_string(threads, "1,0",
              "Intra-op thread counts to measure (0: LibTorch's default).");
DEFINE_bool(reuse_host_memory, true,
            "Keep freed memory in the process, as an accel program does "
            "(accel/runtime/base/host_memory.h): without it, every LibTorch "
            "step faults its temporaries in again.");

namespace {

using accel::bench::Median;
using accel::bench::Ms;
using accel::bench::ParseList;
using accel::bench::Ratio;
using accel::bench::Spread;
using Clock = std::chrono::steady_clock;

constexpr int64_t kAdamBytes = 28;  // Per float32 parameter.
constexpr int64_t kSgdBytes = 20;

// The 25M MLP's parameters, each with a random gradient.
std::vector<torch::Tensor> MlpParameters() {
  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(1024, 4096), torch::nn::ReLU(),
                            torch::nn::Linear(4096, 4096), torch::nn::ReLU(),
                            torch::nn::Linear(4096, 1024));
  std::vector<torch::Tensor> params = mlp->parameters();
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
  return params;
}

int64_t Elements(const std::vector<torch::Tensor>& params) {
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  return total;
}

// The floor's loops, as wide as the fused loops (AVX2 where the CPU has
// it: GCC makes both clones and picks one when the program loads).
__attribute__((target_clones("avx2", "default"))) void Add3(
    float* __restrict p, const float* __restrict g, float* __restrict m,
    float* __restrict v, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float x = g[i];
    p[i] += x;
    m[i] += x;
    v[i] += x;
  }
}

__attribute__((target_clones("avx2", "default"))) void Add2(
    float* __restrict p, const float* __restrict g, float* __restrict b,
    int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float x = g[i];
    p[i] += x;
    b[i] += x;
  }
}

// The floor's pass: per parameter, reads its gradient and reads and
// writes the parameter and each of its buffers (p += g, m += g, ...), on
// LibTorch's threads.
class StreamPass {
 public:
  // `extra_written`: how many buffers besides the parameter it writes (2
  // for Adam's moments, 1 for SGD's momentum buffer).
  StreamPass(const std::vector<torch::Tensor>& params, int extra_written) {
    for (const auto& p : params) {
      Tensors t{p.data_ptr<float>(), p.grad().data_ptr<float>(), {}, p.numel()};
      for (int i = 0; i < extra_written; ++i) {
        buffers_.push_back(torch::zeros_like(p));
        t.extra.push_back(buffers_.back().data_ptr<float>());
      }
      tensors_.push_back(t);
    }
  }

  void Run() const {
    for (const Tensors& t : tensors_) {
      at::parallel_for(0, t.numel, 32768, [&](int64_t begin, int64_t end) {
        if (t.extra.size() == 2) {
          Add3(t.param, t.grad, t.extra[0], t.extra[1], begin, end);
        } else {
          Add2(t.param, t.grad, t.extra[0], begin, end);
        }
      });
    }
  }

 private:
  struct Tensors {
    float* param;
    const float* grad;
    std::vector<float*> extra;
    int64_t numel;
  };

  std::vector<torch::Tensor> buffers_;
  std::vector<Tensors> tensors_;
};

struct Row {
  std::string name;
  std::function<void()> step;
  int64_t floor_bytes = 0;  // A floor: the bytes per parameter it moves.
  int baseline = -1;        // Index of the row this one is compared with.
  int floor = -1;           // Index of its floor row.
  Spread seconds;           // Mean step, per repetition.
};

double TimeSteps(const std::function<void()>& step, int steps) {
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  return std::chrono::duration<double>(Clock::now() - start).count() / steps;
}

// Every row, repetition by repetition, after one untimed step each (which
// makes the optimizers' state).
void Measure(std::vector<Row>& rows) {
  for (Row& row : rows) row.step();
  for (int r = 0; r < FLAGS_repetitions; ++r) {
    for (Row& row : rows) {
      row.seconds.values.push_back(TimeSteps(row.step, FLAGS_steps));
    }
  }
}

void PrintTable(const std::vector<Row>& rows, int64_t elements) {
  std::printf("%-22s %26s %20s %20s\n", "step (ms)", "min/median/max",
              "fused/LibTorch", "over floor");
  for (const Row& row : rows) {
    const std::string vs_torch =
        row.baseline >= 0 ? Ratio(row.seconds, rows[row.baseline].seconds) : "";
    // Each repetition's step over the same repetition's floor.
    const std::string vs_floor =
        row.floor >= 0 ? Ratio(row.seconds, rows[row.floor].seconds) : "";
    std::printf("%-22s %26s %20s %20s\n", row.name.c_str(),
                Ms(row.seconds).c_str(), vs_torch.c_str(), vs_floor.c_str());
  }
  for (const Row& row : rows) {
    if (row.floor_bytes == 0) continue;
    const int64_t bytes = elements * row.floor_bytes;
    std::printf("%s: %.2f GB moved at %.1f GB/s (median)\n", row.name.c_str(),
                bytes / 1e9, bytes / row.seconds.median() / 1e9);
  }
}

// The rows for one thread count: floors, then each LibTorch optimizer
// followed by its fused one.
// Each row's step owns what it steps.
std::vector<Row> MakeRows(const std::vector<torch::Tensor>& params) {
  auto adam_floor = std::make_shared<StreamPass>(params, 2);
  auto sgd_floor = std::make_shared<StreamPass>(params, 1);
  std::vector<Row> rows;
  rows.push_back(
      {"floor (28 B/param)", [=] { adam_floor->Run(); }, kAdamBytes});
  rows.push_back({"floor (20 B/param)", [=] { sgd_floor->Run(); }, kSgdBytes});
  auto add = [&](const std::string& name,
                 std::shared_ptr<torch::optim::Optimizer> optimizer, bool fused,
                 int floor) {
    Row row{name, [optimizer] { optimizer->step(); }};
    row.floor = floor;
    if (fused) row.baseline = static_cast<int>(rows.size()) - 1;
    rows.push_back(row);
  };
  // The values do not change the work done (no denormals: the gradients
  // are N(0, 1) and the floor's passes add them to the parameters).
  const auto adamw = torch::optim::AdamWOptions(1e-6).weight_decay(0.01);
  const auto adam = torch::optim::AdamOptions(1e-6);
  const auto sgd = torch::optim::SGDOptions(1e-6).momentum(0.9);
  add("LibTorch AdamW", std::make_shared<torch::optim::AdamW>(params, adamw),
      false, 0);
  add("FusedAdamW", std::make_shared<accel::FusedAdamW>(params, adamw), true,
      0);
  add("LibTorch Adam", std::make_shared<torch::optim::Adam>(params, adam),
      false, 0);
  add("FusedAdam", std::make_shared<accel::FusedAdam>(params, adam), true, 0);
  add("LibTorch SGD", std::make_shared<torch::optim::SGD>(params, sgd), false,
      1);
  add("FusedSGD", std::make_shared<accel::FusedSGD>(params, sgd), true, 1);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const std::string malloc_settings = FLAGS_reuse_host_memory
                                          ? accel::ReuseFreedHostMemory()
                                          : "glibc's defaults";
  const int default_threads = at::get_num_threads();
  std::vector<torch::Tensor> params = MlpParameters();
  const int64_t elements = Elements(params);
  std::printf(
      "Optimizer steps on the 25M MLP's parameters (%.1fM float32, "
      "random gradients)\n"
      "CPU: %s, %ld cores online; LibTorch's default threads: %d; "
      "load average: %s; fused loops %s FMA\nmalloc: %s\n",
      elements / 1e6, accel::bench::CpuModel().c_str(),
      sysconf(_SC_NPROCESSORS_ONLN), default_threads,
      accel::bench::LoadAverage().c_str(),
      accel::fused_internal::UsesFma() ? "with" : "without",
      malloc_settings.c_str());
  std::vector<int> measured;
  for (int threads : ParseList(FLAGS_threads)) {
    if (threads <= 0) threads = default_threads;
    if (std::find(measured.begin(), measured.end(), threads) !=
        measured.end()) {
      continue;  // The default count was also asked for by number.
    }
    measured.push_back(threads);
    at::set_num_threads(threads);
    std::vector<Row> rows = MakeRows(params);
    Measure(rows);
    std::printf("\n%d thread(s), %d repetitions of %d steps:\n",
                at::get_num_threads(), FLAGS_repetitions, FLAGS_steps);
    PrintTable(rows, elements);
  }
  std::printf("\nload average after: %s\n",
              accel::bench::LoadAverage().c_str());
  return 0;
}
