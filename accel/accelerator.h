// The Accelerator: one training loop for one CPU, N CPU processes (Gloo) or
// N GPUs (NCCL), as in Hugging Face Accelerate, whose names it keeps.
//
//   accel::Accelerator accelerator;  // reads the launcher's environment
//   auto [model, optimizer, loader, scheduler] = accelerator.prepare(
//       net, adamw, data,
//       accel::get_linear_schedule_with_warmup(adamw, 100, 1000));
//   for (auto& batch : loader) {
//     auto accumulate = accelerator.accumulate(model);
//     torch::Tensor loss;
//     {
//       auto autocast = accelerator.autocast();  // --mixed_precision
//       loss = criterion(model->forward(batch.data), batch.target);
//     }
//     accelerator.backward(loss);
//     if (accelerator.sync_gradients()) {
//       accelerator.clip_grad_norm_(model->parameters(), 1.0);
//     }
//     optimizer.step();
//     scheduler.step();
//     optimizer.zero_grad();
//     auto predictions = accelerator.gather_for_metrics(
//         model->forward(batch.data).argmax(-1));
//   }
//   accelerator.wait_for_everyone();
//   accelerator.save_state("trained_model");
//
// Differences from Accelerate, on purpose: gather, reduce and broadcast
// always check that shapes and dtypes agree across ranks (a clear error on
// every rank instead of a hang or garbage); save_state never leaves a
// half-written file in place of a good one and records where a data loader
// stands inside an epoch; autocast is a scope around forward (LibTorch's C++
// modules have no forward hooks to wrap). The README lists every name.
#pragma once

#include <torch/data/example.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <torch/types.h>

#include <array>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/accelerated_optimizer.h"
#include "accel/accelerated_scheduler.h"
#include "accel/autocast.h"
#include "accel/checkpoint.h"
#include "accel/data_loader.h"
#include "accel/grad_scaler.h"
#include "accel/gradient_sync.h"
#include "accel/process_control.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/base/preemption.h"
#include "accel/runtime/comm/communicator.h"
#include "accel/runtime/comm/object_collectives.h"
#include "accel/runtime/env/environment.h"
#include "accel/runtime/launch/program.h"
#include "accel/safetensors.h"
#include "accel/scheduler.h"
#include "accel/tensor_format.h"
#include "accel/tracking/tracker.h"
#include "accel/training_state.h"

namespace accel {

class FolderLock;
class ProcessGroup;

// Accelerate's DistributedType, for the backends accel has.
enum class DistributedType { kNo, kMultiCpu, kMultiGpu };
// "NO", "MULTI_CPU", "MULTI_GPU", as Accelerate prints them.
const char* DistributedTypeName(DistributedType type);

struct AcceleratorOptions {
  // "gloo", "nccl", or "auto": nccl when it is linked and a GPU is visible.
  std::string backend = "auto";
  // "no", "bf16" (autocast to bfloat16, CPU or GPU) or "fp16" (autocast to
  // float16 on a GPU, with loss scaling; LibTorch 1.13's CPU autocast has no
  // float16, so on a CPU only the loss scaling runs).
  std::string mixed_precision = "no";
  GradScalerOptions scaler;  // fp16's loss scaler.
  // Micro-batches per optimizer step inside accumulate(); backward divides
  // the loss by it.
  int gradient_accumulation_steps = 1;
  // The last batch of a data loader always ends an accumulation cycle.
  bool sync_with_dataloader = true;
  // Prepared data loaders split each batch across processes, whatever their
  // own DataLoaderOptions::split_batches says.
  bool split_batches = false;
  // When false, prepared data loaders do not pad the last batches to the
  // same count on every process, whatever their own options say.
  bool even_batches = true;
  // Default timeout of every collective (per call: CollectiveOptions).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // How long ranks wait for each other to start.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(1);
  // How long a machine may stop answering before its ranks count as gone.
  std::chrono::milliseconds network_timeout = std::chrono::seconds(20);
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
  // Experiment trackers that init_trackers starts (Accelerate's log_with):
  // "jsonl", "tensorboard", any registered tracker, or "all" of them.
  // Checked at construction.
  std::vector<std::string> log_with;
  // Where the trackers write (<logging_dir>/<project_name>); empty: the
  // project_dir.
  std::string logging_dir;
  // Keep freed memory in the process for reuse
  // (accel/runtime/base/host_memory.h): large CPU tensors then cost no page
  // faults after the first step.
  bool reuse_host_memory = true;

