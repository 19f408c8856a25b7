#include "accel/accelerator.h"

#include <limits.h>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>

#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/base/folder_lock.h"
#include "accel/runtime/base/host_memory.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/process_setup.h"
#include "accel/runtime/base/startup_trace.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/comm/registry.h"
#include "accel/runtime/launch/program.h"
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

void ValidateOptions(const AcceleratorOptions& options) {
  const std::string& mp = options.mixed_precision;
  if (mp != "no" && mp != "bf16" && mp != "fp16") {
    throw UsageError(
        "mixed precision (--mixed_precision) must be \"no\", \"bf16\" or "
        "\"fp16\", found " +
        Excerpt(mp));
  }
  if (options.gradient_accumulation_steps < 1) {
    throw UsageError("gradient_accumulation_steps must be at least 1, found " +
                     std::to_string(options.gradient_accumulation_steps));
  }
  if (options.timeout.count() <= 0) {
    throw UsageError("the collective timeout must be positive, found " +
                     std::to_string(options.timeout.count()) + " ms");
  }
  if (options.rendezvous_timeout.count() <= 0) {
    throw UsageError("the rendezvous timeout must be positive, found " +
                     std::to_string(options.rendezvous_timeout.count()) +
                     " ms");
  }
  if (options.total_limit < 0) {
    throw UsageError("total_limit must not be negative, found " +
                     std::to_string(options.total_limit));
  }
}

// Checkpoints are written at the end of an epoch: find out now that they
// cannot be.
// `what`: the option that named it ("project_dir").
void CheckWritableFolder(const std::string& dir, const char* what) {
  if (dir.empty()) return;
  try {
    MakeDirectories(dir);
  } catch (const CheckpointError& e) {
    throw UsageError(std::string(what) + ": " + e.what());
  }
  if (!IsWritableFolder(dir)) {
    throw UsageError(
        std::string(what) + " '" + dir +
        "' is not a folder this process can write to: " + std::strerror(errno));
  }
}

// The longest path save_state writes under a project_dir must fit the
// system's limit; found at once rather than at the first save.
void CheckCheckpointPathLength(const std::string& project_dir, int world_size) {
  if (project_dir.empty()) return;
  long limit = pathconf(project_dir.c_str(), _PC_PATH_MAX);
  if (limit <= 0) limit = PATH_MAX;
  const std::string longest =
      CheckpointFolder(project_dir, 999999999999999999) + "/" +
      std::max<std::string>(RandomStatesFile(world_size - 1),
                            std::string("model.safetensors.index.json"),
                            [](const std::string& a, const std::string& b) {
                              return a.size() < b.size();
                            }) +
      ".partial.4194304.18446744073709551615";
  if (static_cast<long>(longest.size()) < limit) return;
  throw UsageError(
      "project_dir '" + project_dir.substr(0, 80) + "...' (" +
      std::to_string(project_dir.size()) +
      " characters) is too long for the checkpoint files under it: their "
      "paths reach " +
      std::to_string(longest.size()) +
      " characters, over the system's limit "
      "of " +
      std::to_string(limit - 1) + "; choose a shorter folder");
}

std::string Describe(const std::string& value) { return "\"" + value + "\""; }
std::string Describe(int value) { return std::to_string(value); }
std::string Describe(bool value) { return value ? "true" : "false"; }
std::string Describe(std::chrono::milliseconds value) {
  return std::to_string(value.count()) + " ms";
}
std::string Describe(const std::vector<std::string>& value) {
  std::string text;
  for (const std::string& item : value)
    text += (text.empty() ? "" : ",") + item;
  return "{" + text + "}";
}

// Accelerate's Accelerator() reads what `accelerate launch` set; here a
// flag the user gave (command line or launch configuration) takes effect
// when the program left the option at AcceleratorOptions' default, and is
// listed in `overridden` when the program set something else.
template <typename T, typename Field, typename Convert>
void AdoptFlag(const ProgramFlag<T>& flag, Field& field, const Field& builtin,
               const char* option, Convert convert,
               std::vector<std::string>* overridden) {
  if (!flag.given()) return;
  const Field wanted = convert(flag.value());
  if (field == wanted) return;
  if (field == builtin) {
    field = wanted;
    return;
  }
  overridden->push_back("--" + std::string(flag.name()) + "=" +
                        Describe(flag.value()) + " (" + flag.source() +
                        ") by " + option + " = " + Describe(field));
}

