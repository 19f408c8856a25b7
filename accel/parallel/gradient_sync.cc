#include "accel/parallel/gradient_sync.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <iterator>
#include <mutex>

#include "accel/core/tensor_ops.h"
#include "accel/parallel/gradient_hooks.h"
#include "accel/runtime/base/errors.h"

namespace accel {

struct GradientSynchronizer::State {
  struct Bucket {
    torch::Tensor flat;  // Gradients of this bucket's parameters, packed.
    // What travels under a compression hook: flat / N in 16 bits.
    torch::Tensor compressed;
    std::unique_ptr<PowerSgdBucket> powersgd;
    std::vector<size_t> members;  // Indices into parameters.
    size_t pending = 0;           // Members whose gradient has not arrived.
    std::shared_ptr<Work> work;
  };
  struct Slot {
    size_t bucket = 0;
    torch::Tensor view;  // The parameter's gradient inside the bucket.
    bool arrived = false;
    bool used = false;  // Its gradient came from backward this step.
    // Whether it had a gradient before finish() put it in its bucket (for
    // find_unused_parameters), and its own gradient tensor when gradients
    // are not bucket views.
    bool had_gradient = false;
    torch::Tensor own_gradient;
  };

  // Buffers of one dtype and device, packed for one broadcast.
  struct BufferGroup {
    std::vector<torch::Tensor> members;
    torch::Tensor flat;
    std::shared_ptr<Work> work;
  };

  Communicator& comm;
  std::vector<torch::Tensor> parameters;  // Those that require a gradient.
  std::vector<BufferGroup> buffer_groups;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::unique_ptr<GradientReadyHooks> hooks;
  std::mutex mutex;
  size_t next_to_launch = 0;
  uint64_t bytes_reduced = 0;
  int64_t synced_steps = 0;  // Steps finish() averaged (PowerSGD's start).
  bool enabled = true;
  bool deferred = false;  // Buckets launch in finish() only.
  bool step_started = false;
  // A gradient that arrived twice after its bucket launched (finish()
  // throws it).
  std::exception_ptr twice;
  CallSite site;
  GradientSyncOptions options;
  // find_unused_parameters: a byte per parameter, 1 where it was used, and
  // (static_graph) whether the first syncing step has agreed it already.
  torch::Tensor used_anywhere;
  std::shared_ptr<Work> used_work;
  bool usage_known = false;

  explicit State(Communicator& c) : comm(c) {}

  void ResetStep() {
    for (auto& slot : slots) slot.arrived = slot.used = false;
    twice = nullptr;
    used_work.reset();
    for (auto& bucket : buckets) {
      bucket.pending = bucket.members.size();
      bucket.work.reset();
    }
    next_to_launch = 0;
    step_started = false;
  }

  // Launches complete buckets strictly in index order: every rank must
  // issue the same allreduces in the same order.
  void LaunchReady() {
    while (next_to_launch < buckets.size() &&
           buckets[next_to_launch].pending == 0) {
      Bucket& bucket = buckets[next_to_launch++];
      if (PowerSgdRuns()) continue;  // finish() reduces it.
      CollectiveOptions call;
      call.api = "backward";
      call.site = site;
      const torch::Tensor& payload = Compress(bucket);
      bytes_reduced += payload.numel() * payload.element_size();
      bucket.work = comm.allreduce_async(
          payload.data_ptr(), static_cast<size_t>(payload.numel()),
          ToDType(payload.scalar_type()), ReduceOp::kSum, call);
    }
  }

  // Whether this step's buckets go through PowerSGD: from its start step,
  // the same on every rank.
  bool PowerSgdRuns() const {
    return options.comm_hook == DDPCommunicationHookType::kPowerSgd &&
           synced_steps >= options.powersgd.start_powerSGD_iter;
  }

  // PowerSGD's reduction of every floating bucket, in order, after the
  // usage agreement (the others are summed whole, divided in Average()).
  void ReduceWithPowerSgd() {
    CollectiveOptions call;
    call.api = "backward (PowerSGD)";
    call.site = site;
    for (auto& bucket : buckets) {
      const auto type = bucket.flat.scalar_type();
      if (type != torch::kFloat32 && type != torch::kFloat64) {
        bytes_reduced += bucket.flat.numel() * bucket.flat.element_size();
        bucket.work = comm.allreduce_async(
            bucket.flat.data_ptr(), static_cast<size_t>(bucket.flat.numel()),
            ToDType(type), ReduceOp::kSum, call);
        continue;
      }
      if (!bucket.powersgd) {
        std::vector<std::vector<int64_t>> shapes;
        for (size_t index : bucket.members) {
          shapes.push_back(parameters[index].sizes().vec());
        }
        bucket.powersgd =
            std::make_unique<PowerSgdBucket>(options.powersgd, shapes);
      }
      bytes_reduced += bucket.powersgd->Reduce(comm, bucket.flat, call);
    }
  }

