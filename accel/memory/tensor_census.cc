#include "accel/memory/tensor_census.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace accel {
namespace {

// The tensors of one parameter's optimizer state.
std::vector<torch::Tensor> StateTensors(
    torch::optim::OptimizerParamState& state) {
  if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    return {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()};
  }
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    return {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()};
  }
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    return {sgd->momentum_buffer()};
  }
  if (auto* rms = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    return {rms->square_avg(), rms->momentum_buffer(), rms->grad_avg()};
  }
  if (auto* adagrad = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    return {adagrad->sum()};
  }
  return {};
}

}  // namespace

void TensorCensus::Add(const torch::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  const c10::Storage& storage = tensor.storage();
  storages_.emplace(storage.unsafeGetStorageImpl(),
                    std::make_pair(storage.getWeakStorageImpl(),
                                   static_cast<int64_t>(storage.nbytes())));
}

void TensorCensus::AddModule(const torch::nn::Module& module) {
  for (const auto& parameter : module.parameters()) {
    Add(parameter);
    Add(parameter.grad());
  }
  for (const auto& buffer : module.buffers()) Add(buffer);
}

void TensorCensus::AddOptimizer(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      Add(parameter);
      Add(parameter.grad());
    }
  }
  for (auto& [key, state] : optimizer.state()) {
    if (state == nullptr) continue;
    for (const auto& tensor : StateTensors(*state)) Add(tensor);
  }
}

int64_t TensorCensus::FreedBytes() const {
  int64_t bytes = 0;
  for (const auto& [impl, entry] : storages_) {
    if (entry.first.expired()) bytes += entry.second;
  }
  return bytes;
}

}  // namespace accel