  // --backend, --mixed_precision, --gradient_accumulation_steps,
  // --timeout_s, --rendezvous_timeout_s, --collective_checks, --report_to,
  // --logging_dir and --reuse_host_memory (see accel/runtime/launch/program.h).
  static AcceleratorOptions FromFlags();
};

// Gradient synchronization of some models turned off for a scope
// (no_sync, accumulate); restores what was there before.
class [[nodiscard]] NoSyncScope {
 public:
  NoSyncScope() = default;
  NoSyncScope(NoSyncScope&&) = default;
  NoSyncScope& operator=(NoSyncScope&&) = default;
  ~NoSyncScope();
  // Sets the synchronizer's sync to `enabled` until the scope ends.
  void Add(GradientSynchronizer* synchronizer, bool enabled = false);

 private:
  std::vector<std::pair<GradientSynchronizer*, bool>> restore_;
};

class Accelerator {
 public:
  explicit Accelerator(
      AcceleratorOptions options = AcceleratorOptions::FromFlags());
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // --- Where this process stands ------------------------------------------
  int process_index() const { return env_.rank; }
  int local_process_index() const { return env_.local_rank; }
  int num_processes() const { return env_.world_size; }
  bool is_main_process() const { return env_.rank == 0; }
  bool is_local_main_process() const { return env_.local_rank == 0; }
  bool is_last_process() const { return env_.rank == env_.world_size - 1; }
  torch::Device device() const { return device_; }
  DistributedType distributed_type() const;
  // Whether several processes run (use_distributed), and whether they use
  // several devices (multi_device: GPUs).
  bool use_distributed() const { return num_processes() > 1; }
  bool multi_device() const {
    return distributed_type() == DistributedType::kMultiGpu;
  }
  bool split_batches() const { return options_.split_batches; }
  bool even_batches() const { return options_.even_batches; }
  // The communication backend in use ("gloo", "nccl").
  const std::string& backend() const { return backend_; }
  const std::string& mixed_precision() const {
    return options_.mixed_precision;
  }
  const std::string& project_dir() const { return options_.project_dir; }
  Communicator& communicator();

  // --- Preparation -------------------------------------------------------
  // Returns its arguments prepared, in order (a single argument comes back
  // alone):
  //   - models (ModuleHolders such as torch::nn::Sequential, or
  //     std::shared_ptr<YourModule>, returned with their type): moved to
  //     device(), given rank 0's parameters and buffers, and averaged across
  //     ranks by backward();
  //   - optimizers (by reference; they must outlive the loop): returned as
  //     AcceleratedOptimizer<YourOptimizer>;
  //   - DataLoaders: returned sharded for this process;
  //   - schedulers (accel::LRScheduler by reference, std::unique_ptr or
  //     std::shared_ptr): returned as AcceleratedScheduler.
  // All of them are recorded for save_state.
  template <typename... Objects>
  auto prepare(Objects&&... objects) {
    if constexpr (sizeof...(Objects) == 1) {
      return PrepareOne(std::forward<Objects>(objects)...);
    } else {
      return std::tuple<decltype(PrepareOne(std::forward<Objects>(
          objects)))...>{PrepareOne(std::forward<Objects>(objects))...};
    }
  }
  // prepare() for one object of a known kind, as in Accelerate.
  template <typename Model>
  auto prepare_model(Model&& model) {
    return prepare(std::forward<Model>(model));
  }
  template <typename Optimizer>
  auto prepare_optimizer(Optimizer& optimizer) {
    return prepare(optimizer);
  }
  template <typename Loader>
  auto prepare_data_loader(Loader&& loader) {
    return prepare(std::forward<Loader>(loader));
  }
  template <typename Scheduler>
  auto prepare_scheduler(Scheduler&& scheduler) {
    return prepare(std::forward<Scheduler>(scheduler));
  }
  // The model itself: accel's data parallelism does not wrap it.
  template <typename Model>
  Model& unwrap_model(Model& model) const {
    return model;
  }

