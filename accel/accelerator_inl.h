// The definitions of the Accelerator's member templates (prepare, the
// collectives over tensor containers, free_memory, ...), kept out of its
// class so that accelerator.h reads as the API. Included at the end of
// accel/accelerator.h; include that, not this.
//
//   #include "accel/accelerator.h"  // brings these definitions with it
#pragma once

#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/accelerator.h"

namespace accel {

template <typename... Objects>
auto Accelerator::prepare(Objects&&... objects) {
  // All or nothing: a call that throws part way (an optimizer refused after
  // its model was prepared) leaves nothing prepared, so that the program
  // can mend what was wrong and call again.
  const PreparedObjects::Mark mark = state_->prepared.mark();
  const bool split_batches = state_->split_batches;
  try {
    (PrepareIfModel(objects), ...);
    if constexpr (sizeof...(Objects) == 1) {
      return PrepareOne(std::forward<Objects>(objects)...);
    } else {
      return std::tuple<decltype(PrepareOne(std::forward<Objects>(
          objects)))...>{PrepareOne(std::forward<Objects>(objects))...};
    }
  } catch (...) {
    state_->prepared.RollBack(mark);
    state_->split_batches = split_batches;
    throw;
  }
}

template <typename... Models>
NoSyncScope Accelerator::accumulate(Models&... models) {
  state_->gradients.Advance(/*at_loader_end=*/!joining_);
  NoSyncScope scope;
  if (!state_->gradients.sync_gradients()) {
    (scope.Add(SynchronizerOf(detail::ModulePointer(models), "accumulate")),
     ...);
  }
  return scope;
}

template <typename Model>
NoSyncScope Accelerator::no_sync(Model& model) {
  NoSyncScope scope;
  scope.Add(SynchronizerOf(detail::ModulePointer(model), "no_sync"));
  return scope;
}

template <typename... Models>
NoSyncScope Accelerator::trigger_sync_in_backward(Models&... models) {
  NoSyncScope scope;
  (scope.Add(SynchronizerOf(detail::ModulePointer(models),
                            "trigger_sync_in_backward"),
             /*enabled=*/true),
   ...);
  return scope;
}

template <typename Tensors>
Tensors Accelerator::gather(const Tensors& tensors, CallSite site) {
  detail::RequireTensors<Tensors>();
  return detail::MapTensors(tensors, [&](const torch::Tensor& t) {
    return GatherOne(t, site, "gather", /*drop_duplicates=*/false);
  });
}

template <size_t N>
std::array<torch::Tensor, N> Accelerator::gather(
    const torch::Tensor (&tensors)[N], CallSite site) {
  return detail::MapTensorArray(
      tensors, [&](const torch::Tensor& t) { return gather(t, site); });
}

template <typename Values>
Values Accelerator::gather_for_metrics(const Values& values, CallSite site) {
  if constexpr (detail::IsTensors<Values>::value) {
    return detail::MapTensors(values, [&](const torch::Tensor& t) {
      return GatherOne(t, site, "gather_for_metrics",
                       /*drop_duplicates=*/true);
    });
  } else {
    // Over the data-parallel ranks, as the tensors (gather_object itself
    // runs over every process).
    Values all =
        GatherObject(DataGroup(), values, At(site, "gather_for_metrics"));
    const int64_t keep = SamplesToKeep(static_cast<int64_t>(all.size()));
    all.resize(static_cast<size_t>(keep));
    return all;
  }
}

template <size_t N>
std::array<torch::Tensor, N> Accelerator::gather_for_metrics(
    const torch::Tensor (&tensors)[N], CallSite site) {
  return detail::MapTensorArray(tensors, [&](const torch::Tensor& t) {
    return gather_for_metrics(t, site);
  });
}

template <typename T>
std::vector<T> Accelerator::gather_object(const std::vector<T>& objects,
                                          CallSite site) {
  return GatherObject(communicator(), objects, At(site, "gather_object"));
}

template <typename T>
std::vector<T>& Accelerator::broadcast_object_list(std::vector<T>& objects,
                                                   int from_process,
                                                   CallSite site) {
  return BroadcastObjectList(communicator(), objects, from_process,
                             At(site, "broadcast_object_list"));
}

template <typename Tensors>
Tensors Accelerator::reduce(const Tensors& tensors,
                            const std::string& reduction, CallSite site) {
  detail::RequireTensors<Tensors>();
  return detail::MapTensors(tensors, [&](const torch::Tensor& t) {
    return ReduceOne(t, reduction, site);
  });
}

template <typename Tensors>
Tensors Accelerator::broadcast(const Tensors& tensors, int from_process,
                               CallSite site) {
  detail::RequireTensors<Tensors>();
  return detail::MapTensors(tensors, [&](const torch::Tensor& t) {
    return BroadcastOne(t, from_process, site);
  });
}

template <typename... Args>
void Accelerator::print(const Args&... args) const {
  if (!is_local_main_process()) return;
  std::ostringstream line;
  const char* separator = "";
  ((line << separator << args, separator = " "), ...);
  std::cout << line.str() << std::endl;
}

template <typename Fn>
auto Accelerator::on_process(Fn fn, int process_index) const {
  return detail::OnlyOn(process_index == this->process_index(), std::move(fn));
}

template <typename Fn>
auto Accelerator::on_local_process(Fn fn, int local_process_index) const {
  return detail::OnlyOn(local_process_index == this->local_process_index(),
                        std::move(fn));
}

template <typename Items>
Items Accelerator::split_between_processes(const Items& items,
                                           bool apply_padding) const {
  return split::Split(items, process_index(), num_processes(), apply_padding);
}

template <typename T>
void Accelerator::register_for_checkpointing(T& object) {
  static_assert(std::is_invocable_v<decltype(&T::save), const T&,
                                    torch::serialize::OutputArchive&> &&
                    std::is_invocable_v<decltype(&T::load), T&,
                                        torch::serialize::InputArchive&>,
                "register_for_checkpointing needs an object with "
                "save(torch::serialize::OutputArchive&) const and "
                "load(torch::serialize::InputArchive&)");
  state_->prepared.AddObject(
      {[&object](torch::serialize::OutputArchive& a) { object.save(a); },
       [&object](torch::serialize::InputArchive& a) { object.load(a); }});
}

template <typename Dataset, typename Batch>
DataLoader<Dataset, Batch> Accelerator::skip_first_batches(
    const DataLoader<Dataset, Batch>& loader, int64_t batches) const {
  return loader.SkipFirstBatches(batches);
}

template <typename Model>
std::map<std::string, torch::Tensor> Accelerator::get_state_dict(
    const Model& model, CallSite site) {
  return StateDictOf(*detail::ModulePointer(model), site);
}

template <typename Model>
void Accelerator::save_model(const Model& model, const std::string& dir,
                             const std::string& max_shard_size, CallSite site) {
  SaveModelOf(*detail::ModulePointer(model), dir, max_shard_size, site);
}

template <typename T>
void Accelerator::save(const T& value, const std::string& path) const {
  if (!is_main_process()) return;
  std::ostringstream bytes;
  torch::save(value, bytes);
  WriteFileAtomically(path, bytes.str());
}

template <typename... Handles>
Accelerator::FreedMemory Accelerator::free_memory(Handles&... handles) {
  TensorCensus census;
  (CountHandle(census, handles), ...);
  FreedMemory freed = ForgetPreparedObjects(census);
  (ResetHandle(handles), ...);
  freed.handles = static_cast<int>(sizeof...(Handles));
  freed.bytes = census.FreedBytes();
  return freed;
}

template <typename T>
void Accelerator::PrepareIfModel(const T& object) {
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, T>) {
    PrepareModule(object.ptr());
  } else if constexpr (detail::IsSharedModule<T>::value) {
    PrepareModule(object);
  }
}

