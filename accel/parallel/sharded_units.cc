#include "accel/parallel/sharded_units.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <mutex>
#include <unordered_map>
#include <utility>

#include "accel/memory/activation_checkpoint.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// What accel knows of a module: marked by fully_shard, attached as a unit.
// Keyed by address, checked against a weak reference so that a module
// created where a dead one was is not taken for it.
struct UnitEntry {
  std::weak_ptr<torch::nn::Module> module;
  bool marked = false;
  FullyShardOptions options;
  std::weak_ptr<UnitRunner> runner;
  size_t index = 0;
};

class UnitRegistry {
 public:
  static UnitRegistry& Get() {
    static UnitRegistry* registry = new UnitRegistry();
    return *registry;
  }

  void Mark(const std::shared_ptr<torch::nn::Module>& module,
            const FullyShardOptions& options) {
    std::lock_guard<std::mutex> lock(mutex_);
    UnitEntry& entry = EntryOf(module);
    entry.marked = true;
    entry.options = options;
  }
  bool RecomputesActivations(const torch::nn::Module& module) {
    std::lock_guard<std::mutex> lock(mutex_);
    const UnitEntry* entry = Find(module);
    return entry != nullptr && entry->options.activation_checkpointing;
  }
  bool ReshardsAfterForward(const torch::nn::Module& module) {
    std::lock_guard<std::mutex> lock(mutex_);
    const UnitEntry* entry = Find(module);
    return entry == nullptr || entry->options.reshard_after_forward;
  }
  bool Marked(const torch::nn::Module& module) {
    std::lock_guard<std::mutex> lock(mutex_);
    const UnitEntry* entry = Find(module);
    return entry != nullptr && entry->marked;
  }
  void Attach(const std::shared_ptr<torch::nn::Module>& module,
              std::weak_ptr<UnitRunner> runner, size_t index) {
    std::lock_guard<std::mutex> lock(mutex_);
    UnitEntry& entry = EntryOf(module);
    entry.runner = std::move(runner);
    entry.index = index;
  }
  // The runner of an attached unit (null otherwise) and its index.
  std::shared_ptr<UnitRunner> RunnerOf(const torch::nn::Module& module,
                                       size_t* index) {
    std::lock_guard<std::mutex> lock(mutex_);
    const UnitEntry* entry = Find(module);
    if (entry == nullptr) return nullptr;
    *index = entry->index;
    return entry->runner.lock();
  }

 private:
  const UnitEntry* Find(const torch::nn::Module& module) {
    auto found = entries_.find(&module);
    if (found == entries_.end()) return nullptr;
    if (found->second.module.lock().get() != &module) {
      entries_.erase(found);
      return nullptr;
    }
    return &found->second;
  }
  UnitEntry& EntryOf(const std::shared_ptr<torch::nn::Module>& module) {
    // Entries of modules that are gone go first, so that the map holds
    // only live ones.
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.module.expired() ? entries_.erase(it) : std::next(it);
    }
    UnitEntry& entry = entries_[module.get()];
    if (entry.module.lock() != module) {
      entry = UnitEntry();
      entry.module = module;
    }
    return entry;
  }

  std::mutex mutex_;
  std::unordered_map<const torch::nn::Module*, UnitEntry> entries_;
};

bool HasTrainableParameters(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

// "torch::nn::TransformerEncoderLayerImpl" and "TransformerEncoderLayer"
// name the same type.
std::string BareTypeName(std::string name) {
  const size_t colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  const std::string impl = "Impl";
  if (name.size() > impl.size() &&
      name.compare(name.size() - impl.size(), impl.size(), impl) == 0) {
    name.resize(name.size() - impl.size());
  }
  return name;
}

bool AnyMarked(torch::nn::Module& model) {
  for (const auto& module : model.modules(/*include_self=*/true)) {
    if (UnitRegistry::Get().Marked(*module)) return true;
  }
  return false;
}

class UnitPicker {
 public:
  enum class Policy { kMarked, kLayerType, kContainers };

  UnitPicker(Policy policy, std::string layer_type)
      : policy_(policy), layer_type_(std::move(layer_type)) {}

  void Visit(torch::nn::Module& module, const std::string& path) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module);
    if (sequential != nullptr) return VisitSequential(*sequential, path);
    const bool list =
        dynamic_cast<torch::nn::ModuleListImpl*>(&module) != nullptr;
    for (const auto& child : module.named_children()) {
      const std::string child_path = Join(path, child.key());
      if (list && policy_ == Policy::kContainers) {
        if (HasTrainableParameters(*child.value())) {
          units_.push_back({child.value(), child_path});
        }
      } else if (Picks(*child.value())) {
        units_.push_back({child.value(), child_path});
      } else {
        Visit(*child.value(), child_path);
      }
    }
  }

  std::vector<ShardedUnit> TakeUnits() { return std::move(units_); }

 private:
  static std::string Join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  }

  // Whether a module met anywhere (not as a container's entry) is a unit.
  bool Picks(const torch::nn::Module& module) const {
    if (!HasTrainableParameters(module)) return false;
    switch (policy_) {
      case Policy::kMarked:
        return UnitRegistry::Get().Marked(module);
      case Policy::kLayerType:
        return BareTypeName(module.name()) == layer_type_;
      case Policy::kContainers:
        return false;
    }
    return false;
  }

  // A Sequential's children are registered in the order it runs them; the
  // ones that become units run through a ShardedUnit put in their place.
  void VisitSequential(torch::nn::SequentialImpl& sequential,
                       const std::string& path) {
    const auto names = sequential.named_children();
    size_t i = 0;
    for (torch::nn::AnyModule& entry : sequential) {
      const std::string child_path = Join(path, names[i++].key());
      // Wrapped by an earlier prepare() that then failed and was undone:
      // the unit is the layer inside, wrapped once.
      if (const auto* wrapped =
              dynamic_cast<const ShardedUnitImpl*>(entry.ptr().get())) {
        units_.push_back({wrapped->layer().ptr(), child_path});
        continue;
      }
      const std::shared_ptr<torch::nn::Module> layer = entry.ptr();
      const bool picked = policy_ == Policy::kContainers
                              ? HasTrainableParameters(*layer)
                              : Picks(*layer);
      if (picked) {
        units_.push_back({layer, child_path});
        entry = torch::nn::AnyModule(std::make_shared<ShardedUnitImpl>(entry));
      } else if (policy_ != Policy::kContainers) {
        Visit(*layer, child_path);
      }
    }
  }

  const Policy policy_;
  const std::string layer_type_;  // Bare.
  std::vector<ShardedUnit> units_;
};

}  // namespace

