// The Accelerator: one training loop for one CPU, N CPU processes (Gloo) or
// N GPUs (NCCL), as in Hugging Face Accelerate, whose names it keeps.
//
//   accel::Accelerator accelerator;  // reads the launcher's environment
//   auto [model, optimizer, loader, scheduler] = accelerator.prepare(
//       net, adamw, data,
//       accel::get_linear_schedule_with_warmup(adamw, 100, 1000));
//   for (auto& batch : loader) {
//     auto accumulate = accelerator.accumulate(model);
//     // --mixed_precision=bf16: prepare() autocasts this thread's forward.
//     torch::Tensor loss = criterion(model->forward(batch.data), batch.target);
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
// stands inside an epoch; mixed precision's autocast is on for the thread
// that prepared a model, paused in accel's backward, optimizer step and
// clipping (LibTorch's C++ modules have no forward hooks to wrap). The
// API table in docs/porting.md lists every name.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <torch/types.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/accelerated_optimizer.h"
#include "accel/accelerated_scheduler.h"
#include "accel/accelerator_options.h"
#include "accel/checkpoint/checkpoint.h"
#include "accel/checkpoint/model_weights.h"
#include "accel/checkpoint/state_dict.h"
#include "accel/data/data_loader.h"
#include "accel/join_scope.h"
#include "accel/memory/activation_checkpoint.h"  // accel::checkpoint
#include "accel/memory/tensor_census.h"
#include "accel/optim/autocast.h"
#include "accel/optim/fused_optimizers.h"  // accel::FusedAdamW, ...
#include "accel/optim/grad_scaler.h"
#include "accel/optim/lr_schedulers.h"
#include "accel/optim/reduce_lr_on_plateau.h"
#include "accel/optim/scheduler.h"
#include "accel/parallel/gradient_sync.h"
#include "accel/parallel/parallel_linear.h"  // accel::ParallelLinear
#include "accel/parallel/sharded_units.h"    // accel::forward, fully_shard
#include "accel/parallel/zero.h"
#include "accel/prepare_traits.h"
#include "accel/process_control.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/base/preemption.h"
#include "accel/runtime/comm/communicator.h"
#include "accel/runtime/comm/object_collectives.h"
#include "accel/runtime/env/environment.h"
#include "accel/runtime/launch/program.h"  // InitProgram, for main().
#include "accel/tracking/tracker.h"
#include "accel/training_state.h"

namespace accel {

class Accelerator;
class CheckpointManager;
class ProcessGroup;
class TrackerSet;

// Accelerate's DistributedType, for the backends and sharding accel has: a
// ZeRO stage above 0 is DEEPSPEED, or FSDP when it came from --use_fsdp
// (AcceleratorOptions::use_fsdp), as Accelerate names those runs.
enum class DistributedType { kNo, kMultiCpu, kMultiGpu, kFsdp, kDeepSpeed };
// "NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED", as Accelerate prints
// them.
const char* DistributedTypeName(DistributedType type);

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
  bool multi_device() const { return num_processes() > 1 && device_.is_cuda(); }
  bool split_batches() const {
    return options_.dataloader_config.split_batches;
  }
  bool even_batches() const { return options_.dataloader_config.even_batches; }
  const DataLoaderConfiguration& dataloader_config() const {
    return options_.dataloader_config;
  }
  // 0 (DDP) to 3 (parameters sharded too): options' zero_stage.
  int zero_stage() const { return options_.zero_stage; }
  // The ProfileKwargs given to the options (or their kwargs_handlers).
  const ProfileKwargs& profile_handler() const { return options_.profile; }
  // The communication backend in use ("gloo", "nccl").
  const std::string& backend() const { return backend_; }
  // "no", "bf16" or "fp16", as Accelerate's state prints it.
  const std::string& mixed_precision() const {
    return options_.mixed_precision;
  }
  const std::string& project_dir() const { return options_.project_dir; }
  Communicator& communicator();

