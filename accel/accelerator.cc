#include "accel/accelerator.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <random>

#include "accel/checkpoint/checkpoint_manager.h"
#include "accel/core/tensor_ops.h"
#include "accel/parallel/invariant_reduction.h"
#include "accel/parallel/zero.h"
#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/host_memory.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/process_setup.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/comm/registry.h"
#include "accel/runtime/launch/program.h"
#include "accel/tracking/tracker_set.h"

namespace accel {
namespace {

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
    case DistributedType::kFsdp:
      return "FSDP";
    case DistributedType::kDeepSpeed:
      return "DEEPSPEED";
  }
  return "UNKNOWN";
}

Accelerator::Accelerator(AcceleratorOptions options)
    : env_((PrepareProcess(), DistributedEnvironment::FromProcess())),
      options_(std::move(options)),
      state_(std::make_shared<TrainingState>()) {
  InstallTerminateHandler();
  InstallPreemptionHandlers();
  options_.ApplyKwargsHandlers();
  options_.AdoptGivenFlags(env_.rank == 0);
  options_.Validate();
  precision_ = ParseMixedPrecision(options_.mixed_precision);
  // Outside the log statement, whose stream runs only at --v=1.
  const std::string host_memory =
      options_.reuse_host_memory
          ? ReuseFreedHostMemory()
          : "malloc left as it is (--reuse_host_memory=false)";
  ACCEL_VLOG(1) << "host memory: " << host_memory;
  if (!options_.fsdp_layer_to_wrap.empty() && options_.zero_stage != 3 &&
      env_.rank == 0) {
    ACCEL_LOG(WARNING) << "fsdp_transformer_layer_cls_to_wrap '"
                       << options_.fsdp_layer_to_wrap
                       << "' is ignored: units exist only under zero_stage 3 "
                          "(this job runs zero_stage "
                       << options_.zero_stage << ")";
  }
  const GradientSyncOptions& sync = options_.gradient_sync;
  if (options_.zero_stage >= 2 && env_.rank == 0 &&
      (sync.find_unused_parameters || sync.static_graph ||
       !sync.gradient_as_bucket_view ||
       sync.comm_hook != DDPCommunicationHookType::kNo)) {
    ACCEL_LOG(WARNING)
        << "DistributedDataParallelKwargs' find_unused_parameters, "
           "static_graph, gradient_as_bucket_view and comm_hook apply to "
           "DDP's "
           "reduction (zero_stage 0 and 1); zero_stage "
        << options_.zero_stage
        << " reduces each gradient into its shard, and a parameter no "
           "rank used gets a zero gradient there";
  }
  // Before joining, every rank alike: a bad --report_to, or an unusable
  // folder, fails at once rather than some ranks finding only that rank 0
  // left.
  trackers_ = std::make_unique<TrackerSet>(options_.log_with, logging_dir());
  CheckpointManager::CheckProjectDir(options_.project_dir, env_.world_size);
  if (trackers_->writes_files()) {
    CheckWritableFolder(logging_dir(), "logging_dir");
  }
  backend_ = ResolveBackend(options_.backend, options_.cpu);
  JoinOrShareTheJob();
  // An MPI launcher gives ranks through MPI rather than the environment.
  env_ = group_->environment();
  const int gpu = group_->communicator().device_index();
  if (gpu >= 0 && !options_.cpu) device_ = torch::Device(torch::kCUDA, gpu);

  if (options_.mixed_precision_policy.param_dtype == c10::ScalarType::Half &&
      !device_.is_cuda()) {
    throw UsageError(
        "mixed_precision_policy.param_dtype float16 on the CPU: LibTorch's "
        "CPU autocast has no float16, so layers fed float32 inputs would "
        "fail; use bfloat16 there");
  }
  state_->num_processes = num_processes();
  MakeDeviceMesh();
  state_->split_batches = options_.dataloader_config.split_batches;
  state_->agree_metric = [this](double metric) {
    return AgreeOnMetric(metric);
  };
  state_->gradients.set_accumulation_steps(
      options_.gradient_accumulation_steps);
  state_->gradients.set_sync_with_dataloader(options_.sync_with_dataloader);
  if (precision_ == MixedPrecision::kFp16) MakeLossScaler();
  if (options_.gradient_clipping > 0) ClipBeforeEachStep();
  SetUpInvariantMicroBatches();
  MakeCheckpointManager();
  run_id_ = AgreeOnRunId();
  if (options_.seed) set_seed(*options_.seed);
}