void AdoptGivenFlags(AcceleratorOptions& options, bool is_main_process) {
  const AcceleratorOptions builtin;
  std::vector<std::string> overridden;
  const auto same = [](const auto& value) { return value; };
  const auto seconds = [](int value) {
    return std::chrono::milliseconds(std::chrono::seconds(value));
  };
  AdoptFlag(flags::backend, options.backend, builtin.backend, "backend", same,
            &overridden);
  AdoptFlag(flags::mixed_precision, options.mixed_precision,
            builtin.mixed_precision, "mixed_precision", same, &overridden);
  AdoptFlag(flags::gradient_accumulation_steps,
            options.gradient_accumulation_steps,
            builtin.gradient_accumulation_steps, "gradient_accumulation_steps",
            same, &overridden);
  AdoptFlag(flags::timeout_s, options.timeout, builtin.timeout, "timeout",
            seconds, &overridden);
  AdoptFlag(flags::rendezvous_timeout_s, options.rendezvous_timeout,
            builtin.rendezvous_timeout, "rendezvous_timeout", seconds,
            &overridden);
  AdoptFlag(flags::network_timeout_s, options.network_timeout,
            builtin.network_timeout, "network_timeout", seconds, &overridden);
  AdoptFlag(flags::collective_checks, options.check_collectives,
            builtin.check_collectives, "check_collectives", same, &overridden);
  AdoptFlag(flags::report_to, options.log_with, builtin.log_with, "log_with",
            ParseTrackerNames, &overridden);
  AdoptFlag(flags::logging_dir, options.logging_dir, builtin.logging_dir,
            "logging_dir", same, &overridden);
  AdoptFlag(flags::reuse_host_memory, options.reuse_host_memory,
            builtin.reuse_host_memory, "reuse_host_memory", same, &overridden);
  if (overridden.empty() || !is_main_process) return;
  std::string listed;
  for (const std::string& item : overridden) {
    listed += (listed.empty() ? "" : "; ") + item;
  }
  ACCEL_LOG(WARNING) << "the program's AcceleratorOptions override what was "
                        "given: "
                     << listed
                     << ". To let the command line decide, start from "
                        "AcceleratorOptions::FromFlags()";
}

// The job's process group, shared by every Accelerator of this process (as
// Accelerate's state is one per process): a second Accelerator, alongside
// the first or after it, uses the same group instead of joining again. The
// last one leaves it parked until the process exits, end_training() or an
// error ends it.
struct SharedJob {
  std::mutex mutex;
  std::weak_ptr<ProcessGroup> group;
  std::shared_ptr<ProcessGroup> parked;
  std::string backend;
  bool left = false;  // end_training() ran: this process is out of the job.
  int64_t instances = 0;
};

SharedJob& Job() {
  static SharedJob job;
  return job;
}

void ReleaseParkedGroup() {
  std::shared_ptr<ProcessGroup> parked;
  {
    std::lock_guard<std::mutex> lock(Job().mutex);
    parked = std::move(Job().parked);
  }
}

}  // namespace

const char* DistributedTypeName(DistributedType type) {
  switch (type) {
    case DistributedType::kNo:
      return "NO";
    case DistributedType::kMultiCpu:
      return "MULTI_CPU";
    case DistributedType::kMultiGpu:
      return "MULTI_GPU";
  }
  return "UNKNOWN";
}

AcceleratorOptions AcceleratorOptions::FromFlags() {
  // Checked here too, so that the message names the flag.
  for (const auto& [flag, value] :
       {std::pair<const char*, int>{"--timeout_s", flags::timeout_s.value()},
        {"--rendezvous_timeout_s", flags::rendezvous_timeout_s.value()},
        {"--network_timeout_s", flags::network_timeout_s.value()},
        {"--gradient_accumulation_steps",
         flags::gradient_accumulation_steps.value()}}) {
    if (value < 1) {
      throw UsageError(std::string(flag) + " must be at least 1, found " +
                       std::to_string(value));
    }
  }
  AcceleratorOptions options;
  options.backend = flags::backend.value();
  options.mixed_precision = flags::mixed_precision.value();
  options.gradient_accumulation_steps =
      flags::gradient_accumulation_steps.value();
  options.timeout = std::chrono::seconds(flags::timeout_s.value());
  options.rendezvous_timeout =
      std::chrono::seconds(flags::rendezvous_timeout_s.value());
  options.network_timeout =
      std::chrono::seconds(flags::network_timeout_s.value());
  options.check_collectives = flags::collective_checks.value();
  options.log_with = ParseTrackerNames(flags::report_to.value());
  options.logging_dir = flags::logging_dir.value();
  options.reuse_host_memory = flags::reuse_host_memory.value();
  return options;
}

