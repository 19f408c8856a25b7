#include "accel/zero.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "accel/gradient_hooks.h"
#include "accel/released_memory.h"
#include "accel/runtime/base/errors.h"
#include "accel/tensor_ops.h"

namespace accel {

ShardLayout::ShardLayout(const std::vector<int64_t>& numels, int world_size)
    : world_size_(world_size) {
  for (int64_t numel : numels) {
    offsets_.push_back(total_);
    total_ += numel;
  }
  shard_size_ = (total_ + world_size - 1) / world_size;
}

int64_t ShardLayout::begin(int rank) const {
  return std::min(total_, rank * shard_size_);
}

int64_t ShardLayout::end(int rank) const {
  return std::min(total_, (rank + 1) * shard_size_);
}

std::vector<size_t> ShardLayout::Counts(int64_t lo, int64_t hi) const {
  std::vector<size_t> counts;
  for (int rank = 0; rank < world_size_; ++rank) {
    const int64_t from = std::max(lo, begin(rank));
    const int64_t to = std::min(hi, end(rank));
    counts.push_back(static_cast<size_t>(std::max<int64_t>(0, to - from)));
  }
  return counts;
}

std::vector<ShardLayout::Piece> ShardLayout::Pieces(int rank) const {
  std::vector<Piece> pieces;
  for (size_t tensor = 0; tensor < offsets_.size(); ++tensor) {
    const int64_t start = offsets_[tensor];
    const int64_t stop =
        tensor + 1 < offsets_.size() ? offsets_[tensor + 1] : total_;
    const int64_t from = std::max(start, begin(rank));
    const int64_t to = std::min(stop, end(rank));
    if (from < to) pieces.push_back({tensor, from - start, to - from});
  }
  return pieces;
}

// The parameters of one dtype and device, packed into one flat buffer that
// they are views of.
struct ZeroGroup {
  ShardLayout layout;
  torch::Tensor flat;                       // layout.padded() elements.
  std::vector<torch::Tensor> params;        // Views of flat.
  std::vector<ShardLayout::Piece> pieces;   // This rank's.
  std::vector<torch::Tensor> piece_params;  // What the optimizer steps.
  // Stage 2: this rank's share of the reduced gradients (its own size;
  // one element more so that its pointer is valid when the share is empty).
  torch::Tensor shard_grad;
  // Whether shard_grad holds a reduced gradient that zero_grad has not
  // cleared: the next sync then reduces into `incoming` and adds, so that
  // two backwards before a step sum as under DDP.
  bool shard_grad_held = false;
  torch::Tensor incoming;
  int64_t own_begin = 0;
  // Stage 3: the unit these parameters belong to, or -1 (the flat buffer
  // then stays, as under stages 1-2). A unit's group keeps this rank's
  // share of it in `shard` (shard_size elements, the pieces are views of
  // it); `flat` has storage only while gathered.
  int unit = -1;
  torch::Tensor shard;
  bool gathered = true;
  std::shared_ptr<Work> gathering;  // The all-gather filling flat.
};

namespace {

const void* Key(const torch::Tensor& t) { return t.unsafeGetTensorImpl(); }

std::string Shape(const torch::Tensor& t) {
  std::string text = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {
    text += (i ? ", " : "") + std::to_string(t.size(i));
  }
  return text + "]";
}

// Makes every parameter a view of its place in group.flat, holding its
// values.
void Flatten(ZeroGroup& group) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& first = group.params.front();
  group.flat = torch::zeros({group.layout.padded()},
                            first.options().requires_grad(false));
  for (size_t i = 0; i < group.params.size(); ++i) {
    torch::Tensor& param = group.params[i];
    torch::Tensor place =
        group.flat.narrow(0, group.layout.offset(i), param.numel());
    place.copy_(param.reshape({-1}));
    param.set_data(place.view(param.sizes()));
  }
}

// Stage 3's storage resizing: the flat buffer's storage (which its
// parameters, their views and autograd's saved tensors share) gets memory
// again, or gives it back. Released on the CPU it points at a range that
// faults with a message (released_memory.h) and keeps its size, so that any
// use of a parameter meets that message; elsewhere it is null and empty.
void AllocateStorage(const torch::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = flat.numel() * flat.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void FreeStorage(const torch::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = flat.numel() * flat.element_size();
  void* released = flat.device().is_cpu() ? ReleasedMemory(bytes) : nullptr;
  storage->set_data_ptr_noswap(c10::DataPtr(released, flat.device()));
  storage->set_nbytes(released != nullptr ? bytes : 0);
}

}  // namespace

// Stage 3: when each unit's parameters are gathered and freed (zero.h).
// Every rank runs the same units in the same order, so the all-gathers
// match; the mutex covers autograd's threads.
class UnitSchedule : public UnitRunner {
 public:
  UnitSchedule(Communicator& comm,
               const std::vector<std::shared_ptr<ZeroGroup>>& groups,
               size_t units)
      : comm_(comm), units_(units), names_(units) {
    for (const auto& group : groups) {
      if (group->unit >= 0) units_[group->unit].push_back(group);
    }
    // What diagnostics call each gather: these run inside the model's
    // forward and backward, where no line of the program is known, so the
    // unit is named instead ("(unknown)" before).
    const std::string of = " of " + std::to_string(units);
    for (size_t u = 0; u < units; ++u) {
      const std::string unit = "unit " + std::to_string(u) + of;
      names_[u] = {"forward (ZeRO-3 all-gather of " + unit + ")",
                   "forward (ZeRO-3 prefetch of " + unit + ")",
                   "backward (ZeRO-3 all-gather of " + unit + ")",
                   "backward (ZeRO-3 prefetch of " + unit + ")"};
    }
  }