  // The dtype a bucket of `type` is summed in when it is not its own:
  // reduce_dtype's, or a compression hook's for float32 and float64.
  std::optional<c10::ScalarType> ReduceDtype(c10::ScalarType type) const {
    if (!c10::isFloatingType(type)) return std::nullopt;
    if (options.reduce_dtype) {
      if (*options.reduce_dtype == type) return std::nullopt;
      return options.reduce_dtype;
    }
    if (type != torch::kFloat32 && type != torch::kFloat64) {
      return std::nullopt;
    }
    switch (options.comm_hook) {
      case DDPCommunicationHookType::kFp16:
        return torch::kFloat16;
      case DDPCommunicationHookType::kBf16:
        return torch::kBFloat16;
      default:
        return std::nullopt;
    }
  }

  // The tensor a bucket's allreduce sums: the bucket itself, or in
  // reduce_dtype or under a compression hook its share of the average in 16
  // bits (divided first, as torch's hooks, so that the sum cannot overflow
  // float16).
  const torch::Tensor& Compress(Bucket& bucket) {
    const std::optional<c10::ScalarType> reduce_in =
        ReduceDtype(bucket.flat.scalar_type());
    if (!reduce_in) return bucket.flat;
    torch::NoGradGuard no_grad;
    if (!bucket.compressed.defined()) {
      bucket.compressed = torch::empty_like(bucket.flat, *reduce_in);
    }
    bucket.compressed.copy_(bucket.flat);
    bucket.compressed.div_(comm.size());
    return bucket.compressed;
  }

  // After the allreduces: every bucket holds its average.
  void Average() {
    torch::NoGradGuard no_grad;
    for (auto& bucket : buckets) {
      if (bucket.compressed.defined()) {
        bucket.flat.copy_(bucket.compressed);
      } else if (!(bucket.powersgd && PowerSgdRuns())) {
        bucket.flat.div_(comm.size());
      }
    }
    ++synced_steps;
  }

  // Makes parameter `index`'s gradient its view of the bucket, copying what
  // it held (zeros for none) unless it already is that view.
  void PlaceInBucket(size_t index) {
    torch::Tensor& param = parameters[index];
    const torch::Tensor& view = slots[index].view;
    const torch::Tensor& grad = param.grad();
    if (grad.defined() && grad.data_ptr() == view.data_ptr() &&
        grad.sizes() == view.sizes() && grad.strides() == view.strides()) {
      return;
    }
    torch::NoGradGuard no_grad;
    if (grad.defined()) {
      view.copy_(grad);
    } else {
      view.zero_();
    }
    param.mutable_grad() = view;
  }

  void MarkArrived(size_t index) {
    slots[index].arrived = true;
    PlaceInBucket(index);
    if (--buckets[slots[index].bucket].pending == 0 && !deferred) {
      LaunchReady();
    }
  }

  // find_unused_parameters: after every bucket (so that the ranks' queues
  // stay in the same order), one allreduce of which parameters each rank
  // used; with static_graph only at the first syncing step.
  void LaunchUsageAgreement() {
    if (!options.find_unused_parameters || usage_known) return;
    if (!used_anywhere.defined()) {
      used_anywhere = torch::zeros({static_cast<int64_t>(parameters.size())},
                                   torch::kUInt8);
    }
    uint8_t* used = used_anywhere.data_ptr<uint8_t>();
    for (size_t index = 0; index < slots.size(); ++index) {
      used[index] = slots[index].used ? 1 : 0;
    }
    CollectiveOptions call;
    call.api = "backward (find_unused_parameters)";
    call.site = site;
    used_work = comm.allreduce_async(used, slots.size(), DType::kUInt8,
                                     ReduceOp::kMax, call);
  }

  // What finish() waits for: every bucket, and the usage agreement.
  std::vector<Work*> StepWorks() {
    std::vector<Work*> works;
    for (auto& bucket : buckets) {
      if (bucket.work) works.push_back(bucket.work.get());
    }
    if (used_work) works.push_back(used_work.get());
    return works;
  }

