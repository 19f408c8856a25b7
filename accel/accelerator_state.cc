// The Accelerator's checkpoints, weights (get_state_dict, save_model) and
// trackers, over CheckpointManager and TrackerSet (see accelerator.h).
#include <c10/util/Type.h>

#include <map>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "accel/accelerator.h"
#include "accel/checkpoint/checkpoint_manager.h"
#include "accel/core/tensor_ops.h"
#include "accel/core/tensor_split.h"
#include "accel/optim/param_state_codec.h"
#include "accel/parallel/parallel_linear.h"
#include "accel/parallel/split_dropout.h"
#include "accel/parallel/tensor_parallel.h"
#include "accel/parallel/zero.h"
#include "accel/runtime/base/logging.h"
#include "accel/tracking/tracker_set.h"

namespace accel {

void Accelerator::MakeCheckpointManager() {
  CheckpointManager::Job job;
  job.rank = process_index();
  job.size = num_processes();
  job.local_size = env_.local_world_size;
  job.comm = [this]() -> Communicator& { return communicator(); };
  job.from_main = [this](const std::string& name, const std::string& value) {
    return FromMainProcess(name, value);
  };
  checkpoints_ = std::make_unique<CheckpointManager>(
      options_.project_dir, options_.total_limit, std::move(job));
}

void Accelerator::ForEachWholeEntry(
    const torch::nn::Module& model, const char* api, CallSite site,
    const std::function<void(const std::string&, const torch::Tensor&)>& each) {
  const std::vector<StateEntry> entries = StateDict(model);
  std::map<const void*, TensorSplit> splits;
  for (const SplitParameter& split : TensorParallelSplits(model)) {
    splits.emplace(split.tensor.unsafeGetTensorImpl(), split.split);
  }
  const auto whole = [&](size_t i, const torch::Tensor& value) {
    const auto split = splits.find(entries[i].tensor.unsafeGetTensorImpl());
    if (split == splits.end()) {
      each(entries[i].name, value);
      return;
    }
    // Every rank's share, stacked in tp order, then joined.
    torch::NoGradGuard no_grad;
    const torch::Tensor shares = tp::GatherFromRegion(
        value.detach().unsqueeze(0), state_->mesh->group("tp"), 0);
    each(entries[i].name, JoinShares(shares.unbind(0), split->second));
  };
  ZeroOptimizer* zero = ParameterShardingOf(model);
  if (zero == nullptr) {
    for (size_t i = 0; i < entries.size(); ++i) whole(i, entries[i].tensor);
    return;
  }
  std::vector<torch::Tensor> tensors;
  for (const StateEntry& entry : entries) tensors.push_back(entry.tensor);
  zero->ForEachGathered(tensors, whole, api, site);
}

std::map<std::string, torch::Tensor> Accelerator::StateDictOf(
    const torch::nn::Module& model, CallSite site) {
  ZeroOptimizer* zero = ParameterShardingOf(model);
  if (zero == nullptr && TensorParallelSplits(model).empty()) {
    return StateDictOnCpu(model);
  }
  // Under ZeRO the main process keeps the whole state, as Accelerate's
  // FULL_STATE_DICT with rank0_only; with tensor parallelism alone, every
  // process (as DDP's).
  const bool keep = zero == nullptr || is_main_process();
  std::map<std::string, torch::Tensor> state;
  ForEachWholeEntry(model, "get_state_dict", site,
                    [&](const std::string& name, const torch::Tensor& value) {
                      if (!keep) return;
                      state[name] = value.detach().to(torch::kCPU, true, true);
                    });
  return state;
}

void Accelerator::SaveModelOf(const torch::nn::Module& model,
                              const std::string& dir,
                              const std::string& max_shard_size,
                              CallSite site) {
  if (ParameterShardingOf(model) == nullptr &&
      TensorParallelSplits(model).empty()) {
    if (is_main_process()) SaveModelWeights(model, dir, max_shard_size);
    return;
  }
  std::vector<std::pair<std::string, torch::Tensor>> state;
  ForEachWholeEntry(model, "save_model", site,
                    [&](const std::string& name, const torch::Tensor& value) {
                      if (!is_main_process()) return;
                      state.emplace_back(
                          name, value.detach().to(torch::kCPU, true, true));
                    });
  if (is_main_process()) SaveModelWeights(state, dir, max_shard_size);
}

void Accelerator::register_save_state_pre_hook(StateHook hook) {
  save_hooks_.push_back(std::move(hook));
}

void Accelerator::register_load_state_pre_hook(StateHook hook) {
  load_hooks_.push_back(std::move(hook));
}

CheckpointContents Accelerator::Contents() {
  CheckpointContents contents = state_->prepared.Contents();
  contents.scaler = state_->scaler;
  contents.step = step_;
  contents.run_id = run_id_;
  if (!state_->prepared.sharded_optimizers().empty()) {
    contents.zero_stage = options_.zero_stage;
  }
  contents.sharded_tensors = ShardedTensorsOfPrepared();
  if (!contents.sharded_tensors || contents.optimizers.empty()) {
    std::string why = "no optimizer is prepared";
    for (const auto& prepared : state_->prepared.optimizers()) {
      if (KnowsParamState(*prepared->optimizer)) continue;
      const torch::optim::Optimizer& optimizer = *prepared->optimizer;
      why = "the prepared optimizer " +
            c10::demangle(typeid(optimizer).name()) +
            " is not one whose state accel knows (Adam, AdamW, SGD, "
            "Adagrad, RMSprop, AdamWScheduleFree: "
            "accel/optim/param_state_codec.h)";
      break;
    }
    RefuseSplitLayers("save_state / load_state", why.c_str());
  }
  // A checkpoint of whole weights (no sharded tensors) needs stage 3's
  // units gathered around its save or load.
  contents.with_whole_models = [this](const std::function<void()>& work) {
    WithWholeParameters(work);
  };
  if (num_processes() > 1) {
    contents.all_ranks_wrote = [this](bool wrote) {
      // The lowest rank that failed, or the process count if none did.
      int32_t first = wrote ? num_processes() : process_index();
      AllreduceHostValues(communicator(), &first, 1, torch::kInt32,
                          ReduceOp::kMin,
                          At(CallSite::Here(),
                             "save_state (every process calls it: each "
                             "writes its own file, and it returns once the "
                             "checkpoint is complete)"));
      return first < num_processes() ? first : -1;
    };
  }
  return contents;
}

std::function<void(const std::string&)> Accelerator::Hooks(
    const std::vector<StateHook>& hooks) const {
  return [this, &hooks](const std::string& dir) {
    const auto models = state_->prepared.models();
    for (const StateHook& hook : hooks) hook(models, dir);
  };
}

void Accelerator::WithWholeParameters(const std::function<void()>& work) {
  std::vector<ZeroOptimizer*> sharded;
  for (ZeroOptimizer* zero : state_->prepared.sharded_optimizers()) {
    if (zero->stage() == 3) sharded.push_back(zero);
  }
  for (ZeroOptimizer* zero : sharded) zero->GatherEveryUnit();
  try {
    work();
  } catch (...) {
    // A load that failed leaves the shards as they were.
    for (ZeroOptimizer* zero : sharded) zero->ReshardEveryUnit(false);
    throw;
  }
  for (ZeroOptimizer* zero : sharded) zero->ReshardEveryUnit();
}

void Accelerator::WarnIfMidAccumulation() const {
  const GradientState& gradients = state_->gradients;
  if (!gradients.pending() || !is_main_process()) return;
  // Neither accel's checkpoints nor Accelerate's hold .grad: each rank's
  // differs, and a checkpoint is usually taken after a step.
  ACCEL_LOG(WARNING)
      << "save_state at micro-step "
      << gradients.step() % gradients.accumulation_steps() << " of "
      << gradients.accumulation_steps()
      << " of a gradient accumulation cycle: the gradients accumulated "
         "since the last optimizer step are not saved, so a run resumed "
         "from this checkpoint differs from one that goes on; save when "
         "accelerator.sync_gradients() is true, after that step";
}

void Accelerator::save_state(const std::string& dir) {
  CheckStepsComplete("save_state");
  WarnIfMidAccumulation();
  checkpoints_->Save(dir, Contents(), Hooks(save_hooks_));
}

std::string Accelerator::save_state(CallSite site) {
  CheckStepsComplete("save_state");
  WarnIfMidAccumulation();
  return checkpoints_->SaveNext(Contents(), Hooks(save_hooks_), site);
}

void Accelerator::load_state(const std::string& dir) {
  CheckpointContents contents = Contents();
  checkpoints_->Load(dir, contents, Hooks(load_hooks_), CallSite::Here());
  step_ = contents.step;
  // Random states are restored by rank number, and at another process
  // count the extra ranks find none: a tp or cp group takes its first
  // rank's, which SplitDropout needs alike.
  if (state_->mesh != nullptr) {
    AlignModelParallelGenerators(*state_->mesh, "load_state");
  }
}

std::string Accelerator::load_state(CallSite site) {
  CheckpointContents contents = Contents();
  const std::string dir =
      checkpoints_->LoadNewest(contents, Hooks(load_hooks_), site);
  if (!dir.empty()) {
    step_ = contents.step;
    if (state_->mesh != nullptr) {  // As load_state(dir) above.
      AlignModelParallelGenerators(*state_->mesh, "load_state");
    }
  }
  return dir;
}

std::string Accelerator::latest_checkpoint() const {
  return checkpoints_->Latest();
}

int64_t Accelerator::save_iteration() const {
  return checkpoints_->next_number();
}

const std::string& Accelerator::logging_dir() const {
  return options_.logging_dir.empty() ? options_.project_dir
                                      : options_.logging_dir;
}

void Accelerator::init_trackers(const std::string& project_name,
                                const TrackerValues& config) {
  trackers_->Init(project_name, config, is_main_process());
}

void Accelerator::log(const TrackerValues& values,
                      std::optional<int64_t> step) {
  trackers_->Log(values, step);
}

Tracker& Accelerator::get_tracker(const std::string& name) {
  return trackers_->Get(name, is_main_process());
}

const std::vector<std::unique_ptr<Tracker>>& Accelerator::trackers() const {
  return trackers_->started();
}

}  // namespace accel
