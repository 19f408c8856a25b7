// Which tensor memory an operation freed: a census records weak references
// to the storages of tensors, and afterwards counts the bytes of those that
// nothing references any more (Accelerator::free_memory reports it).
//
//   accel::TensorCensus census;
//   census.AddModule(*model);        // parameters, their gradients, buffers
//   census.AddOptimizer(optimizer);  // also SGD/Adam/AdamW/RMSprop/Adagrad
//   state model = nullptr; int64_t freed = census.FreedBytes();  // what died
//   with the last handle
//
// Storages are counted once however many tensors view them (ZeRO's flat
// buffers), with the bytes they had when added.
#pragma once

#include <c10/core/Storage.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <utility>

namespace accel {

class TensorCensus {
 public:
  void Add(const torch::Tensor& tensor);
  void AddModule(const torch::nn::Module& module);
  // The parameters and their gradients, and the per-parameter state of
  // LibTorch's SGD, Adam, AdamW, RMSprop and Adagrad (another optimizer's
  // state is not counted).
  void AddOptimizer(torch::optim::Optimizer& optimizer);
  // The bytes of the recorded storages nothing references now.
  int64_t FreedBytes() const;

 private:
  std::map<const c10::StorageImpl*,
           std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, int64_t>>
      storages_;
};

}  // namespace accel
