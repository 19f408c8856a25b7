// The one registry of what an Accelerator prepared: models (each with its
// gradient synchronizer when several processes run), optimizers,
// schedulers, data loaders and the objects registered for checkpointing.
// Preparation adds to it, the training step and the prepared wrappers read
// it, save_state and load_state see it through Contents(), and
// free_memory() clears it in one call.
//
//   PreparedObjects prepared;
//   prepared.AddModel(net, std::move(synchronizer));
//   auto optimizer = prepared.AddOptimizer(adamw);
//   for (GradientReducer* s : prepared.synchronizers()) s->finish();
//   CheckpointContents contents = prepared.Contents();
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "accel/checkpoint/checkpoint.h"
#include "accel/data/data_loader_state.h"
#include "accel/optim/scheduler.h"
#include "accel/parallel/gradient_sync.h"
#include "accel/parallel/sharded_units.h"
#include "accel/parallel/zero.h"

namespace accel {

// What the Accelerator knows of a prepared optimizer.
struct PreparedOptimizer {
  torch::optim::Optimizer* optimizer = nullptr;
  bool step_was_skipped = false;
  // Under ZeRO stages 1-2 (several processes): what this rank steps.
  std::shared_ptr<ZeroOptimizer> zero;
};

class PreparedObjects {
 public:
  PreparedObjects() = default;
  PreparedObjects(const PreparedObjects&) = delete;
  PreparedObjects& operator=(const PreparedObjects&) = delete;

  // `synchronizer` is null with one process; `units` are the model's
  // ZeRO-3 units (sharded_units.h), if any.
  void AddModel(std::shared_ptr<torch::nn::Module> model,
                std::unique_ptr<GradientReducer> synchronizer,
                std::vector<ShardedUnit> units = {});
  const std::vector<ShardedUnit>& UnitsOf(const torch::nn::Module* model) const;
  std::shared_ptr<PreparedOptimizer> AddOptimizer(
      torch::optim::Optimizer& optimizer);
  void AddScheduler(std::shared_ptr<LRScheduler> scheduler);
  void AddLoader(std::shared_ptr<DataLoaderState> loader);
  void AddObject(CheckpointObject object);

  // The prepared model's synchronizer: null with one process; UsageError
  // naming `operation` for a model this registry does not hold.
  GradientReducer* SynchronizerOf(const torch::nn::Module* model,
                                  const char* operation) const;
  std::vector<GradientReducer*> synchronizers() const;
  // The prepared model holding `parameter` (by identity), or null.
  std::shared_ptr<torch::nn::Module> ModelHolding(
      const torch::Tensor& parameter) const;
  // Replaces a prepared model's reducer (ZeRO stage 2 takes over DDP's).
  void ReplaceSynchronizer(const torch::nn::Module* model,
                           std::unique_ptr<GradientReducer> synchronizer);
  // The ZeRO-sharded optimizers.
  std::vector<ZeroOptimizer*> sharded_optimizers() const;
  std::vector<std::shared_ptr<torch::nn::Module>> models() const;
  const std::vector<std::shared_ptr<PreparedOptimizer>>& optimizers() const {
    return optimizers_;
  }
  // Whether any prepared optimizer skipped its last step (fp16 overflow).
  bool any_step_skipped() const;

  // What a checkpoint holds of these objects (scaler, step and run id are
  // the caller's to fill in).
  CheckpointContents Contents() const;
  // Stops every model's gradient sync for good (the job is left).
  void DropSynchronizers();
  int scheduler_count() const { return static_cast<int>(schedulers_.size()); }
  int loader_count() const { return static_cast<int>(loaders_.size()); }
  const std::vector<std::shared_ptr<DataLoaderState>>& loaders() const {
    return loaders_;
  }
  // Forgets everything (the objects stay the program's).
  void Clear();

  // How much the registry holds: prepare() takes a mark before it starts
  // and, if it throws part way, rolls back to it, so that a failed call
  // leaves nothing prepared (a model prepared again would reduce its
  // gradients twice).
  struct Mark {
    size_t models = 0, optimizers = 0, schedulers = 0, loaders = 0, objects = 0;
  };
  Mark mark() const;
  // Forgets what was added since `mark`; a ZeRO optimizer among it gives
  // its parameters back whole first, as free_memory() does.
  void RollBack(const Mark& mark);
  // Whether `model` is a prepared model (by identity).
  bool Holds(const torch::nn::Module* model) const;

 private:
  struct Model {
    std::shared_ptr<torch::nn::Module> module;
    std::unique_ptr<GradientReducer> synchronizer;
    std::vector<ShardedUnit> units;
  };
  std::vector<Model> models_;
  std::vector<std::shared_ptr<PreparedOptimizer>> optimizers_;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<std::shared_ptr<DataLoaderState>> loaders_;
  std::vector<CheckpointObject> objects_;
};

}  // namespace accel