NoSyncScope::~NoSyncScope() {
  for (auto it = restore_.rbegin(); it != restore_.rend(); ++it) {
    it->first->set_enabled(it->second);
  }
}

void NoSyncScope::Add(GradientSynchronizer* synchronizer, bool enabled) {
  if (synchronizer == nullptr) return;
  restore_.emplace_back(synchronizer, synchronizer->enabled());
  synchronizer->set_enabled(enabled);
}

Accelerator::Accelerator(AcceleratorOptions options)
    : env_((PrepareProcess(), DistributedEnvironment::FromProcess())),
      options_(std::move(options)),
      state_(std::make_shared<TrainingState>()) {
  InstallTerminateHandler();
  InstallPreemptionHandlers();
  AdoptGivenFlags(options_, env_.rank == 0);
  ValidateOptions(options_);
  // Outside the log statement, whose stream runs only at --v=1.
  const std::string host_memory =
      options_.reuse_host_memory
          ? ReuseFreedHostMemory()
          : "malloc left as it is (--reuse_host_memory=false)";
  ACCEL_VLOG(1) << "host memory: " << host_memory;
  // Before joining: a bad --report_to fails at once, on every rank alike.
  tracker_names_ = ResolveTrackerNames(options_.log_with);
  for (const std::string& name : tracker_names_) {
    if (TrackerNeedsLoggingDir(name) && logging_dir().empty()) {
      throw UsageError("tracker '" + name +
                       "' (--report_to) needs a logging directory: pass "
                       "--logging_dir=DIR, or set AcceleratorOptions::"
                       "logging_dir or project_dir");
    }
  }
  // Also before joining: every rank finds an unusable folder on its own,
  // rather than some of them finding only that rank 0 left.
  CheckCheckpointPathLength(options_.project_dir, env_.world_size);
  CheckWritableFolder(options_.project_dir, "project_dir");
  for (const std::string& name : tracker_names_) {
    if (TrackerNeedsLoggingDir(name)) {
      CheckWritableFolder(logging_dir(), "logging_dir");
      break;
    }
  }
  backend_ = ResolveBackend(options_.backend);
  JoinOrShareTheJob();
  // An MPI launcher gives ranks through MPI rather than the environment.
  env_ = group_->environment();
  const int gpu = group_->communicator().device_index();
  if (gpu >= 0) device_ = torch::Device(torch::kCUDA, gpu);

  state_->num_processes = num_processes();
  state_->split_batches = options_.split_batches;
  state_->gradients.set_accumulation_steps(
      options_.gradient_accumulation_steps);
  state_->gradients.set_sync_with_dataloader(options_.sync_with_dataloader);
  if (options_.mixed_precision == "fp16") {
    state_->scaler = std::make_shared<GradScaler>(options_.scaler);
    // An overflow on any rank skips the step on every rank.
    state_->scaler->set_agreement([this](bool found_inf) {
      int32_t flag = found_inf ? 1 : 0;
      communicator().allreduce(&flag, 1, DType::kInt32, ReduceOp::kMax,
                               At(CallSite::Here(), "optimizer.step"));
      return flag != 0;
    });
    contents_.scaler = state_->scaler;
    if (!device_.is_cuda() && is_main_process()) {
      ACCEL_LOG(INFO) << "LibTorch 1.13 has no float16 autocast on the CPU: "
                         "with --mixed_precision=fp16 the model computes in "
                         "float32 and only the loss scaling runs (bf16 "
                         "autocasts on the CPU)";
    }
  }
  ClaimProjectDir();
  contents_.run_id = AgreeOnRunId();
  if (options_.seed) set_seed(*options_.seed);
  // Numbering continues after earlier runs' checkpoints. No rank can save
  // before every rank got here (saving follows collectives), so all agree.
  if (!options_.project_dir.empty()) {
    const std::vector<int64_t> indices =
        CheckpointIndices(options_.project_dir);
    if (!indices.empty() && indices.back() == kMaxCheckpointNumber) {
      throw CheckpointError(
          "'" + CheckpointFolder(options_.project_dir, indices.back()) +
          "' has the last number accel's checkpoint numbering has: no "
          "checkpoint can follow it; rename or remove it");
    }
    if (!indices.empty()) next_checkpoint_ = indices.back() + 1;
  }
}

