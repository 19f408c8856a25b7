// ZeRO stages 2-3: the gradient reducer ZeroOptimizer::MakeGradientReducer
// gives (see zero.h).
#include <algorithm>
#include <deque>
#include <exception>
#include <mutex>
#include <utility>

#include "accel/core/tensor_ops.h"
#include "accel/parallel/gradient_hooks.h"
#include "accel/parallel/zero.h"
#include "accel/parallel/zero_group.h"
#include "accel/parallel/zero_units.h"
#include "accel/runtime/base/errors.h"

namespace accel {

namespace {

// Stage 2's reduction: gradients reduce-scattered bucket by bucket during
// backward into each group's shard_grad (see zero.h).
class ShardedGradientReducer : public GradientReducer {
 public:
  // `replicas`: HSDP's other copies of this rank's shard (or null);
  // `buffers_comm`: the ranks the model's buffers are broadcast over.
  ShardedGradientReducer(Communicator& comm, Communicator* replicas,
                         Communicator& buffers_comm,
                         std::vector<std::shared_ptr<ZeroGroup>> groups,
                         std::shared_ptr<UnitSchedule> units,
                         const GradientSyncOptions& options,
                         const std::vector<torch::Tensor>& buffers)
      : state_(std::make_shared<State>(comm, std::move(groups))),
        buffers_(buffers_comm, {}, options, buffers) {
    State& s = *state_;
    s.replicas = replicas;
    s.units = std::move(units);
    std::vector<torch::Tensor> params;
    // Buckets in the order backward fills them (launches go strictly in
    // bucket order): the last parameters first, so under stage 3 the last
    // unit's groups first.
    for (size_t g = s.groups.size(); g-- > 0;) {
      const ZeroGroup& group = *s.groups[g];
      size_t bucket_bytes = 0;
      for (size_t t = group.params.size(); t-- > 0;) {
        const torch::Tensor& p = group.params[t];
        const size_t bytes = p.numel() * p.element_size();
        // Every bucket of DDP's first size (1 MiB by default): a bucket's
        // buffer is gradient memory beyond this rank's share, and a larger
        // parameter is a bucket of its own, reduced where autograd left it.
        const size_t cap = options.first_bucket_bytes;
        const bool fits = !s.buckets.empty() && s.buckets.back().group == g &&
                          bucket_bytes + bytes <= cap;
        if (!fits) {
          Bucket next;
          next.group = g;
          next.hi = group.layout.offset(t) + p.numel();
          s.buckets.push_back(std::move(next));
          bucket_bytes = 0;
        }
        Bucket& bucket = s.buckets.back();
        bucket.lo = group.layout.offset(t);
        bucket.members.push_back(s.slots.size());
        s.slots.push_back({g, t, s.buckets.size() - 1, false});
        params.push_back(p);
        bucket_bytes += bytes;
      }
    }
    s.ResetStep();
    s.hooks = std::make_unique<GradientReadyHooks>(
        params, [weak = std::weak_ptr<State>(state_)](size_t index) {
          if (auto state = weak.lock()) state->OnGradientReady(index);
        });
  }

  ~ShardedGradientReducer() override { state_->hooks.reset(); }

  void begin_backward() override { buffers_.begin_backward(); }

  void finish() override {
    buffers_.finish();
    State& s = *state_;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (!s.enabled) {
        // Under no_sync the gradients stay in .grad; the units' parameters
        // go until the next forward or backward gathers them.
        if (s.units != nullptr) s.units->ReleaseAll();
        s.ResetStep();
        return;
      }
      // Parameters without a gradient this backward contribute what they
      // accumulated before (no_sync), or zeros.
      for (size_t i = 0; i < s.slots.size(); ++i) {
        if (!s.slots[i].arrived) s.Arrive(i);
      }
    }
    s.WaitAll();
    if (s.units != nullptr) s.units->ReleaseAll();  // Units without grads.
    std::exception_ptr failure;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      failure = s.failure;
      s.ResetStep();
    }
    if (failure) std::rethrow_exception(failure);
    torch::NoGradGuard no_grad;
    // The mean over every rank that computed a gradient: the shard group's
    // and, under HSDP, its replicas'.
    const double ranks =
        s.comm.size() * (s.replicas != nullptr ? s.replicas->size() : 1);
    for (auto& group : s.groups) {
      if (group->shard_grad_held) {
        group->shard_grad.add_(group->incoming.div_(ranks));
        group->incoming = torch::Tensor();
      } else {
        group->shard_grad.div_(ranks);
      }
      group->shard_grad_held = true;
    }
  }

  void set_enabled(bool enabled) override {
    buffers_.set_enabled(enabled);
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->enabled = enabled;
  }
  bool enabled() const override { return state_->enabled; }
  void set_call_site(CallSite site) override {
    buffers_.set_call_site(site);
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->site = site;
  }

