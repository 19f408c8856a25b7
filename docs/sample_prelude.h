// What the C++ fragments of docs/*.md (their ```c++ blocks) may use, as a
// training program has it. docs/extract_samples.py makes each fragment the
// body of a function declared with DOCS_SAMPLE_FUNCTION, whose parameters are
// the names below, or (after an "<!-- sample: namespace -->" line) leaves it
// at namespace scope; either way inside a namespace of its own, nested in
// `docs`, so that MyDataset, loss_fn and train_step are found unqualified.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "accel/accelerator.h"
#include "accel/local_sgd.h"
#include "accel/memory.h"
#include "accel/profiler.h"

namespace docs {

// The README's data set: 64 random samples of 10 features, 2 classes.
struct MyDataset {
  torch::Tensor inputs = torch::randn({64, 10});
  torch::Tensor labels = torch::randint(0, 2, {64});
  torch::data::Example<> get(size_t i) { return {inputs[i], labels[i]}; }
  size_t size() const { return 64; }
};

// What prepare(model, optimizer, data) returned for the README's loop.
using Model = torch::nn::Sequential;
using Optimizer = accel::AcceleratedOptimizer<torch::optim::AdamW>;
using Loader = accel::DataLoader<MyDataset>;
using Batch = torch::data::Example<>;

inline torch::Tensor loss_fn(const torch::Tensor& outputs,
                             const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(outputs, targets);
}

// One training step of a program's own.
inline void train_step(const Batch& batch) {}

}  // namespace docs

// A fragment's function: `loss` and `step` as in the middle of a loop.
#define DOCS_SAMPLE_FUNCTION(name)                               \
  void name(accel::Accelerator& accelerator, docs::Model& model, \
            docs::Optimizer& optimizer, docs::Loader& loader,    \
            const docs::Batch& batch, torch::Tensor loss, int64_t step)