void Accelerator::JoinOrShareTheJob() {
  SharedJob& job = Job();
  std::lock_guard<std::mutex> lock(job.mutex);
  if (job.left) {
    throw UsageError(
        "an Accelerator was made after end_training(): this process has "
        "left the job; make every Accelerator before it ends the training");
  }
  instance_ = job.instances++;
  group_ = job.group.lock();
  if (group_ != nullptr) {
    if (backend_ != job.backend) {
      throw UsageError("this process is in the job with backend '" +
                       job.backend + "'; another Accelerator cannot use '" +
                       backend_ + "' (accel keeps one job per process)");
    }
    return;
  }
  ProcessGroupOptions group_options;
  group_options.backend = backend_;
  group_options.communicator.timeout = options_.timeout;
  group_options.rendezvous_timeout = options_.rendezvous_timeout;
  group_options.network_timeout = options_.network_timeout;
  group_options.communicator.check_collectives = options_.check_collectives;
  group_ = ProcessGroup::Join(env_, group_options);
  job.group = group_;
  job.backend = backend_;
  if (job.parked == nullptr) {
    static const bool kReleasedAtExit = (std::atexit(ReleaseParkedGroup), true);
    (void)kReleasedAtExit;
  }
  job.parked = group_;
}

void Accelerator::LeaveTheJob() {
  SharedJob& job = Job();
  std::shared_ptr<ProcessGroup> last;
  {
    std::lock_guard<std::mutex> lock(job.mutex);
    job.left = true;
    last = std::move(job.parked);
  }
  synchronizers_.clear();
  group_.reset();
}

std::string Accelerator::FromMainProcess(const std::string& name,
                                         const std::string& value) {
  // Through the store, not a collective: collective numbers stay those of
  // the program's own calls. The Accelerator's number in this process keeps
  // a second one's values apart from the first's.
  if (num_processes() == 1) return value;
  const std::string key = "accelerator/" + name + "/" +
                          std::to_string(env_.restart_count) + "/" +
                          std::to_string(instance_);
  if (is_main_process()) {
    group_->store().set(key, value);
    return value;
  }
  return group_->store().get(key, options_.rendezvous_timeout);
}

std::string Accelerator::AgreeOnRunId() {
  std::string id;
  if (is_main_process()) {
    std::random_device random;
    char text[17];
    std::snprintf(text, sizeof(text), "%08x%08x", random(), random());
    id = text;
  }
  return FromMainProcess("run_id", id);
}

void Accelerator::ClaimProjectDir() {
  if (options_.project_dir.empty()) return;
  // Rank 0 claims it for the job (the folder is shared by the job's
  // machines); every rank gets the verdict, so none trains on alone.
  std::string refusal;
  if (is_main_process()) {
    std::string holder;
    project_lock_ = FolderLock::TryAcquire(options_.project_dir, &holder);
    const std::string me = "pid " + std::to_string(getpid()) + " ";
    if (project_lock_ == nullptr && holder.rfind(me, 0) == 0) {
      refusal = "project_dir '" + options_.project_dir +
                "' is in use by another Accelerator of this process: two "
                "would interleave their checkpoints; give each its own "
                "project_dir";
    } else if (project_lock_ == nullptr) {
      refusal = "project_dir '" + options_.project_dir +
                "' is in use by another job (" + holder +
                "): two jobs in one folder would interleave their "
                "checkpoints. Let it finish or stop it, or give this job "
                "another folder";
    } else if (!project_lock_->unlocked_reason().empty()) {
      ACCEL_LOG(WARNING) << project_lock_->unlocked_reason()
                         << ": nothing keeps another job from writing "
                            "checkpoints into the same project_dir";
    }
  }
  refusal = FromMainProcess("project_dir_refusal", refusal);
  if (!refusal.empty()) throw UsageError(refusal);
}