  // --- The training step -----------------------------------------------
  // Divides the loss by gradient_accumulation_steps (and scales it under
  // fp16), runs backward, then waits for the gradient all-reduces that
  // backward started: the averaged gradients are in .grad. On micro-steps
  // that do not sync, gradients stay local.
  void backward(const torch::Tensor& loss, CallSite site = CallSite::Here());

  // Gradient accumulation: call once per batch, keep the scope for the
  // step. Counts micro-steps and syncs gradients (and lets the prepared
  // optimizer and scheduler step) on every gradient_accumulation_steps-th
  // one and on the data loader's last batch; on the others the models'
  // gradient sync is off for the scope.
  template <typename... Models>
  NoSyncScope accumulate(Models&... models) {
    state_->gradients.Advance();
    NoSyncScope scope;
    if (!state_->gradients.sync_gradients()) {
      (scope.Add(SynchronizerOf(ModulePointer(models), "accumulate")), ...);
    }
    return scope;
  }
  // Turns off the gradient sync of `model` for the scope: backward keeps
  // gradients local (accumulate them, then sync in one backward outside).
  template <typename Model>
  NoSyncScope no_sync(Model& model) {
    NoSyncScope scope;
    scope.Add(SynchronizerOf(ModulePointer(model), "no_sync"));
    return scope;
  }
  // Syncs gradients in the scope's backward even inside no_sync (for a
  // model whose last micro-step must sync).
  template <typename... Models>
  NoSyncScope trigger_sync_in_backward(Models&... models) {
    NoSyncScope scope;
    (scope.Add(
         SynchronizerOf(ModulePointer(models), "trigger_sync_in_backward"),
         /*enabled=*/true),
     ...);
    return scope;
  }
  // Whether this micro-step syncs gradients and steps the optimizer.
  bool sync_gradients() const { return state_->gradients.sync_gradients(); }
  int gradient_accumulation_steps() const {
    return state_->gradients.accumulation_steps();
  }
  void set_gradient_accumulation_steps(int steps);
  // Mixed precision's autocast for the scope (none with "no").
  AutocastScope autocast() const;
  // Clips the gradients' total norm (unscaling them first under fp16) and
  // returns the norm before clipping. Call on steps that sync gradients.
  double clip_grad_norm_(const std::vector<torch::Tensor>& parameters,
                         double max_norm, double norm_type = 2.0);
  void clip_grad_value_(const std::vector<torch::Tensor>& parameters,
                        double clip_value);
  // Divides the gradients by the fp16 loss scale now (clip_grad_norm_ does
  // it); nothing without fp16.
  void unscale_gradients();
  // Whether the last optimizer step was skipped (an fp16 overflow).
  bool optimizer_step_was_skipped() const;
  // The fp16 loss scaler, or null.
  GradScaler* scaler() const { return state_->scaler.get(); }

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
  // auto [a, b] = accelerator.gather({x, y});
  template <size_t N>
  std::array<torch::Tensor, N> gather(const torch::Tensor (&tensors)[N],
                                      CallSite site = CallSite::Here()) {
    std::array<torch::Tensor, N> result;
    for (size_t i = 0; i < N; ++i) result[i] = gather(tensors[i], site);
    return result;
  }
  // gather, but on the last batch of a prepared data loader the samples that
  // even_batches duplicated are dropped: over an epoch the result holds each
  // sample of the dataset exactly once.
  torch::Tensor gather_for_metrics(const torch::Tensor& tensor,
                                   CallSite site = CallSite::Here());
  std::vector<torch::Tensor> gather_for_metrics(
      const std::vector<torch::Tensor>& tensors,
      CallSite site = CallSite::Here());
  std::map<std::string, torch::Tensor> gather_for_metrics(
      const std::map<std::string, torch::Tensor>& tensors,
      CallSite site = CallSite::Here());
  // What a Python tuple becomes, unpacked the same way:
  //   auto [predictions, references] =
  //       accelerator.gather_for_metrics({outputs.argmax(-1), batch.target});
  template <size_t N>
  std::array<torch::Tensor, N> gather_for_metrics(
      const torch::Tensor (&tensors)[N], CallSite site = CallSite::Here()) {
    std::array<torch::Tensor, N> result;
    for (size_t i = 0; i < N; ++i) {
      result[i] = gather_for_metrics(tensors[i], site);
    }
    return result;
  }
  // gather_for_metrics of plain values (see gather_object).
  template <typename T>
  std::vector<T> gather_for_metrics(const std::vector<T>& objects,
                                    CallSite site = CallSite::Here()) {
    std::vector<T> all = gather_object(objects, site);
    const GradientState& gradients = state_->gradients;
    if (gradients.end_of_dataloader() && gradients.remainder() > 0 &&
        all.size() > static_cast<size_t>(gradients.remainder())) {
      all.resize(static_cast<size_t>(gradients.remainder()));
    }
    return all;
  }
  // Strings and other plain values (see accel/runtime/comm/object_collectives.h
  // for the types and how to add yours): every rank passes a list and gets
  // the concatenation of all lists in rank order.
  template <typename T>
  std::vector<T> gather_object(const std::vector<T>& objects,
                               CallSite site = CallSite::Here()) {
    return GatherObject(communicator(), objects, At(site, "gather_object"));
  }
  // In place: every rank's list becomes from_process's list.
  template <typename T>
  std::vector<T>& broadcast_object_list(std::vector<T>& objects,
                                        int from_process = 0,
                                        CallSite site = CallSite::Here()) {
    return BroadcastObjectList(communicator(), objects, from_process,
                               At(site, "broadcast_object_list"));
  }
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
  // Any rank can raise the trigger; check_trigger() is true on every rank
  // when one did since the last check (a collective), and lowers it.
  void set_trigger() { trigger_ = true; }
  bool check_trigger(CallSite site = CallSite::Here());
  // Preemption: true on every rank, at the same call, once any rank got a
  // stop signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2: a cluster's
  // warning before it kills the job, or the launcher passing one on). Call
  // it once per step; when it says so, save and leave within the grace
  // period:
  //   if (accelerator.check_preemption()) {
  //     accelerator.save_state();
  //     return accel::kPreemptedExitCode;  // 75; --resume continues
  //   }
  // Until a program's first call, a stop signal ends it at once, as before
  // (see accel/runtime/base/preemption.h). It stays true once raised.
  bool check_preemption(CallSite site = CallSite::Here());
  // The stop signal that check_preemption reported (the highest number
  // when ranks got different ones), or 0.
  int preemption_signal() const { return preemption_signal_; }

