#include "accel/fault_tolerance.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"
#include "accel/runtime/env/environment.h"

namespace accel {
namespace {

DType FlatDType(const torch::Tensor& flat) {
  if (flat.scalar_type() == torch::kFloat32) return DType::kFloat32;
  if (flat.scalar_type() == torch::kFloat64) return DType::kFloat64;
  throw UsageError(std::string("fault tolerance: parameters of type ") +
                   c10::toString(flat.scalar_type()) +
                   " are not supported (float32 and float64 are)");
}

}  // namespace

torch::Tensor FlatGradients(const std::vector<torch::Tensor>& parameters,
                            int64_t spare) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& p : parameters) {
    parts.push_back(p.grad().defined()
                        ? p.grad().reshape({-1})
                        : torch::zeros({p.numel()}, p.options()));
  }
  if (spare > 0 && !parameters.empty()) {
    parts.push_back(torch::zeros({spare}, parameters.front().options()));
  }
  return torch::cat(parts).contiguous();
}

void SetFlatGradients(const std::vector<torch::Tensor>& parameters,
                      const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const torch::Tensor& p : parameters) {
    const torch::Tensor part = flat.narrow(0, offset, p.numel()).view_as(p);
    if (p.grad().defined()) {
      p.mutable_grad().copy_(part);
    } else {
      p.mutable_grad() = part.clone();
    }
    offset += p.numel();
  }
}

FaultTolerance::FaultTolerance(torch::nn::Module& model,
                               torch::optim::Optimizer& optimizer,
                               const FaultToleranceOptions& options)
    : model_(model), optimizer_(optimizer) {
  const DistributedEnvironment env = DistributedEnvironment::FromProcess();
  ProcessGroupOptions group_options;
  group_options.backend = options.backend;
  try {
    group_ = ProcessGroup::JoinStore(env, group_options);
  } catch (const TimeoutError& e) {
    // Rank 0 hosts the store: a replacement that cannot reach it is not
    // the failure (the launcher must not replace it again).
    throw PeerError(e.what(), 0);
  }
  ft::ReplicaOptions replica;
  replica.backend = options.backend;
  replica.rank = env.rank;
  replica.world_size = env.world_size;
  replica.local_rank = env.local_rank;
  replica.local_size = env.local_world_size;
  replica.store = group_->shared_store();
  replica.host = group_->data_address();
  replica.communicator.timeout = options.timeout;
  replica.save_state = [this] { return SaveState(); };
  replica.load_state = [this](const std::string& bytes) { LoadState(bytes); };
  if (env.rank == 0) {
    ft::LighthouseOptions lighthouse;
    lighthouse.min_replicas = options.min_replicas;
    lighthouse.join_timeout = options.join_timeout;
    lighthouse.heartbeat_timeout = options.heartbeat_timeout;
    replica.lighthouse = lighthouse;
  }
  replica_ = std::make_unique<ft::Replica>(std::move(replica));
  if (!options.log_with.empty()) {
    trackers_ =
        std::make_unique<TrackerSet>(options.log_with, options.logging_dir);
    trackers_->Init("fault_tolerance",
                    {{"world_size", env.world_size},
                     {"min_replicas", options.min_replicas}},
                    env.rank == 0);
  }
}

FaultTolerance::~FaultTolerance() {
  if (trackers_) {
    LogChanges();
    trackers_->Finish();  // An error here has nowhere to go but the log.
  }
  replica_.reset();  // Before the store it uses.
}

void FaultTolerance::LogChanges() {
  if (!trackers_ || rank() != 0) return;
  const std::vector<ft::Change>& changes = replica_->changes();
  // The first quorum is the start, not a change.
  for (size_t i = std::max<size_t>(changes_logged_, 1); i < changes.size();
       ++i) {
    const ft::Change& change = changes[i];
    trackers_->Log(
        {{"ft/replicas", static_cast<int64_t>(change.members.size())},
         {"ft/lost", static_cast<int64_t>(change.lost.size())},
         {"ft/joined", static_cast<int64_t>(change.joined.size())},
         {"ft/recovery_s", change.seconds}},
        change.step);
  }
  changes_logged_ = changes.size();
}

