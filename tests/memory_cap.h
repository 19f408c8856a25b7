// A process under a memory cap, and a model that needs much memory and
// little compute, for find_executable_batch_size's test and benchmark.
//
//   const accel::testing::DataLimit cap(160 << 20);  // 160 MB more at most.
//   accel::find_executable_batch_size(accelerator, [&](int64_t batch_size) {
//     accel::testing::TrainScaleModel(accelerator, {.batch_size = batch_size});
//     return batch_size;
//   }, 512);
//
// The cap is RLIMIT_DATA's soft limit: what malloc's heap and private
// mappings draw on (the shared-memory transport is not in it). A try runs
// out of memory when LibTorch's allocator cannot get its activations.
#pragma once

#include <sys/resource.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "accel/accelerator.h"

namespace accel::testing {

// This process's private writable memory (VmData), in bytes.
uint64_t DataBytes();

// For its scope, the soft RLIMIT_DATA at what the process holds plus
// `extra_bytes` (the hard limit stays, so the old soft one comes back).
class DataLimit {
 public:
  explicit DataLimit(uint64_t extra_bytes);
  ~DataLimit();
  DataLimit(const DataLimit&) = delete;
  DataLimit& operator=(const DataLimit&) = delete;

 private:
  rlimit saved_{};
};

// relu(x * weight), feature by feature: large activations, little compute.
class ScaleImpl : public torch::nn::Module {
 public:
  explicit ScaleImpl(int64_t width);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
};
TORCH_MODULE(Scale);

struct ScaleModelRun {
  int64_t batch_size = 0;
  int layers = 4;
  int64_t width = 16384;  // 64 KiB a sample and layer.
  int steps = 3;
};

// One try of a search: frees what `accelerator` holds, prepares `layers`
// Scale layers with SGD and trains `steps` steps on random batches.
void TrainScaleModel(Accelerator& accelerator, const ScaleModelRun& run);

}  // namespace accel::testing