template <typename T>
auto Accelerator::PrepareOne(T&& object) {
  using U = std::decay_t<T>;
  if constexpr (detail::kIsModel<U>) {
    U copy = object;
    return copy;
  } else if constexpr (std::is_base_of_v<torch::optim::Optimizer, U>) {
    static_assert(std::is_lvalue_reference_v<T>,
                  "accel: prepare() takes optimizers by reference; keep the "
                  "optimizer in a variable that outlives the training loop");
    return AcceleratedOptimizer<U>(state_, PrepareOptimizer(object));
  } else if constexpr (detail::IsDataLoader<U>::value) {
    U configured = object;
    const DataLoaderConfiguration& config = options_.dataloader_config;
    DataLoaderOptions& loader = configured.mutable_options();
    if (config.split_batches) loader.split_batches = true;
    if (!config.even_batches) loader.even_batches = false;
    if (config.data_seed) loader.seed = *config.data_seed;
    if (!config.non_blocking) loader.pin_memory = false;
    U sharded = configured.Shard(
        data_parallel_index(), data_parallel_size(), device_,
        std::shared_ptr<GradientState>(state_, &state_->gradients));
    if (config.dispatch_batches && use_distributed()) {
      if (!sharded.options().even_batches) {
        throw UsageError(
            "prepare: dataloader_config.dispatch_batches needs "
            "even_batches: every process takes each batch the main "
            "process sends");
      }
      sharded.DispatchFromMainProcess(
          [this](const torch::Tensor& t) { return FromMainProcessTensor(t); });
    }
    PrepareLoader(sharded.state(), sharded.options().split_batches);
    return sharded;
  } else if constexpr (detail::IsScheduler<U>::value) {
    std::shared_ptr<LRScheduler> shared =
        detail::SharedScheduler(std::forward<T>(object));
    state_->prepared.AddScheduler(shared);
    return AcceleratedScheduler(state_, std::move(shared));
  } else {
    static_assert(detail::kAlwaysFalse<T>,
                  "accel: prepare() takes models (torch::nn::ModuleHolder "
                  "or std::shared_ptr<Module>), optimizers, "
                  "accel::DataLoader and accel::LRScheduler");
    return 0;  // Keeps the compiler from adding errors after this one.
  }
}

template <typename Handle>
void Accelerator::CountHandle(TensorCensus& census, Handle& handle) {
  if constexpr (std::is_base_of_v<AcceleratedOptimizerBase, Handle>) {
    if (handle.torch_optimizer() != nullptr) {
      census.AddOptimizer(*handle.torch_optimizer());
    }
  } else if constexpr (detail::IsOptimizerPointer<Handle>::value) {
    if (handle != nullptr) census.AddOptimizer(*handle);
  }
}

template <typename Handle>
void Accelerator::ResetHandle(Handle& handle) {
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator,
                                  Handle>) {
    handle = nullptr;
  } else {
    // std::shared_ptr, std::unique_ptr, AcceleratedOptimizer,
    // AcceleratedScheduler.
    handle.reset();
  }
}

}  // namespace accel
