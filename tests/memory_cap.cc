#include "tests/memory_cap.h"

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>

#include <fstream>
#include <stdexcept>
#include <string>

namespace accel::testing {

uint64_t DataBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmData:", 0) == 0) return std::stoull(line.substr(7)) << 10;
  }
  throw std::runtime_error("no VmData in /proc/self/status");
}

DataLimit::DataLimit(uint64_t extra_bytes) {
  if (getrlimit(RLIMIT_DATA, &saved_) != 0) {
    throw std::runtime_error("getrlimit(RLIMIT_DATA) failed");
  }
  rlimit capped = saved_;
  capped.rlim_cur = DataBytes() + extra_bytes;
  if (setrlimit(RLIMIT_DATA, &capped) != 0) {
    throw std::runtime_error("setrlimit(RLIMIT_DATA) failed");
  }
}

DataLimit::~DataLimit() { setrlimit(RLIMIT_DATA, &saved_); }

ScaleImpl::ScaleImpl(int64_t width)
    : weight_(register_parameter("weight", torch::rand({width}) + 0.5)) {}

torch::Tensor ScaleImpl::forward(const torch::Tensor& x) {
  return torch::relu(x * weight_);
}

void TrainScaleModel(Accelerator& accelerator, const ScaleModelRun& run) {
  accelerator.free_memory();
  torch::manual_seed(1);
  torch::nn::Sequential net;
  for (int i = 0; i < run.layers; ++i) net->push_back(Scale(run.width));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01));
  auto [model, optimizer] = accelerator.prepare(net, sgd);
  for (int step = 0; step < run.steps; ++step) {
    torch::Tensor x = torch::randn({run.batch_size, run.width});
    accelerator.backward(model->forward(x).pow(2).mean());
    optimizer.step();
    optimizer.zero_grad();
  }
}

}  // namespace accel::testing