void Accelerator::MakeLossScaler() {
  state_->scaler = std::make_shared<GradScaler>(options_.scaler);
  // An overflow on any rank skips the step on every rank.
  state_->scaler->set_agreement([this](bool found_inf) {
    int32_t flag = found_inf ? 1 : 0;
    AllreduceHostValues(communicator(), &flag, 1, torch::kInt32, ReduceOp::kMax,
                        At(CallSite::Here(), "optimizer.step"));
    return flag != 0;
  });
  if (!device_.is_cuda() && is_main_process()) {
    // LibTorch 1.13 has no float16 autocast on the CPU; accel keeps 2.x to
    // the same behaviour, so that results do not depend on the version.
    ACCEL_LOG(WARNING) << "on the CPU, --mixed_precision=fp16 computes in "
                          "float32 and only the loss scaling runs (LibTorch "
                          "1.13 has no float16 autocast there); "
                          "--mixed_precision=bf16 autocasts on the CPU";
  }
}

void Accelerator::ClipBeforeEachStep() {
  state_->clip_before_step = [this](PreparedOptimizer& prepared,
                                    CallSite site) {
    GradScaler* scaler = state_->scaler.get();
    if (scaler != nullptr && scaler->is_enabled() &&
        !scaler->unscaled(*prepared.optimizer)) {
      scaler->unscale_(*prepared.optimizer);
    }
    const double max_norm = options_.gradient_clipping;
    if (prepared.zero != nullptr) {
      ClipGradNormAcrossShards(ShardGroup(), {prepared.zero.get()},
                               prepared.zero->parameters(), max_norm, 2.0, site,
                               TensorParallelOf());
      return;
    }
    std::vector<torch::Tensor> parameters;
    for (const auto& group : prepared.optimizer->param_groups()) {
      for (const torch::Tensor& p : group.params()) parameters.push_back(p);
    }
    ClipGradNorm(parameters, max_norm, 2.0, TensorParallelOf(), site);
  };
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
  DetachFromTheGroup();
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

double Accelerator::AgreeOnMetric(double metric) {
  if (num_processes() == 1) return metric;
  std::vector<double> metrics(static_cast<size_t>(num_processes()));
  CollectiveOptions options;
  options.api = "ReduceLROnPlateau step(metric)";
  communicator().allgather(&metric, metrics.data(), 1, DType::kFloat64,
                           options);
  const bool same =
      std::all_of(metrics.begin(), metrics.end(), [&](double value) {
        return value == metrics.front() ||
               (std::isnan(value) && std::isnan(metrics.front()));
      });
  if (same) return metrics.front();
  double sum = 0;
  for (double value : metrics) sum += value;
  return sum / static_cast<double>(metrics.size());
}

Accelerator::~Accelerator() {
  EndThreadAutocast();
  // The trackers finish (see TrackerSet) before the job is left.
  trackers_.reset();
  // Prepared optimizers and schedulers may outlive the Accelerator; models'
  // gradient sync and a plateau scheduler's agreement may not outlive the
  // job.
  state_->prepared.DropSynchronizers();
  state_->agree_metric = nullptr;
  state_->clip_before_step = nullptr;
  // Leaving because of an error: at once, so that the others learn of it;
  // or, when RunAndReportErrors will print the error, once it did (the
  // parked group goes at exit; its fatal hook tells the others why), so
  // that this rank's error is the first a user sees. Otherwise the group
  // stays for the next Accelerator, or until exit.
  if (std::uncaught_exceptions() > 0 && !ReportingScope::Active()) {
    LeaveTheJob();
  } else if (std::uncaught_exceptions() > 0) {
    ParkForTheReport();
  } else {
    group_.reset();
  }
}

void Accelerator::DetachFromTheGroup() {
  state_->prepared.DropSynchronizers();
  // ZeRO keeps the communicator for its gathers: a later one is an error
  // saying the process left, not a call into a freed communicator.
  for (ZeroOptimizer* zero : state_->prepared.sharded_optimizers()) {
    zero->LeaveJob();
  }
  state_->mesh.reset();
  group_.reset();
}

void Accelerator::ParkForTheReport() {
  {
    std::lock_guard<std::mutex> lock(Job().mutex);
    Job().left = true;  // No Accelerator joins a job this rank is leaving.
  }
  DetachFromTheGroup();
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
  // As Accelerate names a run under its DeepSpeed or FSDP plugin (it
  // printed MULTI_CPU under stage 3).
  if (options_.zero_stage > 0) {
    return options_.use_fsdp ? DistributedType::kFsdp
                             : DistributedType::kDeepSpeed;
  }
  if (num_processes() == 1) return DistributedType::kNo;
  return device_.is_cuda() ? DistributedType::kMultiGpu
                           : DistributedType::kMultiCpu;
}

void Accelerator::backward(const torch::Tensor& loss, CallSite site) {
  const AutocastPause full_precision;
  torch::Tensor scaled = loss;
  const int steps = gradient_accumulation_steps();
  if (steps > 1) scaled = scaled / steps;
  if (state_->scaler != nullptr) scaled = state_->scaler->scale(scaled);
  const std::vector<GradientReducer*> synchronizers =
      state_->prepared.synchronizers();
  for (const auto& model : state_->prepared.models()) {
    const auto& units = state_->prepared.UnitsOf(model.get());
    if (!units.empty() && !IsAttached(units.front())) {
      throw UsageError(
          "backward: under ZeRO stage 3 a model is sharded by its optimizer, "
          "but this model was prepared without one (or its optimizer is "
          "gone); prepare them together: prepare(model, optimizer)");
    }
  }
  if (joining_ &&
      std::any_of(synchronizers.begin(), synchronizers.end(),
                  [](GradientReducer* s) { return s->enabled(); })) {
    CountRanksTraining(true);  // join_uneven_inputs: this rank trains.
  }
  for (GradientReducer* synchronizer : synchronizers) {
    synchronizer->set_call_site(site);
    synchronizer->set_deferred(joining_);
    synchronizer->begin_backward();
  }
  scaled.backward();
  for (GradientReducer* synchronizer : synchronizers) {
    synchronizer->finish();
  }
  // Under ZeRO, clip_grad_norm_ and the scaler see the pieces' gradients.
  for (ZeroOptimizer* zero : state_->prepared.sharded_optimizers()) {
    zero->AttachGradients();
  }
  // Under invariant_micro_batches a step's micro-batches count once, so
  // that the count is the same at any process count.
  if (std::none_of(synchronizers.begin(), synchronizers.end(),
                   [](GradientReducer* s) { return s->mid_step(); })) {
    ++step_;
  }
}

void Accelerator::set_gradient_accumulation_steps(int steps) {
  if (steps < 1) {
    throw UsageError("gradient_accumulation_steps must be at least 1, found " +
                     std::to_string(steps));
  }
  if (steps != 1 && options_.invariant_micro_batches != 0) {
    throw UsageError(
        "gradient_accumulation_steps " + std::to_string(steps) +
        " does not combine with invariant_micro_batches: its micro-batches "
        "are the accumulation");
  }
  options_.gradient_accumulation_steps = steps;
  state_->gradients.set_accumulation_steps(steps);
}

AutocastScope Accelerator::autocast() const {
  return autocast(options_.autocast);
}

std::optional<c10::ScalarType> Accelerator::AutocastDtype() const {
  const auto& param_dtype = options_.mixed_precision_policy.param_dtype;
  if (param_dtype && *param_dtype != c10::ScalarType::Float &&
      *param_dtype != c10::ScalarType::Double) {
    return param_dtype;
  }
  if (precision_ == MixedPrecision::kBf16) return c10::ScalarType::BFloat16;
  if (precision_ == MixedPrecision::kFp16 && device_.is_cuda()) {
    return c10::ScalarType::Half;
  }
  return std::nullopt;
}

MixedPrecisionPolicy Accelerator::PrecisionPolicy() const {
  MixedPrecisionPolicy policy = options_.mixed_precision_policy;
  const bool sharded = options_.zero_stage > 0 && num_processes() > 1;
  if (sharded && !policy.param_dtype && precision_ != MixedPrecision::kNo) {
    policy.param_dtype = AutocastDtype();  // None for fp16 on a CPU.
  }
  if (sharded && !policy.reduce_dtype) policy.reduce_dtype = policy.param_dtype;
  return policy;
}

AutocastScope Accelerator::autocast(const AutocastKwargs& handler) const {
  // Accelerate's AutocastKwargs(enabled=False): full precision here, even
  // under the prepared model's autocast.
  if (!handler.enabled) return AutocastScope::Off(device_.type());
  return AutocastScope(device_.type(), AutocastDtype(), handler.cache_enabled);
}

void Accelerator::AutocastThisThread() {
  if (model_autocast_ != nullptr || !options_.autocast.enabled) return;
  const std::optional<c10::ScalarType> dtype = AutocastDtype();
  if (!dtype) return;
  model_autocast_ = std::make_unique<ThreadAutocast>(device_.type(), *dtype);
  if (is_main_process()) {
    ACCEL_LOG(INFO) << "mixed precision " << options_.mixed_precision
                    << ": autocast is on for the thread that prepared the "
                       "model, as Accelerate's prepare() wraps forward; "
                       "accel's backward, optimizer step and clipping run "
                       "in float32 (see accel/optim/autocast.h)";
  }
}

void Accelerator::EndThreadAutocast() { model_autocast_.reset(); }

void Accelerator::unscale_gradients() {
  const AutocastPause full_precision;
  CheckStepsComplete("unscale_gradients");
  GradScaler* scaler = state_->scaler.get();
  if (scaler == nullptr || !scaler->is_enabled()) return;
  if (!sync_gradients()) {
    throw UsageError(
        "unscale_gradients / clip_grad_norm_ under fp16 on a micro-step that "
        "does not sync gradients would unscale gradients that are still "
        "accumulating; clip inside `if (accelerator.sync_gradients())`");
  }
  for (const auto& prepared : state_->prepared.optimizers()) {
    scaler->unscale_(*prepared->optimizer);
  }
}

double Accelerator::clip_grad_norm_(
    const std::vector<torch::Tensor>& parameters, double max_norm,
    double norm_type, CallSite site) {
  const AutocastPause full_precision;
  CheckStepsComplete("clip_grad_norm_");
  unscale_gradients();
  const std::vector<ZeroOptimizer*> sharded =
      state_->prepared.sharded_optimizers();
  if (!sharded.empty()) {
    return ClipGradNormAcrossShards(ShardGroup(), sharded, parameters, max_norm,
                                    norm_type, site, TensorParallelOf());
  }
  return ClipGradNorm(parameters, max_norm, norm_type, TensorParallelOf(),
                      site);
}

void Accelerator::clip_grad_value_(const std::vector<torch::Tensor>& parameters,
                                   double clip_value) {
  const AutocastPause full_precision;
  CheckStepsComplete("clip_grad_value_");
  unscale_gradients();
  const std::vector<ZeroOptimizer*> sharded =
      state_->prepared.sharded_optimizers();
  if (sharded.empty()) {
    torch::nn::utils::clip_grad_value_(parameters, clip_value);
    return;
  }
  torch::NoGradGuard no_grad;
  for (torch::Tensor& grad : GradientsToClip(sharded, parameters)) {
    grad.clamp_(-clip_value, clip_value);
  }
}

bool Accelerator::optimizer_step_was_skipped() const {
  return state_->prepared.any_step_skipped();
}

ZeroOptimizer* Accelerator::ParameterShardingOf(
    const torch::nn::Module& model) const {
  for (ZeroOptimizer* zero : state_->prepared.sharded_optimizers()) {
    // Stage 3's units, or master shards under mixed precision.
    if (zero->stage() != 3 && !zero->mixed_precision()) continue;
    for (const torch::Tensor& p : model.parameters()) {
      for (const torch::Tensor& sharded : zero->parameters()) {
        if (sharded.is_same(p)) return zero;
      }
    }
  }
  return nullptr;
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  if (device_specific) seed += static_cast<uint64_t>(process_index());
  torch::manual_seed(seed);  // CPU and, when there are GPUs, every GPU.
}

void Accelerator::end_training(CallSite site) {
  // Trackers first, as in Accelerate; a tracker's error (a full disk) still
  // lets this rank leave the job with the others, then propagates.
  const std::exception_ptr tracker_error = trackers_->Finish();
  EndThreadAutocast();
  if (group_ != nullptr) {
    communicator().barrier(
        At(site, "end_training (waits for every process, then leaves)"));
    LeaveTheJob();
  }
  if (tracker_error) std::rethrow_exception(tracker_error);
}

Accelerator::FreedMemory Accelerator::ForgetPreparedObjects(
    TensorCensus& census) {
  // The models stay the program's: whole again, as before prepare.
  for (ZeroOptimizer* zero : state_->prepared.sharded_optimizers()) {
    zero->ReturnParameters();
  }
  FreedMemory freed;
  for (const auto& model : state_->prepared.models()) {
    census.AddModule(*model);
    ++freed.models;
  }
  // Not their state: a prepared optimizer may be gone by now (the program
  // owns it); the handles given are counted (free_memory).
  freed.optimizers = static_cast<int>(state_->prepared.optimizers().size());
  freed.schedulers = state_->prepared.scheduler_count();
  freed.data_loaders = state_->prepared.loader_count();
  state_->prepared.Clear();
  EndThreadAutocast();
  save_hooks_.clear();
  load_hooks_.clear();
  state_->split_batches = options_.dataloader_config.split_batches;
  return freed;
}

}  // namespace accel
