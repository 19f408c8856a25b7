// prepare()'s work on each kind of object (accel/accelerator.h): a model
// gets rank 0's weights and its gradient reducer (DDP buckets, the invariant
// reduction, or ZeRO stage 3's units), an optimizer is registered or sharded
// under ZeRO, a loader is recorded.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "accel/accelerator.h"
#include "accel/checkpoint/state_dict.h"
#include "accel/core/tensor_ops.h"
#include "accel/parallel/invariant_reduction.h"
#include "accel/parallel/sharded_units.h"
#include "accel/parallel/split_dropout.h"
#include "accel/parallel/zero.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel {
namespace {

// The module's parameters, each once: LibTorch lists a weight registered
// under two names (tied) twice, and a gradient hook registered twice on it
// made DDP's buckets launch before every gradient was in.
std::vector<torch::Tensor> UniqueParameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> unique;
  std::set<const void*> seen;
  for (const torch::Tensor& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  return unique;
}

// mixed_precision_policy.buffer_dtype: before the buffers are broadcast.
void CastFloatingBuffers(torch::nn::Module& module, c10::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor& buffer : module.buffers()) {
    if (buffer.is_floating_point() && buffer.scalar_type() != dtype) {
      buffer.set_data(buffer.to(dtype));
    }
  }
}

}  // namespace

void Accelerator::PrepareModule(
    const std::shared_ptr<torch::nn::Module>& module) {
  if (module == nullptr) throw UsageError("prepare: the model is null");
  if (state_->prepared.Holds(module.get())) {
    // A second synchronizer would reduce every gradient twice.
    throw UsageError(
        "prepare: the model was prepared already (by an earlier prepare() or "
        "twice in this one); use the model prepare() returned, or "
        "free_memory() it before preparing it again");
  }
  module->to(device_);
  const MixedPrecisionPolicy policy = PrecisionPolicy();
  if (policy.buffer_dtype) CastFloatingBuffers(*module, *policy.buffer_dtype);
  AutocastThisThread();
  const int micro_batches = options_.invariant_micro_batches;
  if (num_processes() == 1) {
    state_->prepared.AddModel(
        module, micro_batches == 0
                    ? nullptr
                    : std::make_unique<InvariantGradientReducer>(
                          nullptr, UniqueParameters(*module), micro_batches,
                          module->buffers(), false));
    return;
  }
  // Every rank starts from rank 0's weights, as DDP does at wrap time: in
  // buckets, so that a model of many tensors costs a few collectives.
  std::vector<std::string> names;
  std::vector<torch::Tensor> tensors;
  for (const StateEntry& entry : StateDict(*module)) {
    names.push_back(entry.name);
    tensors.push_back(entry.tensor);
  }
  // Within the ranks that hold the same tensor-parallel slice.
  BroadcastCoalesced(GradientGroup(), names, tensors, 0,
                     At(CallSite::Here(), "prepare"));
  // The ranks of a tp or cp group drop alike only with alike generators
  // (accel/parallel/split_dropout.h), whatever seed each was given.
  if (state_->mesh != nullptr) {
    AlignModelParallelGenerators(*state_->mesh, "prepare");
  }
  std::vector<ShardedUnit> units;
  if (options_.zero_stage == 3) {
    units = WrapUnits(*module, options_.fsdp_layer_to_wrap);
    if (units.empty()) {
      throw UsageError(
          "prepare: ZeRO stage 3 shards parameters unit by unit, but the "
          "model has no " +
          (options_.fsdp_layer_to_wrap.empty()
               ? std::string("Sequential child or ModuleList entry with "
                             "trainable parameters, and no module marked "
                             "with accel::fully_shard,")
               : "module of type '" + options_.fsdp_layer_to_wrap +
                     "' (--fsdp_transformer_layer_cls_to_wrap) with "
                     "trainable parameters") +
          " to make a unit of (docs/parallelism.md, \"Units\")");
    }
  }
  std::unique_ptr<GradientReducer> reducer;
  if (micro_batches != 0) {
    reducer = std::make_unique<InvariantGradientReducer>(
        &communicator(), UniqueParameters(*module), micro_batches,
        module->buffers(), options_.gradient_sync.broadcast_buffers);
  } else {
    GradientSyncOptions sync = options_.gradient_sync;
    sync.reduce_dtype = policy.reduce_dtype;
    reducer = std::make_unique<GradientSynchronizer>(
        GradientGroup(), UniqueParameters(*module), sync, module->buffers());
  }
  state_->prepared.AddModel(module, std::move(reducer), std::move(units));
}