Accelerator::~Accelerator() {
  // Without end_training, finish the trackers all the same (nothing logged
  // is lost either way: trackers write through). While an exception unwinds
  // they are only closed, so TensorBoard does not mark the run successful.
  if (!trackers_finished_ && std::uncaught_exceptions() == 0) {
    for (const auto& tracker : trackers_) {
      try {
        tracker->finish();
      } catch (const std::exception& e) {
        ACCEL_LOG(WARNING) << "tracker '" << tracker->name()
                           << "' did not finish: " << e.what();
      }
    }
  }
  synchronizers_.clear();
  // Leaving because of an error: at once, so that the others learn why.
  // Otherwise the group stays for the next Accelerator, or until exit.
  if (std::uncaught_exceptions() > 0) {
    LeaveTheJob();
  } else {
    group_.reset();
  }
}

Communicator& Accelerator::communicator() {
  if (group_ == nullptr) {
    throw UsageError(
        "a collective was called after end_training(); the process has left "
        "the job");
  }
  return group_->communicator();
}

DistributedType Accelerator::distributed_type() const {
  if (num_processes() == 1) return DistributedType::kNo;
  return device_.is_cuda() ? DistributedType::kMultiGpu
                           : DistributedType::kMultiCpu;
}

void Accelerator::PrepareModule(
    const std::shared_ptr<torch::nn::Module>& module) {
  if (module == nullptr) throw UsageError("prepare: the model is null");
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
  synchronizers_.emplace_back(module.get(),
                              std::make_unique<GradientSynchronizer>(
                                  communicator(), module->parameters(),
                                  options_.gradient_sync, module->buffers()));
}

std::shared_ptr<PreparedOptimizer> Accelerator::PrepareOptimizer(
    torch::optim::Optimizer& optimizer) {
  auto prepared = std::make_shared<PreparedOptimizer>();
  prepared->optimizer = &optimizer;
  state_->optimizers.push_back(prepared);
  contents_.optimizers.push_back(&optimizer);
  return prepared;
}

void Accelerator::PrepareLoader(std::shared_ptr<DataLoaderState> state,
                                bool split_batches) {
  contents_.loaders.push_back(std::move(state));
  if (split_batches) state_->split_batches = true;
}

GradientSynchronizer* Accelerator::SynchronizerOf(
    const torch::nn::Module* model, const char* operation) {
  for (auto& [module, synchronizer] : synchronizers_) {
    if (module == model) return synchronizer.get();
  }
  for (const auto& module : contents_.models) {
    if (module.get() == model) return nullptr;  // One process: nothing to do.
  }
  throw UsageError(std::string(operation) +
                   ": the model was not prepared by this Accelerator; pass "
                   "the model that prepare() returned");
}

void Accelerator::backward(const torch::Tensor& loss, CallSite site) {
  torch::Tensor scaled = loss;
  const int steps = gradient_accumulation_steps();
  if (steps > 1) scaled = scaled / steps;
  if (state_->scaler != nullptr) scaled = state_->scaler->scale(scaled);
  for (auto& entry : synchronizers_) {
    entry.second->set_call_site(site);
    entry.second->begin_backward();
  }
  scaled.backward();
  for (auto& entry : synchronizers_) entry.second->finish();
  ++contents_.step;
}

void Accelerator::set_gradient_accumulation_steps(int steps) {
  if (steps < 1) {
    throw UsageError("gradient_accumulation_steps must be at least 1, found " +
                     std::to_string(steps));
  }
  options_.gradient_accumulation_steps = steps;
  state_->gradients.set_accumulation_steps(steps);
}

AutocastScope Accelerator::autocast() const {
  std::optional<c10::ScalarType> dtype;
  if (options_.mixed_precision == "bf16") {
    dtype = c10::ScalarType::BFloat16;
  } else if (options_.mixed_precision == "fp16" && device_.is_cuda()) {
    dtype = c10::ScalarType::Half;
  }
  return AutocastScope(device_.type(), dtype);
}

