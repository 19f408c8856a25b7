#include "accel/gradient_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>

#include "accel/runtime/errors.h"
#include "accel/tensor_ops.h"

namespace accel {

struct GradientSynchronizer::State {
  struct Bucket {
    torch::Tensor flat;  // Gradients of this bucket's parameters, packed.
    std::vector<size_t> members;  // Indices into parameters.
    size_t pending = 0;           // Members whose gradient has not arrived.
    std::shared_ptr<Work> work;
  };
  struct Slot {
    size_t bucket;
    int64_t offset;
    bool arrived = false;
  };

  Communicator& comm;
  std::vector<torch::Tensor> parameters;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>>
      hooks;
  std::mutex mutex;
  size_t next_to_launch = 0;
  bool enabled = true;
  bool step_started = false;
  CallSite site;

  explicit State(Communicator& c) : comm(c) {}

  torch::Tensor SliceOf(size_t index) {
    const Slot& slot = slots[index];
    return buckets[slot.bucket].flat.narrow(0, slot.offset,
                                            parameters[index].numel());
  }

  void ResetStep() {
    for (auto& slot : slots) slot.arrived = false;
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
      CollectiveOptions options;
      options.api = "backward";
      options.site = site;
      bucket.work = comm.allreduce_async(
          bucket.flat.data_ptr(), static_cast<size_t>(bucket.flat.numel()),
          ToDType(bucket.flat.scalar_type()), ReduceOp::kSum, options);
    }
  }

  // Runs on the autograd thread once parameter `index`'s gradient has been
  // accumulated into .grad.
  void OnGradientReady(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!enabled || slots[index].arrived) return;
    step_started = true;
    slots[index].arrived = true;
    const torch::Tensor& grad = parameters[index].grad();
    SliceOf(index).copy_(grad.reshape({-1}));
    Bucket& bucket = buckets[slots[index].bucket];
    --bucket.pending;
    if (bucket.pending == 0) LaunchReady();
  }
};

namespace {

class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradientReadyHook(std::weak_ptr<GradientSynchronizer::State> state,
                    size_t index)
      : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto state = state_.lock()) state->OnGradientReady(index_);
    return outputs;
  }

 private:
  std::weak_ptr<GradientSynchronizer::State> state_;
  size_t index_;
};

}  // namespace

GradientSynchronizer::GradientSynchronizer(
    Communicator& comm, const std::vector<torch::Tensor>& parameters,
    const GradientSyncOptions& options)
    : state_(std::make_shared<State>(comm)) {
  State& s = *state_;
  for (const auto& p : parameters) {
    if (p.requires_grad()) s.parameters.push_back(p);
  }
  s.slots.resize(s.parameters.size());
  // Reverse registration order approximates the order in which backward
  // produces gradients (DDP's heuristic), so early buckets fill first.
  std::vector<size_t> order;
  for (size_t i = s.parameters.size(); i-- > 0;) order.push_back(i);
  std::vector<std::vector<size_t>> groups;
  size_t group_bytes = 0;
  for (size_t index : order) {
    const torch::Tensor& p = s.parameters[index];
    ToDType(p.scalar_type());  // Rejects unsupported parameter dtypes early.
    const size_t bytes = p.numel() * p.element_size();
    const size_t cap = groups.size() <= 1 ? options.first_bucket_bytes
                                          : options.bucket_cap_bytes;
    const bool fits =
        !groups.empty() && group_bytes + bytes <= cap &&
        s.parameters[groups.back().front()].scalar_type() == p.scalar_type() &&
        s.parameters[groups.back().front()].device() == p.device();
    if (!fits) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(index);
    group_bytes += bytes;
  }
  for (const auto& members : groups) {
    State::Bucket bucket;
    bucket.members = members;
    int64_t numel = 0;
    for (size_t index : members) {
      s.slots[index] = {s.buckets.size(), numel};
      numel += s.parameters[index].numel();
    }
    const torch::Tensor& first = s.parameters[members.front()];
    bucket.flat = torch::zeros({numel}, first.options().requires_grad(false));
    s.buckets.push_back(std::move(bucket));
  }
  s.ResetStep();
  for (size_t index = 0; index < s.parameters.size(); ++index) {
    auto accumulator =
        torch::autograd::impl::grad_accumulator(s.parameters[index]);
    if (!accumulator) continue;
    const uintptr_t key = accumulator->add_post_hook(
        std::make_unique<GradientReadyHook>(state_, index));
    s.hooks.emplace_back(accumulator, key);
  }
}

GradientSynchronizer::~GradientSynchronizer() {
  for (auto& [node, key] : state_->hooks) node->del_post_hook(key);
}

void GradientSynchronizer::set_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->enabled = enabled;
}

void GradientSynchronizer::set_call_site(CallSite site) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->site = site;
}

bool GradientSynchronizer::enabled() const { return state_->enabled; }

size_t GradientSynchronizer::num_buckets() const {
  return state_->buckets.size();
}

size_t GradientSynchronizer::buckets_launched() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next_to_launch;
}

void GradientSynchronizer::finish() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.enabled) return;
    // Parameters without a gradient this step contribute zeros.
    for (size_t index = 0; index < s.parameters.size(); ++index) {
      State::Slot& slot = s.slots[index];
      if (slot.arrived) continue;
      s.SliceOf(index).zero_();
      slot.arrived = true;
      --s.buckets[slot.bucket].pending;
    }
    s.LaunchReady();
  }
  std::exception_ptr failure;
  for (auto& bucket : s.buckets) {
    try {
      if (bucket.work) bucket.work->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.ResetStep();
    std::rethrow_exception(failure);
  }
  torch::NoGradGuard no_grad;
  for (auto& bucket : s.buckets) bucket.flat.div_(s.comm.size());
  for (size_t index = 0; index < s.parameters.size(); ++index) {
    torch::Tensor& param = s.parameters[index];
    torch::Tensor average = s.SliceOf(index).view(param.sizes());
    if (param.grad().defined()) {
      param.mutable_grad().copy_(average);
    } else {
      param.mutable_grad() = average.clone();
    }
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.ResetStep();
}

}  // namespace accel
