// find_executable_batch_size under a memory limit, at 2 processes: memory
// that the process kept for reuse before the search must not end it early.
// Each rank caps its private writable memory (RLIMIT_DATA's soft limit,
// what malloc's heap and mappings draw on) at what it holds plus 160 MB and
// searches twice from batch 512: the first search starts with the heap as
// the Accelerator left it (freed memory kept for reuse), the second after
// the first has returned everything. Both must end at the same size. (Both
// end at 243 here; when kept memory went back only before each retry, the
// first try's heap stayed mapped and scattered: 114, then 91.)
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>

#include <fstream>
#include <string>

#include "accel/accelerator.h"
#include "accel/memory.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {
namespace {

Accelerator& A() { return SharedAccelerator(); }

// This process's private writable memory (VmData), in bytes.
rlim_t DataBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmData:", 0) == 0) return std::stoull(line.substr(7)) << 10;
  }
  ADD_FAILURE() << "no VmData in /proc/self/status";
  return 0;
}

// The soft RLIMIT_DATA at what the process holds plus `extra` bytes, for
// the scope (the hard limit stays, so the old soft one comes back).
class DataLimit {
 public:
  explicit DataLimit(rlim_t extra) {
    getrlimit(RLIMIT_DATA, &saved_);
    rlimit capped = saved_;
    capped.rlim_cur = DataBytes() + extra;
    EXPECT_EQ(setrlimit(RLIMIT_DATA, &capped), 0);
  }
  ~DataLimit() { setrlimit(RLIMIT_DATA, &saved_); }

 private:
  rlimit saved_{};
};

// relu(x * weight), feature by feature: large activations, little compute.
class ScaleImpl : public torch::nn::Module {
 public:
  explicit ScaleImpl(int64_t width)
      : weight_(register_parameter("weight", torch::rand({width}) + 0.5)) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(x * weight_);
  }

 private:
  torch::Tensor weight_;
};
TORCH_MODULE(Scale);

int64_t Search() {
  constexpr int64_t kWidth = 16384;  // 64 KiB a sample and layer.
  return find_executable_batch_size(
      A(),
      [&](int64_t batch_size) {
        A().free_memory();
        torch::nn::Sequential net;
        for (int i = 0; i < 4; ++i) net->push_back(Scale(kWidth));
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
        auto [model, optimizer] = A().prepare(net, sgd);
        for (int step = 0; step < 2; ++step) {
          A().backward(
              model->forward(torch::randn({batch_size, kWidth})).pow(2).mean());
          optimizer.step();
          optimizer.zero_grad();
        }
        return batch_size;
      },
      512);
}

TEST(MemoryCapTest, KeptMemoryDoesNotEndTheSearchEarly) {
  const DataLimit limit(160 << 20);
  const int64_t first = Search();
  const int64_t second = Search();
  EXPECT_LT(first, 512);  // The cap bites.
  EXPECT_EQ(first, second);
  A().print("batch sizes found:", first, second);
}

}  // namespace
}  // namespace accel::testing
