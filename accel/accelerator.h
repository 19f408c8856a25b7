// The Accelerator: one training loop for one CPU, N CPU processes (Gloo) or
// N GPUs (NCCL), as in Hugging Face Accelerate.
//
//   accel::Accelerator accelerator;  // reads the launcher's environment
//   auto [model, optimizer, loader] =
//       accelerator.prepare(model, optimizer, loader);
//   for (auto& batch : loader) {
//     auto outputs = model->forward(batch.data);
//     auto loss = torch::nn::functional::cross_entropy(outputs, batch.target);
//     accelerator.backward(loss);
//     optimizer.step();
//     optimizer.zero_grad();
//     auto preds = accelerator.gather(outputs.argmax(-1));
//   }
//   accelerator.wait_for_everyone();
//   if (accelerator.is_main_process()) accelerator.save_state("trained_model");
//
// Differences from Accelerate, on purpose: gather, reduce and broadcast
// always check that shapes and dtypes agree across ranks (a clear error on
// every rank instead of a hang or garbage); save_state never leaves a
// half-written file in place of a good one.
#pragma once

#include <torch/data/example.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "accel/checkpoint.h"
#include "accel/data_loader.h"
#include "accel/gradient_sync.h"
#include "accel/runtime/communicator.h"
#include "accel/runtime/environment.h"

namespace accel {

class ProcessGroup;

struct AcceleratorOptions {
  // "gloo", "nccl", or "auto": nccl when it is linked and a GPU is visible.
  std::string backend = "auto";
  // Default timeout of every collective (per call: CollectiveOptions).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // How long ranks wait for each other to start.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(1);
  // When set, set_seed(*seed) at construction.
  std::optional<uint64_t> seed;
  GradientSyncOptions gradient_sync;
  // Automatic checkpoint naming: save_state() with no folder writes
  // <project_dir>/checkpoints/checkpoint_<n>, keeping the newest
  // `total_limit` complete ones (0 keeps all).
  std::string project_dir;
  int total_limit = 0;
  // Compare every collective across ranks (see CommunicatorOptions).
  bool check_collectives = true;

  // --backend, --timeout_s, --rendezvous_timeout_s and --seed (see
  // accel/program.h).
  static AcceleratorOptions FromFlags();
};

class Accelerator {
 public:
  explicit Accelerator(
      AcceleratorOptions options = AcceleratorOptions::FromFlags());
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  int process_index() const { return env_.rank; }
  int local_process_index() const { return env_.local_rank; }
  int num_processes() const { return env_.world_size; }
  bool is_main_process() const { return env_.rank == 0; }
  bool is_local_main_process() const { return env_.local_rank == 0; }
  torch::Device device() const { return device_; }
  const std::string& backend() const { return backend_; }
  Communicator& communicator();

  // --- Preparation -------------------------------------------------------
  // Returns its arguments prepared, in order: modules (ModuleHolders such
  // as torch::nn::Sequential, or shared_ptr<Module>) are moved to device(),
  // get rank 0's parameters and buffers, and have their gradients averaged
  // across ranks by backward(); optimizers are returned as the same
  // reference and recorded for save_state; DataLoaders come back sharded.
  template <typename... Objects>
  auto prepare(Objects&&... objects) {
    if constexpr (sizeof...(Objects) == 1) {
      return PrepareOne(std::forward<Objects>(objects)...);
    } else {
      return std::tuple<decltype(PrepareOne(std::forward<Objects>(
          objects)))...>{PrepareOne(std::forward<Objects>(objects))...};
    }
  }

  // loss.backward(), then waits for the gradient all-reduces that backward
  // started and leaves the averaged gradients in .grad.
  void backward(const torch::Tensor& loss, CallSite site = CallSite::Here());

  // While inside no_sync (or with sync disabled), backward keeps gradients
  // local: use for gradient accumulation, then one synced backward.
  void set_gradient_sync(bool enabled);

