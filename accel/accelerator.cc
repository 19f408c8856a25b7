#include "accel/accelerator.h"

#include <torch/cuda.h>
#include <torch/utils.h>

#include "accel/runtime/errors.h"
#include "accel/runtime/process_group.h"
#include "accel/runtime/program.h"
#include "accel/runtime/registry.h"
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
  options.rendezvous_timeout = std::chrono::seconds(FLAGS_rendezvous_timeout_s);
  if (FLAGS_seed >= 0) options.seed = static_cast<uint64_t>(FLAGS_seed);
  options.check_collectives = FLAGS_collective_checks;
  return options;
}

Accelerator::Accelerator(AcceleratorOptions options)
    : env_(DistributedEnvironment::FromProcess()),
      options_(std::move(options)) {
  ProcessGroupOptions group_options;
  backend_ = ResolveBackend(options_.backend);
  group_options.backend = backend_;
  group_options.communicator.timeout = options_.timeout;
  group_options.rendezvous_timeout = options_.rendezvous_timeout;
  group_options.communicator.check_collectives = options_.check_collectives;
  group_ = ProcessGroup::Join(env_, group_options);
  const int gpu = group_->communicator().device_index();
  if (gpu >= 0) device_ = torch::Device(torch::kCUDA, gpu);
  if (options_.seed) set_seed(*options_.seed);
  // Numbering continues after earlier runs' checkpoints. No rank can save
  // before every rank got here (saving follows collectives), so all agree.
  if (!options_.project_dir.empty()) {
    const std::vector<int> indices = CheckpointIndices(options_.project_dir);
    if (!indices.empty()) next_checkpoint_ = indices.back() + 1;
  }
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
  const CollectiveOptions options = At(CallSite::Here(), "prepare");
  for (auto& tensor : module->parameters()) {
    tensor.copy_(BroadcastTensor(communicator(), tensor, 0, options));
  }
  for (auto& tensor : module->buffers()) {
    tensor.copy_(BroadcastTensor(communicator(), tensor, 0, options));
  }
  synchronizers_.push_back(std::make_unique<GradientSynchronizer>(
      communicator(), module->parameters(), options_.gradient_sync));
}

void Accelerator::backward(const torch::Tensor& loss, CallSite site) {
  for (auto& synchronizer : synchronizers_) synchronizer->set_call_site(site);
  loss.backward();
  for (auto& synchronizer : synchronizers_) synchronizer->finish();
  ++contents_.step;
}

void Accelerator::set_gradient_sync(bool enabled) {
  for (auto& synchronizer : synchronizers_) synchronizer->set_enabled(enabled);
}

CollectiveOptions Accelerator::At(CallSite site, const char* api) const {
  CollectiveOptions options;
  options.site = site;
  options.api = api;
  return options;
}

torch::Tensor Accelerator::gather(const torch::Tensor& tensor, CallSite site) {
  return Gather(communicator(), tensor, At(site));
}

std::vector<torch::Tensor> Accelerator::gather(
    const std::vector<torch::Tensor>& tensors, CallSite site) {
  return MapTensors(tensors,
                    [&](const torch::Tensor& t) { return gather(t, site); });
}

std::map<std::string, torch::Tensor> Accelerator::gather(
    const std::map<std::string, torch::Tensor>& tensors, CallSite site) {
  return MapTensors(tensors,
                    [&](const torch::Tensor& t) { return gather(t, site); });
}

torch::Tensor Accelerator::reduce(const torch::Tensor& tensor,
                                  const std::string& reduction, CallSite site) {
  return ReduceTensor(communicator(), tensor, reduction, At(site));
}

std::vector<torch::Tensor> Accelerator::reduce(
    const std::vector<torch::Tensor>& tensors, const std::string& reduction,
    CallSite site) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return reduce(t, reduction, site);
  });
}

std::map<std::string, torch::Tensor> Accelerator::reduce(
    const std::map<std::string, torch::Tensor>& tensors,
    const std::string& reduction, CallSite site) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return reduce(t, reduction, site);
  });
}

torch::Tensor Accelerator::broadcast(const torch::Tensor& tensor,
                                     int from_process, CallSite site) {
  return BroadcastTensor(communicator(), tensor, from_process, At(site));
}

std::vector<torch::Tensor> Accelerator::broadcast(
    const std::vector<torch::Tensor>& tensors, int from_process,
    CallSite site) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return broadcast(t, from_process, site);
  });
}

std::map<std::string, torch::Tensor> Accelerator::broadcast(
    const std::map<std::string, torch::Tensor>& tensors, int from_process,
    CallSite site) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return broadcast(t, from_process, site);
  });
}

torch::Tensor Accelerator::pad_across_processes(const torch::Tensor& tensor,
                                                int64_t dim, double pad_index,
                                                bool pad_first, CallSite site) {
  return PadAcrossProcesses(communicator(), tensor, dim, pad_index, pad_first,
                            At(site));
}

void Accelerator::wait_for_everyone(CallSite site) {
  communicator().barrier(At(site, "wait_for_everyone"));
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  if (device_specific) seed += static_cast<uint64_t>(process_index());
  torch::manual_seed(seed);
}

void Accelerator::save_state(const std::string& dir) {
  SaveCheckpoint(dir, process_index(), num_processes(), is_main_process(),
                 contents_);
}

std::string Accelerator::save_state() {
  if (options_.project_dir.empty()) {
    throw UsageError(
        "save_state() without a folder needs AcceleratorOptions::project_dir "
        "(automatic checkpoint naming)");
  }
  const std::string dir =
      CheckpointFolder(options_.project_dir, next_checkpoint_++);
  save_state(dir);
  if (is_main_process()) {
    PruneCheckpoints(options_.project_dir, options_.total_limit);
  }
  return dir;
}

std::string Accelerator::latest_checkpoint() const {
  return options_.project_dir.empty() ? ""
                                      : LatestCheckpoint(options_.project_dir);
}

void Accelerator::load_state(const std::string& dir) {
  LoadCheckpoint(dir, process_index(), num_processes(), contents_);
}

}  // namespace accel