// torch.optim refuses a parameter in two param groups at construction;
// LibTorch does not, and the optimizer then steps it twice, and its state
// would be saved twice. Refused here, naming the parameter.
void Accelerator::RefuseRepeatedParameters(
    const torch::optim::Optimizer& optimizer) const {
  std::set<const void*> seen;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) continue;
      std::string name = "of shape " + c10::str(p.sizes());
      for (const auto& model : state_->prepared.models()) {
        for (const auto& named : model->named_parameters()) {
          if (named.value().is_same(p)) name = "'" + named.key() + "'";
        }
      }
      throw UsageError(
          "prepare: the optimizer holds parameter " + name +
          " twice (in one param group or two); torch.optim refuses that too. "
          "Build it over each parameter once (a tied weight registered under "
          "two names comes twice from model->parameters(): list it once)");
    }
  }
}

std::shared_ptr<PreparedOptimizer> Accelerator::PrepareOptimizer(
    torch::optim::Optimizer& optimizer) {
  const int stage = options_.zero_stage;
  if (stage != 0 && num_processes() == 1 && is_main_process()) {
    ACCEL_LOG(INFO) << "zero_stage " << stage
                    << " with one process: nothing to shard, the optimizer "
                       "runs as it is";
  }
  RefuseRepeatedParameters(optimizer);
  if (stage == 0 || num_processes() == 1) {
    return state_->prepared.AddOptimizer(optimizer);
  }
  // Every check before anything changes, the same on every rank.
  std::shared_ptr<torch::nn::Module> model;
  size_t index = 0;
  const auto refuse = [&](const std::string& why) {
    throw UsageError("prepare: under ZeRO stage " + std::to_string(stage) +
                     " the optimizer's parameter " + std::to_string(index) +
                     " " + why);
  };
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      std::shared_ptr<torch::nn::Module> holder =
          state_->prepared.ModelHolding(p);
      if (holder == nullptr) {
        refuse(
            "is not a parameter of a prepared model; prepare the model first "
            "(prepare(model, optimizer)) and build the optimizer over the "
            "model's own parameters");
      }
      for (const ZeroOptimizer* other : state_->prepared.sharded_optimizers()) {
        for (const torch::Tensor& sharded : other->parameters()) {
          if (!sharded.is_same(p)) continue;
          refuse(
              "is already sharded by another prepared optimizer; each "
              "parameter belongs to one optimizer (give each optimizer its "
              "own parameters)");
        }
      }
      if (model == nullptr) model = holder;
      ++index;
    }
  }
  if (model == nullptr) return state_->prepared.AddOptimizer(optimizer);
  const auto& units = state_->prepared.UnitsOf(model.get());
  std::vector<std::vector<torch::Tensor>> unit_parameters;
  for (const auto& unit : units) {
    unit_parameters.push_back(unit.module->parameters());
  }
  const MixedPrecisionPolicy policy = PrecisionPolicy();
  auto zero = std::make_shared<ZeroOptimizer>(
      ShardGroup(), stage, optimizer, model->parameters(), unit_parameters,
      ZeroPrecision{policy.param_dtype, policy.reduce_dtype,
                    policy.cast_forward_inputs});
  if (Communicator* replicas = ReplicaGroup()) {
    zero->ReplicateAcross(*replicas, GradientGroup());
  }
  for (size_t u = 0; u < units.size(); ++u) {
    AttachUnit(units[u], zero->unit_runner(), u);
  }
  std::map<const void*, std::string> names;
  for (const auto& named : model->named_parameters()) {
    names.emplace(named.value().unsafeGetTensorImpl(), named.key());
  }
  zero->NameReleasedParameters(names);
  if (stage >= 2) {
    state_->prepared.ReplaceSynchronizer(
        model.get(),
        zero->MakeGradientReducer(model->buffers(), options_.gradient_sync));
  } else if (zero->mixed_precision()) {
    // The parameters changed dtype: DDP's buckets and hooks are made anew.
    GradientSyncOptions sync = options_.gradient_sync;
    sync.reduce_dtype = policy.reduce_dtype;
    state_->prepared.ReplaceSynchronizer(
        model.get(),
        std::make_unique<GradientSynchronizer>(
            GradientGroup(), UniqueParameters(*model), sync, model->buffers()));
  }
  if (zero->mixed_precision() && is_main_process()) {
    ACCEL_LOG(INFO) << "mixed precision under ZeRO stage " << stage
                    << ": parameters computed in "
                    << c10::toString(*policy.param_dtype)
                    << ", gradients reduced in "
                    << c10::toString(*policy.reduce_dtype)
                    << ", the optimizer steps master shards in their own "
                       "dtype";
  }
  std::shared_ptr<PreparedOptimizer> prepared =
      state_->prepared.AddOptimizer(optimizer);
  prepared->zero = std::move(zero);
  return prepared;
}

void Accelerator::PrepareLoader(std::shared_ptr<DataLoaderState> state,
                                bool split_batches) {
  state_->prepared.AddLoader(std::move(state));
  if (split_batches) state_->split_batches = true;
}

GradientReducer* Accelerator::SynchronizerOf(const torch::nn::Module* model,
                                             const char* operation) {
  return state_->prepared.SynchronizerOf(model, operation);
}

}  // namespace accel