 private:
  struct Bucket {
    size_t group = 0;
    int64_t hi = 0;               // [lo, hi) of the group's flat buffer.
    std::vector<size_t> members;  // Indices into slots.
    int64_t lo = 0;
    size_t pending = 0;
    torch::Tensor buffer;  // The gradients, while the bucket is reduced.
    // When reduce_dtype is not the master dtype: this rank's sum, and
    // where it goes (a view of shard_grad or incoming).
    torch::Tensor result;
    torch::Tensor target;
    std::shared_ptr<Work> work;
    // This rank's part of the sum (in the master dtype), all-reduced
    // across replicas under HSDP once the reduce-scatter is done.
    torch::Tensor own;
  };
  struct Slot {
    size_t group;
    size_t tensor;
    size_t bucket;
    bool arrived;
  };
  // Buckets whose reduction may be in flight while the next fills: their
  // buffers are the gradient memory beyond this rank's share. One keeps
  // communication beside backward (bucket k is reduced while autograd
  // computes bucket k + 1's gradients) at the least memory.
  static constexpr size_t kInFlight = 1;

  struct State {
    State(Communicator& c, std::vector<std::shared_ptr<ZeroGroup>> g)
        : comm(c), groups(std::move(g)) {}
    Communicator& comm;
    Communicator* replicas = nullptr;  // HSDP.
    std::vector<std::shared_ptr<ZeroGroup>> groups;
    std::shared_ptr<UnitSchedule> units;  // Stage 3.
    // The all-reduces across replicas, in bucket order.
    std::vector<std::shared_ptr<Work>> replica_works;
    std::vector<size_t> group_pending;  // Gradients not in, per group.
    std::vector<Bucket> buckets;
    std::vector<Slot> slots;
    std::unique_ptr<GradientReadyHooks> hooks;
    std::mutex mutex;
    std::deque<size_t> in_flight;
    size_t next_to_launch = 0;
    bool enabled = true;
    std::exception_ptr failure;
    CallSite site;

    void ResetStep() {
      group_pending.assign(groups.size(), 0);
      for (auto& slot : slots) {
        slot.arrived = false;
        ++group_pending[slot.group];
      }
      for (auto& bucket : buckets) {
        bucket.pending = bucket.members.size();
        bucket.buffer = torch::Tensor();
        bucket.result = torch::Tensor();
        bucket.target = torch::Tensor();
        bucket.own = torch::Tensor();
        bucket.work.reset();
      }
      replica_works.clear();
      in_flight.clear();
      next_to_launch = 0;
      failure = nullptr;
    }

    // Moves slot i's gradient (zeros if none) into its bucket and frees it.
    void Arrive(size_t i) {
      Slot& slot = slots[i];
      slot.arrived = true;
      Bucket& bucket = buckets[slot.bucket];
      ZeroGroup& group = *groups[slot.group];
      torch::Tensor& param = group.params[slot.tensor];
      torch::NoGradGuard no_grad;
      const torch::Tensor& grad = param.grad();
      if (bucket.members.size() == 1 && grad.defined() &&
          grad.is_contiguous() && grad.scalar_type() == group.reduce_dtype) {
        // A bucket of one gradient reduces it where autograd left it: no
        // copy, and no second gradient-sized buffer alive.
        bucket.buffer = grad.reshape({-1});
        param.mutable_grad() = torch::Tensor();
        Done(slot);
        return;
      }
      if (!bucket.buffer.defined()) {
        bucket.buffer =
            torch::empty({bucket.hi - bucket.lo},
                         group.flat.options().dtype(group.reduce_dtype));
      }
      torch::Tensor place = bucket.buffer.narrow(
          0, group.layout.offset(slot.tensor) - bucket.lo, param.numel());
      if (grad.defined()) {
        place.copy_(grad.reshape({-1}));
      } else {
        place.zero_();
      }
      param.mutable_grad() = torch::Tensor();
      Done(slot);
    }

    // Slot's gradient is in its bucket: under stage 3 the last of a
    // unit's frees its parameters (its backward no longer needs them).
    void Done(const Slot& slot) {
      if (--group_pending[slot.group] == 0 && units != nullptr) {
        units->ReleaseGroup(*groups[slot.group]);
      }
      if (--buckets[slot.bucket].pending == 0) LaunchReady();
    }

    static torch::Tensor& Incoming(ZeroGroup& group) {
      if (!group.incoming.defined()) {
        const int64_t own = group.shard_grad.numel();
        group.incoming = torch::empty({own + 1}, group.shard_grad.options())
                             .narrow(0, 0, own);
      }
      return group.incoming;
    }