void Accelerator::unscale_gradients() {
  GradScaler* scaler = state_->scaler.get();
  if (scaler == nullptr || !scaler->is_enabled()) return;
  if (!sync_gradients()) {
    throw UsageError(
        "unscale_gradients / clip_grad_norm_ under fp16 on a micro-step that "
        "does not sync gradients would unscale gradients that are still "
        "accumulating; clip inside `if (accelerator.sync_gradients())`");
  }
  for (const auto& prepared : state_->optimizers) {
    scaler->unscale_(*prepared->optimizer);
  }
}

double Accelerator::clip_grad_norm_(
    const std::vector<torch::Tensor>& parameters, double max_norm,
    double norm_type) {
  unscale_gradients();
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
}

void Accelerator::clip_grad_value_(const std::vector<torch::Tensor>& parameters,
                                   double clip_value) {
  unscale_gradients();
  torch::nn::utils::clip_grad_value_(parameters, clip_value);
}

bool Accelerator::optimizer_step_was_skipped() const {
  for (const auto& prepared : state_->optimizers) {
    if (prepared->step_was_skipped) return true;
  }
  return false;
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

torch::Tensor Accelerator::DropDuplicates(const torch::Tensor& gathered) const {
  const GradientState& gradients = state_->gradients;
  if (!gradients.end_of_dataloader() || gradients.remainder() <= 0 ||
      gathered.dim() == 0 || gathered.size(0) <= gradients.remainder()) {
    return gathered;
  }
  return gathered.narrow(0, 0, gradients.remainder());
}

torch::Tensor Accelerator::gather_for_metrics(const torch::Tensor& tensor,
                                              CallSite site) {
  return DropDuplicates(
      Gather(communicator(), tensor, At(site, "gather_for_metrics")));
}

std::vector<torch::Tensor> Accelerator::gather_for_metrics(
    const std::vector<torch::Tensor>& tensors, CallSite site) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return gather_for_metrics(t, site);
  });
}