  // --- Doing things on some processes ------------------------------------
  // Prints its arguments, separated by spaces, on the local main process.
  template <typename... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream line;
    const char* separator = "";
    ((line << separator << args, separator = " "), ...);
    std::cout << line.str() << std::endl;
  }
  // The scope runs on the main process (local: on each machine's) first,
  // then on the others: e.g. download and cache a data set once.
  ProcessOrderScope main_process_first(CallSite site = CallSite::Here());
  ProcessOrderScope local_main_process_first(CallSite site = CallSite::Here());
  // Accelerate's decorators: `fn` wrapped to run only on that process.
  template <typename Fn>
  auto on_main_process(Fn fn) const {
    return OnlyOn(is_main_process(), std::move(fn));
  }
  template <typename Fn>
  auto on_local_main_process(Fn fn) const {
    return OnlyOn(is_local_main_process(), std::move(fn));
  }
  template <typename Fn>
  auto on_last_process(Fn fn) const {
    return OnlyOn(is_last_process(), std::move(fn));
  }
  template <typename Fn>
  auto on_process(Fn fn, int process_index) const {
    return OnlyOn(process_index == this->process_index(), std::move(fn));
  }
  template <typename Fn>
  auto on_local_process(Fn fn, int local_process_index) const {
    return OnlyOn(local_process_index == this->local_process_index(),
                  std::move(fn));
  }
  // This process's share of `items` (see process_control.h).
  template <typename Items>
  Items split_between_processes(const Items& items,
                                bool apply_padding = false) const {
    return split::Split(items, process_index(), num_processes(), apply_padding);
  }

  // Seeds torch's generators; device_specific adds process_index().
  void set_seed(uint64_t seed, bool device_specific = false);

