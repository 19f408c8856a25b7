#include "accel/accelerator.h"

#include <torch/cuda.h>
#include <torch/utils.h>

#include "accel/errors.h"
#include "accel/process_group.h"
#include "accel/program.h"
#include "accel/registry.h"
#include "accel/tensor_ops.h"

namespace accel {
namespace {

// Applies a collective to each tensor of a container, in the container's
// order (a std::map's key order), which every rank shares.
template <typename Fn>
std::vector<torch::Tensor> MapTensors(const std::vector<torch::Tensor>& tensors,
                                      Fn&& fn) {
  std::vector<torch::Tensor> result;
  result.reserve(tensors.size());
  for (const auto& t : tensors) result.push_back(fn(t));
  return result;
}

template <typename Fn>
std::map<std::string, torch::Tensor> MapTensors(
    const std::map<std::string, torch::Tensor>& tensors, Fn&& fn) {
  std::map<std::string, torch::Tensor> result;
  for (const auto& [key, t] : tensors) result[key] = fn(t);
  return result;
}

}  // namespace

AcceleratorOptions AcceleratorOptions::FromFlags() {
  AcceleratorOptions options;
  options.backend = FLAGS_backend;
  options.timeout = std::chrono::seconds(FLAGS_timeout_s);
  if (FLAGS_seed >= 0) options.seed = static_cast<uint64_t>(FLAGS_seed);
  return options;
}

Accelerator::Accelerator(AcceleratorOptions options)
    : env_(DistributedEnvironment::FromProcess()),
      options_(std::move(options)) {
  ProcessGroupOptions group_options;
  backend_ = ResolveBackend(options_.backend);
  group_options.backend = backend_;
  group_options.communicator.timeout = options_.timeout;
  group_options.rendezvous_timeout = options_.timeout;
  group_ = ProcessGroup::Join(env_, group_options);
  const int gpu = group_->communicator().device_index();
  if (gpu >= 0) device_ = torch::Device(torch::kCUDA, gpu);
  if (options_.seed) set_seed(*options_.seed);
}

Accelerator::~Accelerator() {
  synchronizers_.clear();
  group_.reset();
}

Communicator& Accelerator::communicator() { return group_->communicator(); }

void Accelerator::PrepareModule(
    const std::shared_ptr<torch::nn::Module>& module) {
  module->to(device_);
  contents_.models.push_back(module);
  if (num_processes() == 1) return;
  // Every rank starts from rank 0's weights, as DDP does at wrap time.
  torch::NoGradGuard no_grad;
  for (auto& tensor : module->parameters()) {
    tensor.copy_(BroadcastTensor(communicator(), tensor, 0));
  }
  for (auto& tensor : module->buffers()) {
    tensor.copy_(BroadcastTensor(communicator(), tensor, 0));
  }
  synchronizers_.push_back(std::make_unique<GradientSynchronizer>(
      communicator(), module->parameters(), options_.gradient_sync));
}

void Accelerator::backward(const torch::Tensor& loss) {
  loss.backward();
  for (auto& synchronizer : synchronizers_) synchronizer->finish();
  ++contents_.step;
}

void Accelerator::set_gradient_sync(bool enabled) {
  for (auto& synchronizer : synchronizers_) synchronizer->set_enabled(enabled);
}

torch::Tensor Accelerator::gather(const torch::Tensor& tensor) {
  return Gather(communicator(), tensor);
}

std::vector<torch::Tensor> Accelerator::gather(
    const std::vector<torch::Tensor>& tensors) {
  return MapTensors(tensors, [&](const torch::Tensor& t) { return gather(t); });
}

std::map<std::string, torch::Tensor> Accelerator::gather(
    const std::map<std::string, torch::Tensor>& tensors) {
  return MapTensors(tensors, [&](const torch::Tensor& t) { return gather(t); });
}

torch::Tensor Accelerator::reduce(const torch::Tensor& tensor,
                                  const std::string& reduction) {
  return ReduceTensor(communicator(), tensor, reduction);
}

std::vector<torch::Tensor> Accelerator::reduce(
    const std::vector<torch::Tensor>& tensors, const std::string& reduction) {
  return MapTensors(
      tensors, [&](const torch::Tensor& t) { return reduce(t, reduction); });
}

std::map<std::string, torch::Tensor> Accelerator::reduce(
    const std::map<std::string, torch::Tensor>& tensors,
    const std::string& reduction) {
  return MapTensors(
      tensors, [&](const torch::Tensor& t) { return reduce(t, reduction); });
}

torch::Tensor Accelerator::broadcast(const torch::Tensor& tensor,
                                     int from_process) {
  return BroadcastTensor(communicator(), tensor, from_process);
}

std::vector<torch::Tensor> Accelerator::broadcast(
    const std::vector<torch::Tensor>& tensors, int from_process) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return broadcast(t, from_process);
  });
}

std::map<std::string, torch::Tensor> Accelerator::broadcast(
    const std::map<std::string, torch::Tensor>& tensors, int from_process) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return broadcast(t, from_process);
  });
}

torch::Tensor Accelerator::pad_across_processes(const torch::Tensor& tensor,
                                                int64_t dim, double pad_index,
                                                bool pad_first) {
  return PadAcrossProcesses(communicator(), tensor, dim, pad_index, pad_first);
}

void Accelerator::wait_for_everyone() { communicator().barrier(); }

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  if (device_specific) seed += static_cast<uint64_t>(process_index());
  torch::manual_seed(seed);
}

void Accelerator::save_state(const std::string& dir) {
  SaveCheckpoint(dir, process_index(), num_processes(), is_main_process(),
                 contents_);
}

void Accelerator::load_state(const std::string& dir) {
  LoadCheckpoint(dir, process_index(), num_processes(), contents_);
}

}  // namespace accel