  // --- Collectives (every rank must call them, in the same order) -----------
  // The trailing CallSite records the caller's file and line for
  // diagnostics ("rank 1 is in gather #12 (train.cc:75)"); leave it out.
  torch::Tensor gather(const torch::Tensor& tensor,
                       CallSite site = CallSite::Here());
  std::vector<torch::Tensor> gather(const std::vector<torch::Tensor>& tensors,
                                    CallSite site = CallSite::Here());
  std::map<std::string, torch::Tensor> gather(
      const std::map<std::string, torch::Tensor>& tensors,
      CallSite site = CallSite::Here());
  torch::Tensor reduce(const torch::Tensor& tensor,
                       const std::string& reduction = "sum",
                       CallSite site = CallSite::Here());
  std::vector<torch::Tensor> reduce(const std::vector<torch::Tensor>& tensors,
                                    const std::string& reduction = "sum",
                                    CallSite site = CallSite::Here());
  std::map<std::string, torch::Tensor> reduce(
      const std::map<std::string, torch::Tensor>& tensors,
      const std::string& reduction = "sum", CallSite site = CallSite::Here());
  torch::Tensor broadcast(const torch::Tensor& tensor, int from_process = 0,
                          CallSite site = CallSite::Here());
  std::vector<torch::Tensor> broadcast(
      const std::vector<torch::Tensor>& tensors, int from_process = 0,
      CallSite site = CallSite::Here());
  std::map<std::string, torch::Tensor> broadcast(
      const std::map<std::string, torch::Tensor>& tensors, int from_process = 0,
      CallSite site = CallSite::Here());
  torch::Tensor pad_across_processes(const torch::Tensor& tensor,
                                     int64_t dim = 0, double pad_index = 0,
                                     bool pad_first = false,
                                     CallSite site = CallSite::Here());
  void wait_for_everyone(CallSite site = CallSite::Here());

  // Prints its arguments, separated by spaces, on the local main process.
  template <typename... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream line;
    const char* separator = "";
    ((line << separator << args, separator = " "), ...);
    std::cout << line.str() << std::endl;
  }

  // Seeds torch's generator; device_specific adds process_index().
  void set_seed(uint64_t seed, bool device_specific = false);

  // --- Checkpoints (see accel/checkpoint.h for the layout) ----------------
  void save_state(const std::string& dir);
  void load_state(const std::string& dir);
  // With AcceleratorOptions::project_dir: the next automatically named
  // checkpoint (every rank must call it, as many times); returns its folder.
  std::string save_state();
  // The newest complete automatically named checkpoint, or "".
  std::string latest_checkpoint() const;
  // Backward passes run so far (restored by load_state).
  int64_t step() const { return contents_.step; }

 private:
  template <typename M>
  using EnableIfModuleHolder = std::enable_if_t<
      std::is_base_of_v<torch::detail::ModuleHolderIndicator, std::decay_t<M>>,
      std::decay_t<M>>;

  template <typename M>
  EnableIfModuleHolder<M> PrepareOne(M&& holder) {
    std::decay_t<M> copy = holder;
    PrepareModule(copy.ptr());
    return copy;
  }
  std::shared_ptr<torch::nn::Module> PrepareOne(
      std::shared_ptr<torch::nn::Module> module) {
    PrepareModule(module);
    return module;
  }
  template <typename O>
  std::enable_if_t<std::is_base_of_v<torch::optim::Optimizer, O>, O&>
  PrepareOne(O& optimizer) {
    contents_.optimizers.push_back(&optimizer);
    return optimizer;
  }
  template <typename Dataset>
  DataLoader<Dataset> PrepareOne(DataLoader<Dataset>& loader) {
    DataLoader<Dataset> sharded =
        loader.Shard(process_index(), num_processes(), device_);
    contents_.loaders.push_back(sharded.state());
    return sharded;
  }

  void PrepareModule(const std::shared_ptr<torch::nn::Module>& module);
  CollectiveOptions At(CallSite site, const char* api = nullptr) const;

  DistributedEnvironment env_;
  AcceleratorOptions options_;
  std::string backend_;
  torch::Device device_ = torch::kCPU;
  std::unique_ptr<ProcessGroup> group_;
  std::vector<std::unique_ptr<GradientSynchronizer>> synchronizers_;
  CheckpointContents contents_;
  int next_checkpoint_ = 1;
};

}  // namespace accel