  // --- Checkpoints (see accel/checkpoint.h for the layout) ----------------
  // Every rank calls save_state: the main process writes the shared file,
  // each rank its RNG state.
  void save_state(const std::string& dir);
  // With AcceleratorOptions::project_dir: the next automatically named
  // checkpoint (every rank must call it, as many times); returns its folder.
  std::string save_state(CallSite site = CallSite::Here());
  // Every rank calls it: each checks its files first and all learn every
  // rank's verdict, so either every rank loads or each throws the same
  // CheckpointError naming what each rank lacks (none trains on alone).
  void load_state(const std::string& dir);
  // Loads the newest automatically named checkpoint that every rank can
  // load (rank 0 lists them, newest first; each rank checks its files;
  // skipped ones are reported with the reason) and returns its folder, or ""
  // when there is none at all (so `--resume` on a first run starts afresh).
  // CheckpointError when there are checkpoints but none that every rank can
  // load, naming what each rank lacks.
  std::string load_state(CallSite site = CallSite::Here());
  // The newest complete automatically named checkpoint, or "" when there is
  // none (to resume only when there is something to resume from).
  std::string latest_checkpoint() const;
  // Adds `object` (anything with save(OutputArchive&) const and
  // load(InputArchive&), which must outlive the Accelerator) to what
  // save_state and load_state carry.
  template <typename T>
  void register_for_checkpointing(T& object) {
    static_assert(std::is_invocable_v<decltype(&T::save), const T&,
                                      torch::serialize::OutputArchive&> &&
                      std::is_invocable_v<decltype(&T::load), T&,
                                          torch::serialize::InputArchive&>,
                  "register_for_checkpointing needs an object with "
                  "save(torch::serialize::OutputArchive&) const and "
                  "load(torch::serialize::InputArchive&)");
    contents_.objects.push_back(
        {[&object](torch::serialize::OutputArchive& a) { object.save(a); },
         [&object](torch::serialize::InputArchive& a) { object.load(a); }});
  }
  // The same loader, whose next pass starts after its first `batches`
  // batches (resuming in the middle of an epoch by hand; save_state and
  // load_state already do it).
  template <typename Dataset, typename Batch>
  DataLoader<Dataset, Batch> skip_first_batches(
      const DataLoader<Dataset, Batch>& loader, int64_t batches) const {
    return loader.SkipFirstBatches(batches);
  }
  // Called with the models and the folder before save_state writes, or
  // before load_state reads (Accelerate's register_save_state_pre_hook).
  using StateHook = std::function<void(
      const std::vector<std::shared_ptr<torch::nn::Module>>& models,
      const std::string& dir)>;
  void register_save_state_pre_hook(StateHook hook) {
    save_hooks_.push_back(std::move(hook));
  }
  void register_load_state_pre_hook(StateHook hook) {
    load_hooks_.push_back(std::move(hook));
  }
  // Number of the next automatically named checkpoint.
  int64_t save_iteration() const { return next_checkpoint_; }

  // --- Weights ------------------------------------------------------------
  // The model's parameters and buffers by name, on the CPU.
  template <typename Model>
  std::map<std::string, torch::Tensor> get_state_dict(
      const Model& model) const {
    return StateDictOf(*ModulePointer(model));
  }
  // Writes the model's weights as safetensors (model.safetensors, or shards
  // of at most max_shard_size with model.safetensors.index.json) on the main
  // process; read them back with accel::LoadModelWeightsInto.
  template <typename Model>
  void save_model(const Model& model, const std::string& dir,
                  const std::string& max_shard_size = "10GB") const {
    if (is_main_process()) {
      SaveModelWeights(*ModulePointer(model), dir, max_shard_size);
    }
  }
  // torch::save(value, path) on the main process, written aside and renamed
  // into place.
  template <typename T>
  void save(const T& value, const std::string& path) const {
    if (!is_main_process()) return;
    std::ostringstream bytes;
    torch::save(value, bytes);
    WriteFileAtomically(path, bytes.str());
  }

  // Backward passes run so far (restored by load_state).
  int64_t step() const { return contents_.step; }