int FaultTolerance::rank() const { return group_->environment().rank; }

int FaultTolerance::world_size() const {
  return group_->environment().world_size;
}

bool FaultTolerance::StartStep() {
  const bool started = replica_->StartStep();
  if (trackers_ && replica_->changes().size() != changes_logged_) LogChanges();
  return started;
}

std::pair<int64_t, int64_t> FaultTolerance::Share(int64_t global_batch) const {
  const int64_t k = replica_->quorum_size();
  const int64_t i = replica_->quorum_index();
  const std::string where = "fault tolerance: rank " + std::to_string(rank()) +
                            ": step " + std::to_string(step()) + ": ";
  if (k <= 0 || i < 0) throw UsageError(where + "Share before StartStep");
  if (global_batch < k) {
    throw UsageError(where + "a global batch of " +
                     std::to_string(global_batch) + " cannot be split among " +
                     std::to_string(k) + " replicas");
  }
  return {i * global_batch / k, (i + 1) * global_batch / k};
}

bool FaultTolerance::Commit() {
  const std::vector<torch::Tensor> parameters = model_.parameters();
  // One spare element at the end, for the replica's own number.
  torch::Tensor flat = FlatGradients(parameters, /*spare=*/1);
  const bool committed = replica_->AllreduceAndCommit(
      {{flat.data_ptr(), static_cast<size_t>(flat.numel()), FlatDType(flat),
        /*spare_last=*/true}});
  if (committed) {
    SetFlatGradients(parameters, flat);
    optimizer_.step();
  }
  optimizer_.zero_grad();
  return committed;
}

std::string FaultTolerance::SaveState() {
  torch::serialize::OutputArchive archive;
  for (const auto& item : model_.named_parameters()) {
    archive.write("model/" + item.key(), item.value());
  }
  for (const auto& item : model_.named_buffers()) {
    archive.write("buffer/" + item.key(), item.value(), /*is_buffer=*/true);
  }
  torch::serialize::OutputArchive optimizer;
  optimizer_.save(optimizer);
  archive.write("optimizer", optimizer);
  // The generator too, as a checkpoint holds it: dropout after a join
  // draws what it would have drawn without the failure.
  archive.write("generator", at::detail::getDefaultCPUGenerator().get_state());
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

void FaultTolerance::LoadState(const std::string& bytes) {
  std::istringstream stream(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  torch::NoGradGuard no_grad;
  for (auto& item : model_.named_parameters()) {
    torch::Tensor value;
    archive.read("model/" + item.key(), value);
    item.value().copy_(value);
  }
  for (auto& item : model_.named_buffers()) {
    torch::Tensor value;
    archive.read("buffer/" + item.key(), value, /*is_buffer=*/true);
    item.value().copy_(value);
  }
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  optimizer_.load(optimizer);
  torch::Tensor generator;
  archive.read("generator", generator);
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(cpu.mutex());
  cpu.set_state(generator);
}

std::string FaultTolerance::Summary() const {
  const ft::Replica& r = *replica_;
  int64_t joined = 0;
  int64_t lost = 0;
  for (const ft::Change& change : r.changes()) {
    joined += static_cast<int64_t>(change.joined.size());
    lost += static_cast<int64_t>(change.lost.size());
  }
  char text[256];
  std::snprintf(text, sizeof(text),
                "fault tolerance: %lld steps here, %lld with fewer than %d "
                "replicas, %lld run again; replicas lost: %lld, joined: %lld",
                static_cast<long long>(r.history().size()),
                static_cast<long long>(r.steps_with_fewer()), world_size(),
                static_cast<long long>(r.steps_retried()),
                static_cast<long long>(lost), static_cast<long long>(joined));
  return text;
}

}  // namespace accel
