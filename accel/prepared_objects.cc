#include "accel/prepared_objects.h"

#include <string>

#include "accel/runtime/base/errors.h"

namespace accel {

void PreparedObjects::AddModel(
    std::shared_ptr<torch::nn::Module> model,
    std::unique_ptr<GradientSynchronizer> synchronizer) {
  models_.push_back({std::move(model), std::move(synchronizer)});
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

GradientSynchronizer* PreparedObjects::SynchronizerOf(
    const torch::nn::Module* model, const char* operation) const {
  for (const Model& entry : models_) {
    if (entry.module.get() == model) return entry.synchronizer.get();
  }
  throw UsageError(std::string(operation) +
                   ": the model was not prepared by this Accelerator; pass "
                   "the model that prepare() returned");
}

std::vector<GradientSynchronizer*> PreparedObjects::synchronizers() const {
  std::vector<GradientSynchronizer*> all;
  for (const Model& entry : models_) {
    if (entry.synchronizer != nullptr) all.push_back(entry.synchronizer.get());
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

void PreparedObjects::Clear() {
  models_.clear();
  optimizers_.clear();
  schedulers_.clear();
  loaders_.clear();
  objects_.clear();
}

}  // namespace accel