  void BeforeForward(size_t unit) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Gather(unit, names_[unit][0].c_str());
    if (unit + 1 < units_.size()) Start(unit + 1, names_[unit + 1][1].c_str());
  }
  void AfterForward(size_t unit) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& group : units_[unit]) Release(*group);
  }
  void BeforeBackward(size_t unit) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Gather(unit, names_[unit][2].c_str());
    if (unit > 0) Start(unit - 1, names_[unit - 1][3].c_str());
  }

  // Frees one group (its gradients are in) or all of them.
  void ReleaseGroup(ZeroGroup& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    Release(group);
  }
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& unit : units_) {
      for (auto& group : unit) Release(*group);
    }
  }
  void GatherUnit(size_t unit, const char* api) {
    std::lock_guard<std::mutex> lock(mutex_);
    Gather(unit, api);
  }
  void ReleaseUnit(size_t unit) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& group : units_[unit]) Release(*group);
  }
  // Each gathered group's share becomes what its flat buffer holds.
  void AdoptAndReleaseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::NoGradGuard no_grad;
    for (auto& unit : units_) {
      for (auto& group : unit) {
        Finish(*group);
        if (!group->gathered) continue;
        const int64_t share = group->layout.shard_size();
        group->shard.copy_(group->flat.narrow(0, comm_.rank() * share, share));
        Release(*group);
      }
    }
  }
  size_t size() const { return units_.size(); }

 private:
  void Start(size_t unit, const char* api) {
    for (auto& group : units_[unit]) {
      if (group->gathered || group->gathering) continue;
      AllocateStorage(group->flat);
      CollectiveOptions options;
      options.api = api;
      // Called from inside the model's forward or backward: no line of the
      // program's is known (not this one's either).
      options.site = CallSite{};
      group->gathering =
          comm_.allgather_async(group->shard.data_ptr(), group->flat.data_ptr(),
                                static_cast<size_t>(group->layout.shard_size()),
                                ToDType(group->flat.scalar_type()), options);
    }
  }
  void Finish(ZeroGroup& group) {
    if (!group.gathering) return;
    std::shared_ptr<Work> work = std::move(group.gathering);
    group.gathering.reset();
    work->wait();
    group.gathered = true;
  }
  void Gather(size_t unit, const char* api) {
    Start(unit, api);
    for (auto& group : units_[unit]) Finish(*group);
  }
  void Release(ZeroGroup& group) {
    if (group.unit < 0) return;
    Finish(group);  // Its all-gather writes into the storage.
    if (!group.gathered) return;
    FreeStorage(group.flat);
    group.gathered = false;
  }

  Communicator& comm_;
  std::vector<std::vector<std::shared_ptr<ZeroGroup>>> units_;
  // Per unit: forward gather and prefetch, backward gather and prefetch.
  std::vector<std::array<std::string, 4>> names_;
  std::mutex mutex_;
};