  // --- N-D parallelism (AcceleratorOptions::parallelism_config) -----------
  // The parallelism config resolved for this job (all ones become
  // dp_replicate = num_processes), or nullopt without one.
  const std::optional<ParallelismConfig>& parallelism_config() const {
    return parallelism_config_;
  }
  // The device mesh with a group per dimension (accel's DeviceMesh, under
  // Accelerate's name), or null without a parallelism config or with one
  // process.
  //   accel::Communicator& tp = accelerator.torch_device_mesh()->group("tp");
  DeviceMesh* torch_device_mesh() const { return state_->mesh.get(); }
  // This process's coordinate along dp_replicate, dp_shard, tp and cp (0
  // where the mesh has no such dimension). UsageError without a
  // parallelism config, as Accelerate raises.
  int data_parallel_rank() const;
  int data_parallel_shard_rank() const;
  int tensor_parallel_rank() const;
  int context_parallel_rank() const;
  // The ranks that see different batches (dp_replicate x dp_shard; every
  // process without a mesh), and this process's index among them: what
  // prepared data loaders shard over.
  int data_parallel_size() const;
  int data_parallel_index() const;
  // Accelerate's maybe_context_parallel: with a mesh of cp_size > 1, cuts
  // each of `buffers` (token ids, targets, position ids: a batch's tensors
  // that run along the sequence) in place to this rank's contiguous part
  // along its entry of `buffer_seq_dims`; otherwise leaves them. The
  // model's attention exchanges over torch_device_mesh()->group("cp")
  // (accel/parallel/context_parallel.h; the GPT example's
  // ContextParallelGpt). Differs from Accelerate on purpose: a call, not a
  // context manager, and nothing is restored afterwards (as if every
  // buffer were in no_restore_buffers): LibTorch has no SDPA to swap, so
  // the model calls the exchanges itself. UsageError when the counts
  // differ or a sequence does not divide over cp.
  void maybe_context_parallel(const std::vector<torch::Tensor*>& buffers,
                              const std::vector<int64_t>& buffer_seq_dims);

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
  // All of them are recorded for save_state. The models of a call are
  // prepared first, whatever their place in it (as Accelerate does), so
  // that prepare(optimizer, data, model) shards the optimizer over the
  // model under ZeRO as prepare(model, optimizer, data) does.
  template <typename... Objects>
  auto prepare(Objects&&... objects);
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
  NoSyncScope accumulate(Models&... models);
  // Turns off the gradient sync of `model` for the scope: backward keeps
  // gradients local (accumulate them, then sync in one backward outside).
  template <typename Model>
  NoSyncScope no_sync(Model& model);
  // Accelerate's join_uneven_inputs (torch's Join over DDP): inside the
  // scope ranks may get different numbers of batches; see
  // accel/join_scope.h for what the scope does, and its limits.
  JoinScope join_uneven_inputs(const std::vector<Joinable>& joinables,
                               std::optional<bool> even_batches = {});
  // Syncs gradients in the scope's backward even inside no_sync (for a
  // model whose last micro-step must sync).
  template <typename... Models>
  NoSyncScope trigger_sync_in_backward(Models&... models);
  // invariant_micro_batches (accel/parallel/invariant_reduction.h): this
  // process's micro-batches of `batch` (its share of a global batch under
  // split_batches), invariant_micro_batches / num_processes equal slices
  // along dim 0, the same slices at any process count; call backward once
  // for each. With the option off: the batch itself, alone, so that one
  // loop serves both. UsageError when the batch does not split evenly.
  std::vector<torch::data::Example<>> micro_batches(
      const torch::data::Example<>& batch) const;
  std::vector<torch::Tensor> micro_batches(const torch::Tensor& batch) const;
  // Whether this micro-step syncs gradients and steps the optimizer (false
  // between the micro-batches of an invariant_micro_batches step).
  bool sync_gradients() const {
    return state_->gradients.sync_gradients() && !MidStep();
  }
  int gradient_accumulation_steps() const {
    return state_->gradients.accumulation_steps();
  }
  void set_gradient_accumulation_steps(int steps);
  // Mixed precision's autocast for the scope (none with "no"), as
  // AcceleratorOptions::autocast says, or as `handler` says (Accelerate's
  // accelerator.autocast(autocast_handler=...)); a handler with enabled =
  // false gives a scope in full precision. prepare() already turns
  // autocast on for its thread (see accel/optim/autocast.h), so the loop needs
  // no scope of its own.
  AutocastScope autocast() const;
  AutocastScope autocast(const AutocastKwargs& handler) const;
  // Clips the gradients' total norm (unscaling them first under fp16) and
  // returns the norm before clipping. Call on steps that sync gradients.
  // Under ZeRO the norm is over every rank's shards (the same on every
  // rank), so every rank must call it. The norm is summed in float64, so
  // that DDP and every ZeRO stage clip by the same coefficient (it may
  // differ from torch's float32 clip_grad_norm_ in the last bit).
  double clip_grad_norm_(const std::vector<torch::Tensor>& parameters,
                         double max_norm, double norm_type = 2.0,
                         CallSite site = CallSite::Here());
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
  // gather, gather_for_metrics, reduce and broadcast take a tensor, a
  // std::vector or a std::map<std::string, torch::Tensor> (the collective
  // runs for each tensor, in order) and return the same kind; a braced list
  // comes back as a std::array: auto [a, b] = accelerator.gather({x, y});
  template <typename Tensors>
  Tensors gather(const Tensors& tensors, CallSite site = CallSite::Here());
  template <size_t N>
  std::array<torch::Tensor, N> gather(const torch::Tensor (&tensors)[N],
                                      CallSite site = CallSite::Here());
  // gather, but on the last batch of a prepared data loader the samples that
  // even_batches duplicated are dropped: over an epoch the result holds each
  // sample of the dataset exactly once. Also takes a std::vector of plain
  // values (see gather_object), as Accelerate's use_gather_object.
  //   auto [predictions, references] =
  //       accelerator.gather_for_metrics({outputs.argmax(-1), batch.target});
  template <typename Values>
  Values gather_for_metrics(const Values& values,
                            CallSite site = CallSite::Here());
  template <size_t N>
  std::array<torch::Tensor, N> gather_for_metrics(
      const torch::Tensor (&tensors)[N], CallSite site = CallSite::Here());
  // Strings and other plain values (see accel/runtime/comm/object_collectives.h
  // for the types and how to add yours): every rank passes a list and gets
  // the concatenation of all lists in rank order.
  template <typename T>
  std::vector<T> gather_object(const std::vector<T>& objects,
                               CallSite site = CallSite::Here());
  // In place: every rank's list becomes from_process's list.
  template <typename T>
  std::vector<T>& broadcast_object_list(std::vector<T>& objects,
                                        int from_process = 0,
                                        CallSite site = CallSite::Here());
  // reduction: "sum", "mean", "max" or "min".
  template <typename Tensors>
  Tensors reduce(const Tensors& tensors, const std::string& reduction = "sum",
                 CallSite site = CallSite::Here());
  template <typename Tensors>
  Tensors broadcast(const Tensors& tensors, int from_process = 0,
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
  void print(const Args&... args) const;
  // The scope runs on the main process (local: on each machine's) first,
  // then on the others: e.g. download and cache a data set once.
  ProcessOrderScope main_process_first(CallSite site = CallSite::Here());
  ProcessOrderScope local_main_process_first(CallSite site = CallSite::Here());
  // Accelerate's decorators: `fn` wrapped to run only on that process.
  template <typename Fn>
  auto on_main_process(Fn fn) const {
    return detail::OnlyOn(is_main_process(), std::move(fn));
  }
  template <typename Fn>
  auto on_local_main_process(Fn fn) const {
    return detail::OnlyOn(is_local_main_process(), std::move(fn));
  }
  template <typename Fn>
  auto on_last_process(Fn fn) const {
    return detail::OnlyOn(is_last_process(), std::move(fn));
  }
  template <typename Fn>
  auto on_process(Fn fn, int process_index) const;
  template <typename Fn>
  auto on_local_process(Fn fn, int local_process_index) const;
  // This process's share of `items` (see process_control.h).
  template <typename Items>
  Items split_between_processes(const Items& items,
                                bool apply_padding = false) const;

  // Seeds torch's generators; device_specific adds process_index().
  void set_seed(uint64_t seed, bool device_specific = false);

  // --- Checkpoints (accel/checkpoint/checkpoint.h has the layout) ---------
  // Every rank calls save_state: the main process writes the
  // shared file, each rank its RNG state.
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
  void register_for_checkpointing(T& object);
  // The same loader, whose next pass starts after its first `batches`
  // batches (resuming in the middle of an epoch by hand; save_state and
  // load_state already do it).
  template <typename Dataset, typename Batch>
  DataLoader<Dataset, Batch> skip_first_batches(
      const DataLoader<Dataset, Batch>& loader, int64_t batches) const;
  // Called with the models and the folder before save_state writes, or
  // before load_state reads (Accelerate's register_save_state_pre_hook).
  using StateHook = std::function<void(
      const std::vector<std::shared_ptr<torch::nn::Module>>& models,
      const std::string& dir)>;
  void register_save_state_pre_hook(StateHook hook);
  void register_load_state_pre_hook(StateHook hook);
  // Number of the next automatically named checkpoint.
  int64_t save_iteration() const;

  // --- Weights ------------------------------------------------------------
  // The model's parameters and buffers by name, on the CPU. Under ZeRO
  // stage 3 every rank calls it: the units are gathered one at a time and
  // the main process gets the copies (the others an empty map).
  template <typename Model>
  std::map<std::string, torch::Tensor> get_state_dict(
      const Model& model, CallSite site = CallSite::Here());
  // Writes the model's weights as safetensors (model.safetensors, or shards
  // of at most max_shard_size with model.safetensors.index.json) on the main
  // process; read them back with accel::LoadModelWeightsInto. Under ZeRO
  // stage 3 every rank calls it (as get_state_dict).
  template <typename Model>
  void save_model(const Model& model, const std::string& dir,
                  const std::string& max_shard_size = "10GB",
                  CallSite site = CallSite::Here());
  // torch::save(value, path) on the main process, written aside and renamed
  // into place.
  template <typename T>
  void save(const T& value, const std::string& path) const;

  // Backward passes run so far (restored by load_state).
  int64_t step() const { return step_; }

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
  const std::vector<std::unique_ptr<Tracker>>& trackers() const;

  // --- The end ------------------------------------------------------------
  // Finishes the trackers (main process), then waits for every process and
  // leaves the job: later collectives fail.
  void end_training(CallSite site = CallSite::Here());
  // What free_memory released.
  struct FreedMemory {
    // The prepared objects accel forgot.
    int models = 0, optimizers = 0, schedulers = 0, data_loaders = 0;
    int handles = 0;  // The program's handles it reset.
    // Bytes of tensors (parameters, gradients, buffers, optimizer state,
    // ZeRO's flat buffers and shards) that nothing references any more.
    int64_t bytes = 0;
  };
  // Forgets every prepared object (models, optimizers, schedulers, loaders,
  // registered objects) and the state hooks, and frees accel's gradient
  // buffers; then resets each handle given, as Accelerate's
  // free_memory(*objects) sets them to None: models (ModuleHolders) become
  // null, std::shared_ptr / std::unique_ptr are reset, and the optimizers
  // and schedulers prepare returned refuse any later use. The program's own
  // objects stay the program's (a torch optimizer it holds by value, a model
  // another handle still refers to): `bytes` counts what actually went.
  // Under ZeRO stage 3 every rank calls it: it gathers the models'
  // parameters back whole first.
  //
  //   auto freed = accelerator.free_memory(model, optimizer, scheduler);
  //   // freed.models == 1, freed.handles == 3, freed.bytes: what went
  template <typename... Handles>
  FreedMemory free_memory(Handles&... handles);
  void clear() { free_memory(); }

 private:
  // prepare()'s first pass: a model is prepared in place (its module is
  // shared with every copy of the handle).
  template <typename T>
  void PrepareIfModel(const T& object);
  // prepare()'s second pass; models were prepared by the first.
  template <typename T>
  auto PrepareOne(T&& object);

  // The dtype autocast computes in under mixed_precision (or the policy's
  // param_dtype), if any here.
  std::optional<c10::ScalarType> AutocastDtype() const;
  // options_.mixed_precision_policy with its unset members derived from
  // mixed_precision and the ZeRO stage (accelerator_options.h).
  MixedPrecisionPolicy PrecisionPolicy() const;
  // Mixed precision with no code in the loop: prepare() turns autocast on
  // for the thread that prepares a model, until end_training(),
  // free_memory() or the Accelerator's end.
  void AutocastThisThread();
  void EndThreadAutocast();
  // get_state_dict and save_model.
  std::map<std::string, torch::Tensor> StateDictOf(
      const torch::nn::Module& model, CallSite site);
  void SaveModelOf(const torch::nn::Module& model, const std::string& dir,
                   const std::string& max_shard_size, CallSite site);
  // `each(name, value)` for every state_dict entry of `model`, in order,
  // whole, on every rank: ZeRO-3's units gathered one at a time, tensor-
  // parallel shares gathered over tp and joined. Every rank calls it alike.
  void ForEachWholeEntry(const torch::nn::Module& model, const char* api,
                         CallSite site,
                         const std::function<void(const std::string&,
                                                  const torch::Tensor&)>& each);
  // Runs `work` (a save or load of the training state) with every ZeRO-3
  // unit's parameters whole, then reshards them with what they hold.
  void WithWholeParameters(const std::function<void()>& work);
  // save_state in the middle of an accumulation cycle: warns (on the main
  // process) that the gradients accumulated since the last step are lost.
  void WarnIfMidAccumulation() const;
  // invariant_micro_batches (accelerator_invariant.cc): the check against
  // the process count, and the threads per process.
  void SetUpInvariantMicroBatches();
  // Whether a step's micro-batches are part done; UsageError naming
  // `operation` if so (clipping, unscaling, save_state).
  bool MidStep() const;
  void CheckStepsComplete(const char* operation) const;
  std::vector<torch::Tensor> SplitMicroBatches(const torch::Tensor& tensor,
                                               const char* what) const;
  // The optimizer sharding the model's parameters (stage 3) or keeping
  // their master shards (mixed precision), or null.
  ZeroOptimizer* ParameterShardingOf(const torch::nn::Module& model) const;

  // The main process's `tensor` (undefined elsewhere), on every rank, on
  // this process's device: dispatch_batches' send.
  torch::Tensor FromMainProcessTensor(const torch::Tensor& tensor);

  // join_uneven_inputs' state (accelerator_join.cc).
  friend class JoinScope;
  void EndJoin(bool joining, bool unwinding);
  std::vector<int64_t> CountRanksTraining(bool training);
  void ShadowGradientSync(bool keep_gradients,
                          const std::vector<int64_t>& counts);
  void SyncFromLastTrainer(bool trained_last);
  bool join_active_ = false;  // Inside a join_uneven_inputs scope.
  bool joining_ = false;      // ... whose ranks may run out of batches.
  std::vector<std::pair<std::shared_ptr<DataLoaderState>, std::optional<bool>>>
      join_saved_even_batches_;

  // The groups of the mesh that accel's own work runs over; without a mesh
  // each is the whole job. DataGroup: ranks with different batches
  // (gather, reduce, loaders). GradientGroup: ranks whose gradients are
  // averaged (dp x cp; every rank that holds the same tensor-parallel
  // slice). ShardGroup: what ZeRO shards over (dp_shard x cp).
  Communicator& DataGroup();
  Communicator& GradientGroup();
  Communicator& ShardGroup();
  // dp_replicate's group when it has several ranks (HSDP), else null.
  Communicator* ReplicaGroup();
  // Builds the mesh of options_.parallelism_config (a collective).
  void MakeDeviceMesh();
  // The prepared models' tensor-parallel layers (parallelize_module): their
  // split parameters and the tp group, for the gradients' norm.
  TensorParallelNorm TensorParallelOf() const;
  // UsageError naming `api` and `why` when a prepared model has
  // tensor-parallel layers: a checkpoint of whole weights cannot hold them.
  void RefuseSplitLayers(const char* api, const char* why) const;
  int MeshCoordinate(const char* dimension, const char* api) const;

  // The gradient synchronizer of a prepared model (null with one process).
  GradientReducer* SynchronizerOf(const torch::nn::Module* model,
                                  const char* operation);

  // Rank 0's `value` on every rank (set once per name and restart).
  std::string FromMainProcess(const std::string& name,
                              const std::string& value);
  // Joins the job, or shares the group another Accelerator of this process
  // joined; end_training() (or an error) leaves it for good.
  void JoinOrShareTheJob();
  void LeaveTheJob();
  // An error unwinds under RunAndReportErrors: out of the job for new
  // Accelerators, the group kept until the error is printed (exit).
  void ParkForTheReport();
  // Both: the synchronizers and ZeRO's gathers let go of the group.
  void DetachFromTheGroup();
  std::string AgreeOnRunId();
  // free_memory's forgetting; `census` records what the objects held.
  FreedMemory ForgetPreparedObjects(TensorCensus& census);
  // An optimizer given to free_memory (its state); models are counted as
  // prepared.
  template <typename Handle>
  static void CountHandle(TensorCensus& census, Handle& handle);
  template <typename Handle>
  static void ResetHandle(Handle& handle);
  // A plateau scheduler's metric, one value on every rank: the same
  // everywhere as it is, else the mean summed in rank order.
  double AgreeOnMetric(double metric);
  void MakeLossScaler();
  // AcceleratorOptions::gradient_clipping in every prepared optimizer's
  // step.
  void ClipBeforeEachStep();
  void MakeCheckpointManager();
  void PrepareModule(const std::shared_ptr<torch::nn::Module>& module);
  // Registers the optimizer; under ZeRO (options' zero_stage, several
  // processes) shards it over the prepared model(s) holding its parameters.
  std::shared_ptr<PreparedOptimizer> PrepareOptimizer(
      torch::optim::Optimizer& optimizer);
  void RefuseRepeatedParameters(const torch::optim::Optimizer& optimizer) const;
  void PrepareLoader(std::shared_ptr<DataLoaderState> state,
                     bool split_batches);
  CollectiveOptions At(CallSite site, const char* api = nullptr) const;
  // One tensor's collectives.
  torch::Tensor GatherOne(const torch::Tensor& tensor, CallSite site,
                          const char* api, bool drop_duplicates);
  torch::Tensor ReduceOne(const torch::Tensor& tensor,
                          const std::string& reduction, CallSite site);
  torch::Tensor BroadcastOne(const torch::Tensor& tensor, int from_process,
                             CallSite site);
  // Of `gathered` samples, those gather_for_metrics keeps: on a loader's
  // last batch, the first remainder() (the rest duplicate others).
  int64_t SamplesToKeep(int64_t gathered) const;
  // What a checkpoint holds: the registry's objects, the scaler, the step
  // and the run id.
  // Not const: a sharded save's contents call back into the communicator.
  CheckpointContents Contents();
  // The prepared models' and optimizers' tensors as this rank holds them,
  // for sharded checkpoints (accelerator_sharded_state.cc); nullopt when an
  // optimizer's state is of a kind accel cannot cut.
  std::optional<ShardedTensors> ShardedTensorsOfPrepared();
  // Calls the hooks for `dir`.
  std::function<void(const std::string&)> Hooks(
      const std::vector<StateHook>& hooks) const;

  DistributedEnvironment env_;
  AcceleratorOptions options_;
  std::optional<ParallelismConfig> parallelism_config_;  // Resolved.
  std::string backend_;
  torch::Device device_ = torch::kCPU;
  // Shared by every Accelerator of this process (see JoinOrShareTheJob).
  std::shared_ptr<ProcessGroup> group_;
  int64_t instance_ = 0;  // This Accelerator's number in the process.
  // What was prepared is in state_->prepared, the one registry.
  std::shared_ptr<TrainingState> state_;
  MixedPrecision precision_ = MixedPrecision::kNo;
  // prepare()'s autocast for the thread that prepared first; null: none.
  std::unique_ptr<ThreadAutocast> model_autocast_;
  // Backward passes (under invariant_micro_batches: steps), restored by
  // load_state.
  int64_t step_ = 0;
  std::string run_id_;
  std::unique_ptr<TrackerSet> trackers_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  bool trigger_ = false;
  int preemption_signal_ = 0;
  std::vector<StateHook> save_hooks_;
  std::vector<StateHook> load_hooks_;
};

}  // namespace accel

// The member templates' definitions.
#include "accel/accelerator_inl.h"  // IWYU pragma: export