std::map<std::string, torch::Tensor> Accelerator::gather_for_metrics(
    const std::map<std::string, torch::Tensor>& tensors, CallSite site) {
  return MapTensors(tensors, [&](const torch::Tensor& t) {
    return gather_for_metrics(t, site);
  });
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

bool Accelerator::check_preemption(CallSite site) {
  StartHandlingPreemption();
  if (preemption_signal_ != 0) return true;
  // The signal and, below it, which rank got it: the maximum is the
  // highest signal, at the lowest rank that got it.
  constexpr int64_t kRanks = int64_t{1} << 32;
  const int signal_number = PendingPreemptionSignal();
  int64_t seen = signal_number == 0
                     ? 0
                     : signal_number * kRanks + (kRanks - 1 - process_index());
  if (num_processes() > 1) {
    communicator().allreduce(&seen, 1, DType::kInt64, ReduceOp::kMax,
                             At(site, "check_preemption"));
  }
  if (seen == 0) return false;
  preemption_signal_ = static_cast<int>(seen / kRanks);
  const int64_t rank = kRanks - 1 - seen % kRanks;
  if (is_main_process()) {
    ACCEL_LOG(WARNING) << (num_processes() > 1
                               ? "rank " + std::to_string(rank) + " got "
                               : std::string("got "))
                       << SignalName(preemption_signal_)
                       << ": every rank stops at this step (" << site.ToString()
                       << ")";
  }
  return true;
}

bool Accelerator::check_trigger(CallSite site) {
  int32_t flag = trigger_ ? 1 : 0;
  communicator().allreduce(&flag, 1, DType::kInt32, ReduceOp::kMax,
                           At(site, "check_trigger"));
  trigger_ = false;
  return flag != 0;
}

ProcessOrderScope Accelerator::main_process_first(CallSite site) {
  return ProcessOrderScope(is_main_process(), [this, site] {
    communicator().barrier(At(site, "main_process_first"));
  });
}

ProcessOrderScope Accelerator::local_main_process_first(CallSite site) {
  return ProcessOrderScope(is_local_main_process(), [this, site] {
    communicator().barrier(At(site, "local_main_process_first"));
  });
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  if (device_specific) seed += static_cast<uint64_t>(process_index());
  torch::manual_seed(seed);  // CPU and, when there are GPUs, every GPU.
}

void Accelerator::save_state(const std::string& dir) {
  TraceStartup("save_begin");
  for (const StateHook& hook : save_hooks_) hook(contents_.models, dir);
  SaveCheckpoint(dir, process_index(), num_processes(), is_main_process(),
                 contents_);
  TraceStartup("save_end");
}

std::string Accelerator::save_state(CallSite site) {
  if (options_.project_dir.empty()) {
    throw UsageError(
        "save_state() without a folder needs AcceleratorOptions::project_dir "
        "(automatic checkpoint naming)");
  }
  const std::string dir =
      CheckpointFolder(options_.project_dir, next_checkpoint_++);
  save_state(dir);
  if (!checked_shared_folder_ && env_.local_world_size < num_processes()) {
    // Across machines, automatic naming (pruning, resuming) needs one folder
    // that every machine sees: find out at the first save, not at a resume.
    checked_shared_folder_ = true;
    wait_for_everyone(site);
    const std::string marker = dir + "/" + kStateFile;
    std::vector<std::string> blind = gather_object(
        std::vector<std::string>{IsFile(marker) ? "" : "x"}, site);
    std::string ranks;
    for (size_t r = 0; r < blind.size(); ++r) {
      if (!blind[r].empty())
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!ranks.empty()) {
      throw CheckpointError(
          "save_state: rank(s) " + ranks + " do not see '" + marker +
          "', which rank 0 wrote: '" + options_.project_dir +
          "' is not on a disk that every machine shares. Automatic "
          "checkpoint naming and resuming need a shared project_dir");
    }
  }
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
  // Alone, loading checks the same and says more about what it found.
  const std::string why = num_processes() > 1
                              ? CheckpointProblems(dir, CallSite::Here())
                              : std::string();
  if (!why.empty()) {
    throw CheckpointError("cannot load checkpoint '" + dir + "': " + why);
  }
  LoadChecked(dir);
}

std::string Accelerator::CheckpointProblems(const std::string& dir,
                                            CallSite site) {
  std::vector<std::string> problems = {
      CheckCheckpoint(dir, process_index(), num_processes())};
  if (num_processes() > 1) problems = gather_object(problems, site);
  std::string why;
  for (size_t r = 0; r < problems.size(); ++r) {
    if (problems[r].empty()) continue;
    why += (why.empty() ? "" : "; ") + std::string("rank ") +
           std::to_string(r) + ": " + problems[r];
  }
  return why;
}

void Accelerator::LoadChecked(const std::string& dir) {
  for (const StateHook& hook : load_hooks_) hook(contents_.models, dir);
  LoadCheckpoint(dir, process_index(), num_processes(), contents_);
}

std::string Accelerator::load_state(CallSite site) {
  if (options_.project_dir.empty()) {
    throw UsageError(
        "load_state() without a folder needs AcceleratorOptions::project_dir "
        "(automatic checkpoint naming)");
  }
  // Rank 0's list decides, so that every rank tries the same folders. A
  // save that never finished (killed before its last file) left no
  // checkpoint: it is passed over, and with nothing else the run starts
  // afresh.
  std::vector<std::string> candidates;
  if (is_main_process()) {
    const std::vector<int64_t> indices =
        CheckpointIndices(options_.project_dir);
    for (auto it = indices.rbegin(); it != indices.rend(); ++it) {
      const std::string dir = CheckpointFolder(options_.project_dir, *it);
      if (IsCompleteCheckpoint(dir)) {
        candidates.push_back(dir);
      } else {
        ACCEL_LOG(INFO) << "skipped checkpoint " << dir
                        << " (incomplete: its save did not finish)";
      }
    }
  }
  if (num_processes() > 1) broadcast_object_list(candidates, 0, site);
  std::vector<std::string> skipped;
  bool unshared = false;
  for (const std::string& dir : candidates) {
    const std::string why = CheckpointProblems(dir, site);
    // Rank 0 has its files and another rank lacks one.
    unshared |= !why.empty() && why.rfind("rank 0:", 0) != 0 &&
                why.find("is missing") != std::string::npos;
    if (why.empty()) {
      if (is_main_process()) {
        for (const std::string& note : skipped) {
          ACCEL_LOG(INFO) << "skipped checkpoint " << note;
        }
      }
      LoadChecked(dir);
      return dir;
    }
    skipped.push_back(dir + " (" + why + ")");
  }
  if (candidates.empty()) return "";
  std::string message = "no checkpoint in '" + options_.project_dir +
                        "/checkpoints' that every rank can load: ";
  for (size_t i = 0; i < skipped.size(); ++i) {
    message += (i ? ", " : "") + skipped[i];
  }
  if (unshared) {
    message += ". Rank 0 has files that other ranks lack: is '" +
               options_.project_dir + "' on a disk that every machine shares?";
  }
  throw CheckpointError(message);
}

std::map<std::string, torch::Tensor> Accelerator::StateDictOf(
    const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    state[item.key()] = item.value().detach().cpu();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    state[item.key()] = item.value().detach().cpu();
  }
  return state;
}