  // After the averages: a parameter no rank used gets back what it had
  // (find_unused_parameters), and without bucket views every gradient
  // becomes a tensor of its own.
  void PlaceGradients() {
    if (used_work) usage_known = options.static_graph;
    const bool agreed = used_anywhere.defined();
    for (size_t index = 0; index < parameters.size(); ++index) {
      Slot& slot = slots[index];
      torch::Tensor& param = parameters[index];
      if (agreed && used_anywhere.data_ptr<uint8_t>()[index] == 0 &&
          !slot.used && !slot.had_gradient) {
        param.mutable_grad() = torch::Tensor();
        continue;
      }
      if (options.gradient_as_bucket_view) continue;
      if (!slot.own_gradient.defined()) {
        slot.own_gradient = slot.view.clone();
      } else {
        slot.own_gradient.copy_(slot.view);
      }
      param.mutable_grad() = slot.own_gradient;
    }
  }

  // Runs on the autograd thread once parameter `index`'s gradient has been
  // accumulated into .grad.
  void OnGradientReady(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!enabled) return;
    if (slots[index].arrived) {
      // .grad is the bucket's view, so autograd added this gradient into
      // it: right while the bucket waits, lost once its allreduce started.
      if (buckets[slots[index].bucket].work != nullptr && !twice) {
        twice =
            std::make_exception_ptr(GradientArrivedTwice(parameters[index]));
      }
      return;
    }
    step_started = true;
    slots[index].used = true;
    MarkArrived(index);
  }
};

std::vector<std::vector<size_t>> AssignBuckets(
    const std::vector<torch::Tensor>& parameters,
    const GradientSyncOptions& options) {
  std::vector<std::vector<size_t>> groups;
  size_t group_bytes = 0;
  for (size_t index = parameters.size(); index-- > 0;) {
    const torch::Tensor& p = parameters[index];
    if (!p.requires_grad()) continue;
    ToDType(p.scalar_type());  // Rejects unsupported parameter dtypes early.
    const size_t bytes = p.numel() * p.element_size();
    const size_t cap = groups.size() <= 1 ? options.first_bucket_bytes
                                          : options.bucket_cap_bytes;
    const bool fits =
        !groups.empty() && group_bytes + bytes <= cap &&
        parameters[groups.back().front()].scalar_type() == p.scalar_type() &&
        parameters[groups.back().front()].device() == p.device();
    if (!fits) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(index);
    group_bytes += bytes;
  }
  return groups;
}

GradientSynchronizer::GradientSynchronizer(
    Communicator& comm, const std::vector<torch::Tensor>& parameters,
    const GradientSyncOptions& options,
    const std::vector<torch::Tensor>& buffers)
    : state_(std::make_shared<State>(comm)) {
  State& s = *state_;
  s.options = options;
  if (options.static_graph) s.options.find_unused_parameters = true;
  if (options.comm_hook == DDPCommunicationHookType::kPowerSgd) {
    PowerSgdBucket(options.powersgd, {});  // Checks the options now.
  }
  if (options.broadcast_buffers) {
    for (const torch::Tensor& buffer : buffers) {
      if (!buffer.defined() || buffer.numel() == 0) continue;
      ToDType(buffer.scalar_type());  // Rejects unsupported dtypes early.
      auto group = std::find_if(
          s.buffer_groups.begin(), s.buffer_groups.end(), [&](const auto& g) {
            return g.members.front().scalar_type() == buffer.scalar_type() &&
                   g.members.front().device() == buffer.device();
          });
      if (group == s.buffer_groups.end()) {
        s.buffer_groups.emplace_back();
        group = std::prev(s.buffer_groups.end());
      }
      group->members.push_back(buffer);
    }
    for (auto& group : s.buffer_groups) {
      int64_t numel = 0;
      for (const auto& b : group.members) numel += b.numel();
      group.flat = torch::empty({numel}, group.members.front().options());
    }
  }
  const std::vector<std::vector<size_t>> groups =
      AssignBuckets(parameters, options);
  for (const auto& members : groups) {
    State::Bucket bucket;
    int64_t numel = 0;
    for (size_t index : members) numel += parameters[index].numel();
    const torch::Tensor& first = parameters[members.front()];
    bucket.flat = torch::zeros({numel}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t index : members) {
      const torch::Tensor& p = parameters[index];
      // The parameter's own strides where they are dense (as DDP), so that
      // autograd's layout rules keep accumulating into the view. detach()
      // makes it a plain tensor to autograd, not a view of the bucket: a
      // zero_grad that detaches gradients in place would refuse a view.
      torch::Tensor view =
          p.is_non_overlapping_and_dense()
              ? bucket.flat.as_strided(p.sizes(), p.strides(), offset)
              : bucket.flat.narrow(0, offset, p.numel()).view(p.sizes());
      bucket.members.push_back(s.parameters.size());
      State::Slot slot;
      slot.bucket = s.buckets.size();
      slot.view = view.detach();
      s.slots.push_back(std::move(slot));
      s.parameters.push_back(p);
      offset += p.numel();
    }
    s.buckets.push_back(std::move(bucket));
  }
  s.ResetStep();
  s.hooks = std::make_unique<GradientReadyHooks>(
      s.parameters, [weak = std::weak_ptr<State>(state_)](size_t index) {
        if (auto state = weak.lock()) state->OnGradientReady(index);
      });
}