  // --- Experiment tracking (see accel/tracking/tracker.h) -----------------
  // The options' logging_dir, or else project_dir.
  const std::string& logging_dir() const;
  // Starts the trackers of AcceleratorOptions::log_with (--report_to) on the
  // main process, in <logging_dir>/<project_name>, and gives them the run's
  // hyperparameters: init_trackers("run", {{"lr", 3e-4}, {"epochs", 3}}).
  // Other processes only note that it was called. Call it once, on every
  // process, before log().
  void init_trackers(const std::string& project_name,
                     const TrackerValues& config = {});
  // Logs values at `step` to every tracker, on the main process only (a
  // no-op elsewhere). Without a step: one past the last step logged (0
  // at first), so that repeated log(values) calls make a curve.
  void log(const TrackerValues& values, std::optional<int64_t> step = {});
  // The tracker started under `name` (dynamic_cast it to its class for more,
  // e.g. TensorBoardTracker::writer()). On other processes a tracker that
  // ignores everything, as in Accelerate. UsageError on the main process when
  // there is no such tracker.
  Tracker& get_tracker(const std::string& name);
  // The started trackers (none on other processes).
  const std::vector<std::unique_ptr<Tracker>>& trackers() const {
    return trackers_;
  }

  // --- The end ------------------------------------------------------------
  // Finishes the trackers (main process), then waits for every process and
  // leaves the job: later collectives fail.
  void end_training(CallSite site = CallSite::Here());
  // Forgets every prepared object (models, optimizers, schedulers, loaders,
  // registered objects) and frees accel's gradient buffers; the objects
  // themselves stay the program's.
  // Also forgets the state hooks.
  void free_memory();
  void clear() { free_memory(); }

 private:
  // Every rank's problems with checkpoint `dir` ("rank 1: ..."; "" when each
  // can load it), agreed through one collective.
  std::string CheckpointProblems(const std::string& dir, CallSite site);
  // Loads `dir`, whose files every rank has checked.
  void LoadChecked(const std::string& dir);

  template <typename T>
  static constexpr bool kAlwaysFalse = false;
  template <typename T>
  struct IsDataLoader : std::false_type {};
  template <typename D, typename B>
  struct IsDataLoader<DataLoader<D, B>> : std::true_type {};
  template <typename T>
  struct IsSharedModule : std::false_type {};
  template <typename M>
  struct IsSharedModule<std::shared_ptr<M>>
      : std::is_base_of<torch::nn::Module, M> {};
  template <typename T>
  struct IsUniquePointer : std::false_type {};
  template <typename P>
  struct IsUniquePointer<std::unique_ptr<P>> : std::true_type {};
  template <typename T>
  struct IsScheduler : std::is_base_of<LRScheduler, T> {};
  template <typename S>
  struct IsScheduler<std::unique_ptr<S>> : std::is_base_of<LRScheduler, S> {};
  template <typename S>
  struct IsScheduler<std::shared_ptr<S>> : std::is_base_of<LRScheduler, S> {};