void fully_shard(const std::shared_ptr<torch::nn::Module>& module,
                 const FullyShardOptions& options) {
  if (module == nullptr) throw UsageError("fully_shard: the module is null");
  UnitRegistry::Get().Mark(module, options);
}

std::vector<ShardedUnit> WrapUnits(torch::nn::Module& model,
                                   const std::string& layer_type) {
  using Policy = UnitPicker::Policy;
  const Policy policy = AnyMarked(model)      ? Policy::kMarked
                        : !layer_type.empty() ? Policy::kLayerType
                                              : Policy::kContainers;
  UnitPicker picker(policy, BareTypeName(layer_type));
  picker.Visit(model, "");
  return picker.TakeUnits();
}

void AttachUnit(const ShardedUnit& unit, std::weak_ptr<UnitRunner> runner,
                size_t index) {
  UnitRegistry::Get().Attach(unit.module, std::move(runner), index);
}

bool IsAttached(const ShardedUnit& unit) {
  size_t index = 0;
  return UnitRegistry::Get().RunnerOf(*unit.module, &index) != nullptr;
}

ShardedUnitImpl::ShardedUnitImpl(torch::nn::AnyModule layer)
    : layer_(std::move(layer)) {}

torch::Tensor ShardedUnitImpl::forward(torch::Tensor input) {
  // Kept by accel::checkpoint until backward: the wrapper lives as long as
  // the model.
  const auto call_forward = [this](torch::Tensor x) {
    return layer_.forward<torch::Tensor>(std::move(x));
  };
  return unit_internal::RunUnit<torch::Tensor>(*layer_.ptr(), call_forward,
                                               std::move(input));
}

namespace unit_internal {

bool RecomputesActivations(const torch::nn::Module& module) {
  return torch::GradMode::is_enabled() &&
         UnitRegistry::Get().RecomputesActivations(module);
}

void RefuseCheckpointOfPair(const torch::nn::Module& module) {
  throw UsageError("fully_shard(" + module.name() +
                   ", {.activation_checkpointing = true}): its forward "
                   "returns a std::pair, which accel::checkpoint cannot "
                   "return; return a std::tuple of tensors instead");
}

UnitCall::UnitCall(const torch::nn::Module& module) {
  runner_ = UnitRegistry::Get().RunnerOf(module, &index_);
  if (runner_ == nullptr) return;
  // A forward that activation checkpointing re-runs in backward: its
  // backward follows at once, so the parameters are gathered as for
  // backward (the previous unit prefetched) and stay until their gradients
  // are in.
  recomputing_ = InActivationRecompute();
  // Kept gathered only for a backward that follows and frees it.
  reshard_ = !torch::GradMode::is_enabled() ||
             UnitRegistry::Get().ReshardsAfterForward(module);
  if (recomputing_) {
    runner_->BeforeBackward(index_);
  } else {
    runner_->BeforeForward(index_);
  }
}

std::optional<c10::ScalarType> UnitCall::input_dtype() const {
  return runner_ != nullptr ? runner_->InputDtype(index_) : std::nullopt;
}

UnitCall::~UnitCall() {
  if (runner_ != nullptr && !recomputing_ && reshard_) {
    runner_->AfterForward(index_);
  }
}

void UnitCall::HookOutput(const torch::Tensor& output) {
  // The gradient reaching the output comes just before the layer's own
  // backward, which needs the parameters again.
  if (runner_ == nullptr || !output.defined() || !output.requires_grad()) {
    return;
  }
  output.register_hook([weak = std::weak_ptr<UnitRunner>(runner_),
                        index = index_](const torch::Tensor& /*grad*/) {
    if (auto alive = weak.lock()) alive->BeforeBackward(index);
  });
}

void UnitCall::Finish() {
  if (runner_ == nullptr) return;
  std::shared_ptr<UnitRunner> runner = std::move(runner_);
  runner_.reset();
  if (!recomputing_ && reshard_) runner->AfterForward(index_);
}

}  // namespace unit_internal
}  // namespace accel