GradientSynchronizer::~GradientSynchronizer() { state_->hooks.reset(); }

void GradientSynchronizer::set_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->enabled = enabled;
}

void GradientSynchronizer::set_deferred(bool deferred) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->deferred = deferred;
}

void GradientSynchronizer::set_call_site(CallSite site) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->site = site;
}

bool GradientSynchronizer::enabled() const { return state_->enabled; }

size_t GradientSynchronizer::num_buckets() const {
  return state_->buckets.size();
}

uint64_t GradientSynchronizer::bytes_reduced() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->bytes_reduced;
}

size_t GradientSynchronizer::buckets_launched() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next_to_launch;
}

void GradientSynchronizer::begin_backward() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.enabled) return;
  torch::NoGradGuard no_grad;
  for (auto& group : s.buffer_groups) {
    if (s.comm.rank() == 0) {
      int64_t offset = 0;
      for (const auto& buffer : group.members) {
        group.flat.narrow(0, offset, buffer.numel())
            .copy_(buffer.reshape({-1}));
        offset += buffer.numel();
      }
    }
    CollectiveOptions options;
    options.api = "backward (broadcast_buffers)";
    options.site = s.site;
    group.work = s.comm.broadcast_async(
        group.flat.data_ptr(), static_cast<size_t>(group.flat.numel()),
        ToDType(group.flat.scalar_type()), /*root=*/0, options);
  }
}

void GradientSynchronizer::finish() {
  // What backward waited for the buckets, in accel::Profiler's table.
  RECORD_USER_SCOPE("accel::gradient_sync");
  State& s = *state_;
  std::exception_ptr buffer_failure;
  for (auto& group : s.buffer_groups) {
    if (!group.work) continue;
    try {
      group.work->wait();
    } catch (...) {
      if (!buffer_failure) buffer_failure = std::current_exception();
    }
    group.work.reset();
    if (buffer_failure || s.comm.rank() == 0) continue;
    torch::NoGradGuard no_grad;
    int64_t offset = 0;
    for (auto& buffer : group.members) {
      buffer.copy_(
          group.flat.narrow(0, offset, buffer.numel()).view(buffer.sizes()));
      offset += buffer.numel();
    }
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.enabled) {
      if (buffer_failure) std::rethrow_exception(buffer_failure);
      return;
    }
    // Parameters without a gradient this step contribute what they hold.
    for (size_t index = 0; index < s.parameters.size(); ++index) {
      if (s.slots[index].arrived) continue;
      s.slots[index].had_gradient = s.parameters[index].grad().defined();
      s.MarkArrived(index);
    }
    s.LaunchReady();  // Deferred: every bucket, in order.
    s.LaunchUsageAgreement();
  }
  std::exception_ptr failure = buffer_failure;
  if (!failure) failure = s.twice;
  if (s.PowerSgdRuns()) {
    try {
      s.ReduceWithPowerSgd();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  for (auto* work : s.StepWorks()) {
    try {
      work->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.ResetStep();
    std::rethrow_exception(failure);
  }
  // The gradients are views of the buckets: this averages them.
  s.Average();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.PlaceGradients();
  s.ResetStep();
}

NoSyncScope::~NoSyncScope() {
  for (auto it = restore_.rbegin(); it != restore_.rend(); ++it) {
    it->first->set_enabled(it->second);
  }
}

void NoSyncScope::Add(GradientReducer* synchronizer, bool enabled) {
  if (synchronizer == nullptr) return;
  restore_.emplace_back(synchronizer, synchronizer->enabled());
  synchronizer->set_enabled(enabled);
}

}  // namespace accel