namespace {

// Stages 2-3 reduce a model's gradients in the optimizer's flat layout:
// the optimizer must hold exactly that model's trainable parameters.
void CheckShardsWholeModel(const std::vector<torch::Tensor>& sharded,
                           const std::vector<torch::Tensor>& model_parameters) {
  std::vector<const void*> mine;
  for (const auto& p : sharded) mine.push_back(Key(p));
  std::sort(mine.begin(), mine.end());
  size_t in_model = 0;
  for (size_t i = 0; i < model_parameters.size(); ++i) {
    const torch::Tensor& p = model_parameters[i];
    if (!p.requires_grad()) continue;
    if (!std::binary_search(mine.begin(), mine.end(), Key(p))) {
      throw UsageError(
          "prepare: under ZeRO stages 2-3 the prepared optimizer must hold "
          "every trainable parameter of its model, but parameter " +
          std::to_string(i) + " (shape " + Shape(p) +
          ") is not in it; give the optimizer model->parameters() (frozen "
          "ones may stay out), or use stage 1");
    }
    ++in_model;
  }
  if (in_model != sharded.size()) {
    throw UsageError(
        "prepare: under ZeRO stages 2-3 one optimizer shards the parameters of "
        "one model, but this one holds " +
        std::to_string(sharded.size()) +
        " trainable parameters and its "
        "model " +
        std::to_string(in_model) + "; use one optimizer per model, or stage 1");
  }
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(
    Communicator& comm, int stage, torch::optim::Optimizer& optimizer,
    const std::vector<torch::Tensor>& model_parameters,
    const std::vector<std::vector<torch::Tensor>>& units)
    : comm_(comm), stage_(stage), optimizer_(optimizer) {
  if (stage < 1 || stage > 3) {
    throw UsageError("ZeRO stage " + std::to_string(stage) +
                     " is not one that shards training state (1, 2 or 3)");
  }
  if (stage == 3 && units.empty()) {
    throw UsageError(
        "prepare: ZeRO stage 3 shards parameters unit by unit, but the "
        "model has no units (children of a Sequential with trainable "
        "parameters); see accel/sharded_units.h");
  }
  std::map<const void*, int> unit_of;
  for (size_t u = 0; u < units.size() && stage == 3; ++u) {
    for (const torch::Tensor& p : units[u]) {
      unit_of.emplace(Key(p), static_cast<int>(u));
    }
  }
  if (!optimizer.state().empty()) {
    throw UsageError(
        "prepare: under ZeRO stage " + std::to_string(stage) +
        " the optimizer must be prepared before its first step, but it "
        "already holds state for " +
        std::to_string(optimizer.state().size()) +
        " parameter(s); build it over the model's parameters and prepare "
        "it at once");
  }
  // The trainable parameters, grouped by unit, dtype and device in the
  // order the optimizer holds them (the same on every rank).
  std::map<const void*, std::pair<size_t, size_t>> where;  // group, index
  std::vector<std::tuple<int, c10::ScalarType, c10::Device>> kinds;
  for (auto& param_group : optimizer.param_groups()) {
    for (const torch::Tensor& p : param_group.params()) {
      if (!p.requires_grad()) continue;
      if (where.count(Key(p)) != 0) {
        throw UsageError("prepare: the optimizer holds a parameter of shape " +
                         Shape(p) +
                         " twice; under ZeRO each must be in one "
                         "param group once");
      }
      ToDType(p.scalar_type());  // Rejects unsupported dtypes early.
      const auto unit = unit_of.find(Key(p));
      const int unit_index = unit == unit_of.end() ? -1 : unit->second;
      const auto kind =
          std::make_tuple(unit_index, p.scalar_type(), p.device());
      auto found = std::find(kinds.begin(), kinds.end(), kind);
      const size_t index = found - kinds.begin();
      if (found == kinds.end()) kinds.push_back(kind);
      if (groups_.size() <= index) {
        groups_.push_back(std::make_shared<ZeroGroup>());
        groups_.back()->unit = unit_index;
      }
      where[Key(p)] = {index, groups_[index]->params.size()};
      groups_[index]->params.push_back(p);
      parameters_.push_back(p);
    }
  }
  if (stage >= 2) CheckShardsWholeModel(parameters_, model_parameters);
  const int rank = comm.rank();
  for (auto& group : groups_) {
    std::vector<int64_t> numels;
    for (const auto& p : group->params) numels.push_back(p.numel());
    group->layout = ShardLayout(numels, comm.size());
    Flatten(*group);
    // The pieces are views of what this rank keeps: the flat buffer, or
    // under stage 3 its share (starting at element `base` of the flat).
    torch::Tensor kept = group->flat;
    int64_t base = 0;
    if (group->unit >= 0) {
      base = rank * group->layout.shard_size();
      group->shard =
          group->flat.narrow(0, base, group->layout.shard_size()).clone();
      kept = group->shard;
      FreeStorage(group->flat);
      group->gathered = false;
    }
    group->pieces = group->layout.Pieces(rank);
    for (const auto& piece : group->pieces) {
      torch::Tensor view =
          kept.narrow(0,
                      group->layout.offset(piece.tensor) + piece.begin - base,
                      piece.length)
              .detach();
      view.requires_grad_(true);
      group->piece_params.push_back(view);
    }
    group->own_begin = group->layout.begin(rank);
    if (stage >= 2) {
      const int64_t own = group->layout.end(rank) - group->own_begin;
      group->shard_grad =
          torch::zeros({own + 1}, group->flat.options()).narrow(0, 0, own);
    }
  }
  // The optimizer now steps this rank's pieces in place of the parameters.
  for (auto& param_group : optimizer.param_groups()) {
    std::vector<torch::Tensor> stepped;
    for (const torch::Tensor& p : param_group.params()) {
      auto found = where.find(Key(p));
      if (found == where.end()) {
        stepped.push_back(p);  // Frozen: it has no gradient to step.
        continue;
      }
      const ZeroGroup& group = *groups_[found->second.first];
      for (size_t i = 0; i < group.pieces.size(); ++i) {
        if (group.pieces[i].tensor == found->second.second) {
          stepped.push_back(group.piece_params[i]);
        }
      }
    }
    param_group.params() = std::move(stepped);
  }
  if (stage == 3) {
    units_ = std::make_shared<UnitSchedule>(comm, groups_, units.size());
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::AttachGradients() {
  for (auto& group : groups_) {
    for (size_t i = 0; i < group->pieces.size(); ++i) {
      const ShardLayout::Piece& piece = group->pieces[i];
      torch::Tensor grad;
      if (stage_ >= 2) {
        grad = group->shard_grad.narrow(
            0,
            group->layout.offset(piece.tensor) + piece.begin - group->own_begin,
            piece.length);
      } else {
        const torch::Tensor& full = group->params[piece.tensor].grad();
        if (full.defined()) {
          grad = full.reshape({-1}).narrow(0, piece.begin, piece.length);
        }
      }
      // detach(): a plain tensor to autograd, which zero_grad may detach.
      group->piece_params[i].mutable_grad() =
          grad.defined() ? grad.detach() : grad;
    }
  }
}

void ZeroOptimizer::AllGatherParameters(CallSite site) {
  // A unit gathered now would hold its parameters from before the step.
  if (units_ != nullptr) units_->ReleaseAll();
  CollectiveOptions options;
  options.api = "optimizer.step (ZeRO all-gather of the updated parameters)";
  options.site = site;
  for (auto& group : groups_) {
    if (group->unit >= 0) continue;
    const int64_t share = group->layout.shard_size();
    char* flat = static_cast<char*>(group->flat.data_ptr());
    comm_.allgather(flat + comm_.rank() * share * group->flat.element_size(),
                    flat, static_cast<size_t>(share),
                    ToDType(group->flat.scalar_type()), options);
  }
}

std::shared_ptr<UnitRunner> ZeroOptimizer::unit_runner() const {
  return units_;
}

void ZeroOptimizer::GatherEveryUnit() {
  if (units_ == nullptr) return;
  for (size_t u = 0; u < units_->size(); ++u) {
    units_->GatherUnit(u, "save_state / load_state (ZeRO-3 all-gather)");
  }
}

void ZeroOptimizer::ReshardEveryUnit(bool adopt) {
  if (units_ == nullptr) return;
  if (adopt) {
    units_->AdoptAndReleaseAll();
  } else {
    units_->ReleaseAll();
  }
}

void ZeroOptimizer::ForEachGathered(const std::vector<torch::Tensor>& tensors,
                                    const std::function<void(size_t)>& visit) {
  std::map<const void*, int> unit_of;
  for (const auto& group : groups_) {
    for (const auto& p : group->params) unit_of[Key(p)] = group->unit;
  }
  int current = -1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto found = unit_of.find(Key(tensors[i]));
    const int unit = found == unit_of.end() ? -1 : found->second;
    if (units_ != nullptr && unit >= 0 && unit != current) {
      if (current >= 0) units_->ReleaseUnit(current);
      units_->GatherUnit(unit, "get_state_dict (ZeRO-3 all-gather)");
      current = unit;
    }
    visit(i);
  }
  if (current >= 0) units_->ReleaseUnit(current);
}

void ZeroOptimizer::ZeroGrad() {
  optimizer_.zero_grad();
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : parameters_) {
    // In place: under stage 1 the gradients are views of DDP's buckets.
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  for (auto& group : groups_) {
    if (!group->shard_grad.defined()) continue;
    group->shard_grad.zero_();
    group->shard_grad_held = false;
  }
}

std::vector<torch::Tensor> ZeroOptimizer::GradientPieces(
    const std::vector<torch::Tensor>& of,
    std::vector<const void*>* covered) const {
  std::vector<const void*> wanted;
  for (const auto& p : of) wanted.push_back(Key(p));
  std::sort(wanted.begin(), wanted.end());
  std::vector<torch::Tensor> grads;
  for (const auto& group : groups_) {
    for (const auto& p : group->params) {
      if (std::binary_search(wanted.begin(), wanted.end(), Key(p))) {
        covered->push_back(Key(p));
      }
    }
    for (size_t i = 0; i < group->pieces.size(); ++i) {
      const torch::Tensor& p = group->params[group->pieces[i].tensor];
      const torch::Tensor& grad = group->piece_params[i].grad();
      if (grad.defined() &&
          std::binary_search(wanted.begin(), wanted.end(), Key(p))) {
        grads.push_back(grad);
      }
    }
  }
  return grads;
}

namespace {

// Stage 2's reduction: gradients reduce-scattered bucket by bucket during
// backward into each group's shard_grad (see zero.h).
class ShardedGradientReducer : public GradientReducer {
 public:
  ShardedGradientReducer(Communicator& comm,
                         std::vector<std::shared_ptr<ZeroGroup>> groups,
                         std::shared_ptr<UnitSchedule> units,
                         const GradientSyncOptions& options,
                         const std::vector<torch::Tensor>& buffers)
      : state_(std::make_shared<State>(comm, std::move(groups))),
        buffers_(comm, {}, options, buffers) {
    State& s = *state_;
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
          s.buckets.push_back({g, group.layout.offset(t) + p.numel(), {}});
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
    for (auto& group : s.groups) {
      if (group->shard_grad_held) {
        group->shard_grad.add_(group->incoming.div_(s.comm.size()));
        group->incoming = torch::Tensor();
      } else {
        group->shard_grad.div_(s.comm.size());
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
    size_t group;
    int64_t hi;                   // [lo, hi) of the group's flat buffer.
    std::vector<size_t> members;  // Indices into slots.
    int64_t lo = 0;
    size_t pending = 0;
    torch::Tensor buffer;  // The gradients, while the bucket is reduced.
    std::shared_ptr<Work> work;
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
    std::vector<std::shared_ptr<ZeroGroup>> groups;
    std::shared_ptr<UnitSchedule> units;  // Stage 3.
    std::vector<size_t> group_pending;    // Gradients not in, per group.
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
        bucket.work.reset();
      }
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
          grad.is_contiguous() && grad.dtype() == group.flat.dtype()) {
        // A bucket of one gradient reduces it where autograd left it: no
        // copy, and no second gradient-sized buffer alive.
        bucket.buffer = grad.reshape({-1});
        param.mutable_grad() = torch::Tensor();
        Done(slot);
        return;
      }
      if (!bucket.buffer.defined()) {
        bucket.buffer =
            torch::empty({bucket.hi - bucket.lo}, group.flat.options());
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
        char* output =
            static_cast<char*>(into_tensor.data_ptr()) +
            (counts[comm.rank()] > 0 ? into : 0) * into_tensor.element_size();
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
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      bucket.buffer = torch::Tensor();
    }

    void WaitAll() {
      std::lock_guard<std::mutex> lock(mutex);
      while (!in_flight.empty()) WaitOldest();
    }

    void OnGradientReady(size_t i) {
      std::lock_guard<std::mutex> lock(mutex);
      if (slots[i].arrived) return;
      if (enabled) {
        Arrive(i);
      } else {
        KeepLocal(i);
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
  return std::make_unique<ShardedGradientReducer>(comm_, groups_, units_,
                                                  options, model_buffers);
}

namespace {

// The gradients of `parameters`: this rank's pieces of those sharded here,
// and the whole (replicated) gradients of the others.
struct ShardedGradients {
  std::vector<torch::Tensor> pieces;
  std::vector<torch::Tensor> replicated;
};

ShardedGradients CollectGradients(
    const std::vector<ZeroOptimizer*>& sharded,
    const std::vector<torch::Tensor>& parameters) {
  ShardedGradients result;
  std::vector<const void*> covered;
  for (const ZeroOptimizer* zero : sharded) {
    for (auto& grad : zero->GradientPieces(parameters, &covered)) {
      result.pieces.push_back(grad);
    }
  }
  std::sort(covered.begin(), covered.end());
  for (const auto& p : parameters) {
    if (p.grad().defined() &&
        !std::binary_search(covered.begin(), covered.end(), Key(p))) {
      result.replicated.push_back(p.grad());
    }
  }
  return result;
}

}  // namespace

std::vector<torch::Tensor> GradientsToClip(
    const std::vector<ZeroOptimizer*>& sharded,
    const std::vector<torch::Tensor>& parameters) {
  ShardedGradients grads = CollectGradients(sharded, parameters);
  grads.pieces.insert(grads.pieces.end(), grads.replicated.begin(),
                      grads.replicated.end());
  return grads.pieces;
}

double ClipGradNormAcrossShards(Communicator& comm,
                                const std::vector<ZeroOptimizer*>& sharded,
                                const std::vector<torch::Tensor>& parameters,
                                double max_norm, double norm_type,
                                CallSite site) {
  const bool infinity = norm_type == std::numeric_limits<double>::infinity();
  if (!infinity && norm_type <= 0) {
    throw UsageError(
        "clip_grad_norm_ under ZeRO takes a positive norm_type "
        "or infinity, found " +
        std::to_string(norm_type));
  }
  ShardedGradients grads = CollectGradients(sharded, parameters);
  // This rank's part: the sum of |g|^p (or the largest |g|) over its
  // pieces, and over the replicated gradients on rank 0 only.
  double local = 0;
  const auto add = [&](const torch::Tensor& grad) {
    if (grad.numel() == 0) return;
    if (infinity) {
      const double largest = grad.abs().max().item<double>();
      // NaN wins, as in torch's norm (std::max would drop it).
      local = std::isnan(largest) || std::isnan(local)
                  ? std::numeric_limits<double>::quiet_NaN()
                  : std::max(local, largest);
    } else {
      local += std::pow(grad.norm(norm_type).item<double>(), norm_type);
    }
  };
  for (const auto& grad : grads.pieces) add(grad);
  if (comm.rank() == 0) {
    for (const auto& grad : grads.replicated) add(grad);
  }
  CollectiveOptions options;
  options.api = "clip_grad_norm_ (across ZeRO shards)";
  options.site = site;
  // With a NaN flag beside the value: a maximum over ranks may drop NaN.
  double values[2] = {std::isnan(local) ? 0.0 : local,
                      std::isnan(local) ? 1.0 : 0.0};
  AllreduceHostValues(comm, values, 2, torch::kFloat64,
                      infinity ? ReduceOp::kMax : ReduceOp::kSum, options);
  const double total = values[1] > 0 ? std::numeric_limits<double>::quiet_NaN()
                       : infinity    ? values[0]
                                     : std::pow(values[0], 1.0 / norm_type);
  // As torch's clip_grad_norm_: the coefficient in the gradients' dtype,
  // clamped to 1, multiplied into every gradient.
  torch::NoGradGuard no_grad;
  for (auto* list : {&grads.pieces, &grads.replicated}) {
    for (auto& grad : *list) {
      const torch::Tensor norm = torch::full({}, total, grad.options());
      grad.mul_(torch::clamp(max_norm / (norm + 1e-6), c10::nullopt, 1.0));
    }
  }
  return total;
}

}  // namespace accel