const std::string& Accelerator::logging_dir() const {
  return options_.logging_dir.empty() ? options_.project_dir
                                      : options_.logging_dir;
}

void Accelerator::init_trackers(const std::string& project_name,
                                const TrackerValues& config) {
  if (trackers_started_ || trackers_finished_) {
    throw UsageError(trackers_started_
                         ? "init_trackers was called twice; call it once, "
                           "before the first log()"
                         : "init_trackers after end_training()");
  }
  if (project_name.empty()) {
    throw UsageError(
        "init_trackers: the project name is empty; it names the run's "
        "folder, <logging_dir>/<project_name>");
  }
  trackers_started_ = true;
  if (!is_main_process()) return;
  const TrackerContext context{project_name, logging_dir()};
  for (const std::string& name : tracker_names_) {
    trackers_.push_back(CreateTracker(name, context));
  }
  if (config.empty()) return;  // Accelerate: only when a config is given.
  for (const auto& tracker : trackers_) {
    tracker->store_init_configuration(config);
  }
}

void Accelerator::log(const TrackerValues& values,
                      std::optional<int64_t> step) {
  if (!trackers_started_) {
    throw UsageError(
        "log() before init_trackers(): call "
        "accelerator.init_trackers(project_name, config) once first");
  }
  if (trackers_finished_) throw UsageError("log() after end_training()");
  for (const auto& entry : values) {
    if (entry.first.empty()) throw UsageError("log(): a value has no name");
  }
  const int64_t at = step.value_or(next_log_step_);
  next_log_step_ = at + 1;
  for (const auto& tracker : trackers_) tracker->log(values, at);
}

Tracker& Accelerator::get_tracker(const std::string& name) {
  if (!is_main_process()) return BlankTracker();
  std::string started;
  for (const auto& tracker : trackers_) {
    if (tracker->name() == name) return *tracker;
    started += (started.empty() ? "" : ", ") + tracker->name();
  }
  throw UsageError(
      "get_tracker: '" + name +
      "' is not an available tracker stored inside the Accelerator; "
      "started trackers: " +
      (started.empty() ? "(none)" : started) +
      (trackers_started_ ? "" : " (init_trackers has not been called)"));
}

void Accelerator::end_training(CallSite site) {
  // Trackers first, as in Accelerate; a tracker's error (a full disk) still
  // lets this rank leave the job with the others, then propagates.
  std::exception_ptr tracker_error;
  if (!trackers_finished_) {
    trackers_finished_ = true;
    for (const auto& tracker : trackers_) {
      try {
        tracker->finish();
      } catch (...) {
        if (!tracker_error) tracker_error = std::current_exception();
      }
    }
  }
  if (group_ != nullptr) {
    wait_for_everyone(site);
    LeaveTheJob();
  }
  if (tracker_error) std::rethrow_exception(tracker_error);
}

void Accelerator::free_memory() {
  synchronizers_.clear();
  save_hooks_.clear();
  load_hooks_.clear();
  const int64_t step = contents_.step;
  const std::string run_id = contents_.run_id;
  contents_ = CheckpointContents{};
  contents_.scaler = state_->scaler;
  contents_.step = step;
  contents_.run_id = run_id;
  state_->optimizers.clear();
  state_->split_batches = options_.split_batches;
}

}  // namespace accel