    // Launches complete buckets strictly in index order (every rank issues
    // the same reduce-scatters in the same order), keeping at most
    // kInFlight in flight.
    void LaunchReady() {
      while (next_to_launch < buckets.size() &&
             buckets[next_to_launch].pending == 0) {
        Bucket& bucket = buckets[next_to_launch];
        ZeroGroup& group = *groups[bucket.group];
        const std::vector<size_t> counts =
            group.layout.Counts(bucket.lo, bucket.hi);
        const int64_t into =
            std::max(bucket.lo, group.own_begin) - group.own_begin;
        torch::Tensor& into_tensor =
            group.shard_grad_held ? Incoming(group) : group.shard_grad;
        const int64_t count = static_cast<int64_t>(counts[comm.rank()]);
        char* output = static_cast<char*>(into_tensor.data_ptr()) +
                       (count > 0 ? into : 0) * into_tensor.element_size();
        if (count > 0) bucket.own = into_tensor.narrow(0, into, count);
        if (bucket.buffer.scalar_type() != into_tensor.scalar_type()) {
          // Reduced in reduce_dtype, kept in the master dtype: the sum
          // lands beside its place, and is copied in when it is done.
          bucket.result = torch::empty({count + 1}, bucket.buffer.options())
                              .narrow(0, 0, count);
          if (count > 0) bucket.target = into_tensor.narrow(0, into, count);
          output = static_cast<char*>(bucket.result.data_ptr());
        }
        CollectiveOptions options;
        options.api = "backward (ZeRO reduce-scatter)";
        options.site = site;
        bucket.work = comm.reduce_scatter_async(
            bucket.buffer.data_ptr(), output, counts,
            ToDType(bucket.buffer.scalar_type()), ReduceOp::kSum, options);
        in_flight.push_back(next_to_launch++);
        while (in_flight.size() > kInFlight) WaitOldest();
      }
    }

    void WaitOldest() {
      Bucket& bucket = buckets[in_flight.front()];
      in_flight.pop_front();
      try {
        bucket.work->wait();
        torch::NoGradGuard no_grad;
        if (bucket.target.defined()) bucket.target.copy_(bucket.result);
        // Replicas of one shard hold the same counts: each launches (or
        // skips) the same all-reduces, in bucket order.
        if (replicas != nullptr && bucket.own.defined()) {
          CollectiveOptions options;
          options.api = "backward (HSDP all-reduce across replicas)";
          options.site = site;
          replica_works.push_back(replicas->allreduce_async(
              bucket.own.data_ptr(), static_cast<size_t>(bucket.own.numel()),
              ToDType(bucket.own.scalar_type()), ReduceOp::kSum, options));
        }
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      bucket.buffer = torch::Tensor();
      bucket.result = torch::Tensor();
      bucket.target = torch::Tensor();
      bucket.own = torch::Tensor();
    }

    void WaitAll() {
      std::lock_guard<std::mutex> lock(mutex);
      while (!in_flight.empty()) WaitOldest();
      for (const std::shared_ptr<Work>& work : replica_works) {
        try {
          work->wait();
        } catch (...) {
          if (!failure) failure = std::current_exception();
        }
      }
      replica_works.clear();
    }

    void OnGradientReady(size_t i) {
      std::lock_guard<std::mutex> lock(mutex);
      if (slots[i].arrived) {
        if (enabled) ArriveAgain(i);
        return;
      }
      if (enabled) {
        Arrive(i);
      } else {
        KeepLocal(i);
      }
    }

    // A second gradient in one backward (a layer run twice inside
    // activation checkpointing): added to its place while the bucket
    // waits; once the bucket's reduction started, an error finish() throws.
    void ArriveAgain(size_t i) {
      Slot& slot = slots[i];
      Bucket& bucket = buckets[slot.bucket];
      ZeroGroup& group = *groups[slot.group];
      torch::Tensor& param = group.params[slot.tensor];
      torch::NoGradGuard no_grad;
      const torch::Tensor grad = param.grad();
      param.mutable_grad() = torch::Tensor();
      if (!grad.defined()) return;
      if (bucket.pending > 0 && bucket.buffer.defined()) {
        bucket.buffer
            .narrow(0, group.layout.offset(slot.tensor) - bucket.lo,
                    param.numel())
            .add_(grad.reshape({-1}));
        return;
      }
      if (!failure) {
        failure = std::make_exception_ptr(GradientArrivedTwice(param));
      }
    }

    // Under no_sync the gradient stays in .grad, but the last of a stage-3
    // unit's still frees its parameters, as when syncing: otherwise every
    // unit stayed whole to the end of backward, 4 more bytes a parameter.
    void KeepLocal(size_t i) {
      slots[i].arrived = true;
      if (--group_pending[slots[i].group] == 0 && units != nullptr) {
        units->ReleaseGroup(*groups[slots[i].group]);
      }
    }
  };

  std::shared_ptr<State> state_;
  GradientSynchronizer buffers_;  // broadcast_buffers, as under DDP.
};

}  // namespace

std::unique_ptr<GradientReducer> ZeroOptimizer::MakeGradientReducer(
    const std::vector<torch::Tensor>& model_buffers,
    const GradientSyncOptions& options) {
  Communicator& comm = Comm("prepare");
  return std::make_unique<ShardedGradientReducer>(
      comm, replicas_, data_parallel_ != nullptr ? *data_parallel_ : comm,
      groups_, units_, options, model_buffers);
}

}  // namespace accel
