#include "accel/prepared_objects.h"

#include <algorithm>
#include <string>

#include "accel/runtime/base/errors.h"

namespace accel {

void PreparedObjects::AddModel(std::shared_ptr<torch::nn::Module> model,
                               std::unique_ptr<GradientReducer> synchronizer,
                               std::vector<ShardedUnit> units) {
  models_.push_back(
      {std::move(model), std::move(synchronizer), std::move(units)});
}

const std::vector<ShardedUnit>& PreparedObjects::UnitsOf(
    const torch::nn::Module* model) const {
  static const std::vector<ShardedUnit> none;
  for (const Model& entry : models_) {
    if (entry.module.get() == model) return entry.units;
  }
  return none;
}

std::shared_ptr<PreparedOptimizer> PreparedObjects::AddOptimizer(
    torch::optim::Optimizer& optimizer) {
  auto prepared = std::make_shared<PreparedOptimizer>();
  prepared->optimizer = &optimizer;
  optimizers_.push_back(prepared);
  return prepared;
}

void PreparedObjects::AddScheduler(std::shared_ptr<LRScheduler> scheduler) {
  schedulers_.push_back(std::move(scheduler));
}

void PreparedObjects::AddLoader(std::shared_ptr<DataLoaderState> loader) {
  loaders_.push_back(std::move(loader));
}

void PreparedObjects::AddObject(CheckpointObject object) {
  objects_.push_back(std::move(object));
}

GradientReducer* PreparedObjects::SynchronizerOf(const torch::nn::Module* model,
                                                 const char* operation) const {
  for (const Model& entry : models_) {
    if (entry.module.get() == model) return entry.synchronizer.get();
  }
  throw UsageError(std::string(operation) +
                   ": the model was not prepared by this Accelerator; pass "
                   "the model that prepare() returned");
}

std::vector<GradientReducer*> PreparedObjects::synchronizers() const {
  std::vector<GradientReducer*> all;
  for (const Model& entry : models_) {
    if (entry.synchronizer != nullptr) all.push_back(entry.synchronizer.get());
  }
  return all;
}

std::shared_ptr<torch::nn::Module> PreparedObjects::ModelHolding(
    const torch::Tensor& parameter) const {
  for (const Model& entry : models_) {
    for (const torch::Tensor& p : entry.module->parameters()) {
      if (p.is_same(parameter)) return entry.module;
    }
  }
  return nullptr;
}

void PreparedObjects::ReplaceSynchronizer(
    const torch::nn::Module* model,
    std::unique_ptr<GradientReducer> synchronizer) {
  for (Model& entry : models_) {
    if (entry.module.get() == model)
      entry.synchronizer = std::move(synchronizer);
  }
}

std::vector<ZeroOptimizer*> PreparedObjects::sharded_optimizers() const {
  std::vector<ZeroOptimizer*> all;
  for (const auto& prepared : optimizers_) {
    if (prepared->zero != nullptr) all.push_back(prepared->zero.get());
  }
  return all;
}

std::vector<std::shared_ptr<torch::nn::Module>> PreparedObjects::models()
    const {
  std::vector<std::shared_ptr<torch::nn::Module>> all;
  for (const Model& entry : models_) all.push_back(entry.module);
  return all;
}

bool PreparedObjects::any_step_skipped() const {
  for (const auto& prepared : optimizers_) {
    if (prepared->step_was_skipped) return true;
  }
  return false;
}

CheckpointContents PreparedObjects::Contents() const {
  CheckpointContents contents;
  contents.models = models();
  for (const auto& prepared : optimizers_) {
    contents.optimizers.push_back(prepared->optimizer);
  }
  contents.schedulers = schedulers_;
  contents.loaders = loaders_;
  contents.objects = objects_;
  return contents;
}

void PreparedObjects::DropSynchronizers() {
  for (Model& entry : models_) entry.synchronizer.reset();
}

PreparedObjects::Mark PreparedObjects::mark() const {
  return {models_.size(), optimizers_.size(), schedulers_.size(),
          loaders_.size(), objects_.size()};
}

void PreparedObjects::RollBack(const Mark& mark) {
  for (size_t i = mark.optimizers; i < optimizers_.size(); ++i) {
    if (optimizers_[i]->zero != nullptr)
      optimizers_[i]->zero->ReturnParameters();
  }
  // Newest first: a model's synchronizer removes its hooks as it goes.
  while (models_.size() > mark.models) models_.pop_back();
  optimizers_.resize(std::min(optimizers_.size(), mark.optimizers));
  schedulers_.resize(std::min(schedulers_.size(), mark.schedulers));
  loaders_.resize(std::min(loaders_.size(), mark.loaders));
  objects_.resize(std::min(objects_.size(), mark.objects));
}

bool PreparedObjects::Holds(const torch::nn::Module* model) const {
  for (const Model& entry : models_) {
    if (entry.module.get() == model) return true;
  }
  return false;
}

void PreparedObjects::Clear() {
  models_.clear();
  optimizers_.clear();
  schedulers_.clear();
  loaders_.clear();
  objects_.clear();
}

}  // namespace accel