  template <typename T>
  auto PrepareOne(T&& object) {
    using U = std::decay_t<T>;
    if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, U>) {
      U copy = object;
      PrepareModule(copy.ptr());
      return copy;
    } else if constexpr (IsSharedModule<U>::value) {
      U copy = object;
      PrepareModule(copy);
      return copy;
    } else if constexpr (std::is_base_of_v<torch::optim::Optimizer, U>) {
      static_assert(std::is_lvalue_reference_v<T>,
                    "accel: prepare() takes optimizers by reference; keep the "
                    "optimizer in a variable that outlives the training loop");
      return AcceleratedOptimizer<U>(state_, PrepareOptimizer(object));
    } else if constexpr (IsDataLoader<U>::value) {
      U configured = object;
      if (options_.split_batches)
        configured.mutable_options().split_batches = true;
      if (!options_.even_batches)
        configured.mutable_options().even_batches = false;
      U sharded = configured.Shard(
          process_index(), num_processes(), device_,
          std::shared_ptr<GradientState>(state_, &state_->gradients));
      PrepareLoader(sharded.state(), sharded.options().split_batches);
      return sharded;
    } else if constexpr (IsScheduler<U>::value) {
      return AcceleratedScheduler(state_,
                                  PrepareScheduler(std::forward<T>(object)));
    } else {
      static_assert(kAlwaysFalse<T>,
                    "accel: prepare() takes models (torch::nn::ModuleHolder "
                    "or std::shared_ptr<Module>), optimizers, "
                    "accel::DataLoader and accel::LRScheduler");
      return 0;  // Keeps the compiler from adding errors after this one.
    }
  }

  template <typename S>
  std::shared_ptr<LRScheduler> PrepareScheduler(S&& scheduler) {
    using U = std::decay_t<S>;
    std::shared_ptr<LRScheduler> shared;
    if constexpr (std::is_base_of_v<LRScheduler, U>) {
      static_assert(std::is_lvalue_reference_v<S>,
                    "accel: prepare() takes a scheduler object by reference, "
                    "or by std::unique_ptr / std::shared_ptr");
      shared = std::shared_ptr<LRScheduler>(&scheduler, [](LRScheduler*) {});
    } else if constexpr (std::is_lvalue_reference_v<S> &&
                         IsUniquePointer<U>::value) {
      // Borrowed: the program's unique_ptr keeps owning it.
      shared =
          std::shared_ptr<LRScheduler>(scheduler.get(), [](LRScheduler*) {});
    } else {
      shared = std::shared_ptr<LRScheduler>(std::forward<S>(scheduler));
    }
    if (shared == nullptr) throw UsageError("prepare: the scheduler is null");
    contents_.schedulers.push_back(shared);
    return shared;
  }

  template <typename Fn>
  auto OnlyOn(bool here, Fn fn) const {
    return [here, fn = std::move(fn)](auto&&... args) {
      if (here) fn(std::forward<decltype(args)>(args)...);
    };
  }

  static std::map<std::string, torch::Tensor> StateDictOf(
      const torch::nn::Module& module);
  template <typename M>
  static const torch::nn::Module* ModulePointer(const M& model) {
    if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, M>) {
      return model.ptr().get();
    } else if constexpr (IsSharedModule<M>::value) {
      return model.get();
    } else {
      static_assert(std::is_base_of_v<torch::nn::Module, M>,
                    "accel: expected a model (a ModuleHolder, a "
                    "std::shared_ptr<Module> or a Module)");
      return &model;
    }
  }
  // The gradient synchronizer of a prepared model (null with one process).
  GradientSynchronizer* SynchronizerOf(const torch::nn::Module* model,
                                       const char* operation);

  // Rank 0's `value` on every rank (set once per name and restart).
  std::string FromMainProcess(const std::string& name,
                              const std::string& value);
  // Joins the job, or shares the group another Accelerator of this process
  // joined; end_training() (or an error) leaves it for good.
  void JoinOrShareTheJob();
  void LeaveTheJob();
  std::string AgreeOnRunId();
  // Refuses, on every rank, a project_dir that another job (or Accelerator)
  // is using: their checkpoint numbers would interleave.
  void ClaimProjectDir();
  void PrepareModule(const std::shared_ptr<torch::nn::Module>& module);
  std::shared_ptr<PreparedOptimizer> PrepareOptimizer(
      torch::optim::Optimizer& optimizer);
  void PrepareLoader(std::shared_ptr<DataLoaderState> state,
                     bool split_batches);
  CollectiveOptions At(CallSite site, const char* api = nullptr) const;
  // Keeps the first remainder() rows on a loader's last batch.
  torch::Tensor DropDuplicates(const torch::Tensor& gathered) const;

  DistributedEnvironment env_;
  AcceleratorOptions options_;
  std::string backend_;
  torch::Device device_ = torch::kCPU;
  // Shared by every Accelerator of this process (see JoinOrShareTheJob).
  std::shared_ptr<ProcessGroup> group_;
  int64_t instance_ = 0;  // This Accelerator's number in the process.
  std::unique_ptr<FolderLock> project_lock_;  // Main process, project_dir.
  std::vector<std::pair<const torch::nn::Module*,
                        std::unique_ptr<GradientSynchronizer>>>
      synchronizers_;
  std::shared_ptr<TrainingState> state_;
  CheckpointContents contents_;
  int64_t next_checkpoint_ = 1;
  bool checked_shared_folder_ = false;
  bool trigger_ = false;
  int preemption_signal_ = 0;
  std::vector<StateHook> save_hooks_;
  std::vector<StateHook> load_hooks_;
  std::vector<std::string> tracker_names_;  // log_with, "all" resolved.
  std::vector<std::unique_ptr<Tracker>> trackers_;
  bool trackers_started_ = false;
  bool trackers_finished_ = false;
  int64_t next_log_step_ = 0;
};

}  // namespace accel
