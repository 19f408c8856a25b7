// What prepare() and the model-taking calls recognise, at compile time:
// models (ModuleHolders and std::shared_ptr<Module>), data loaders,
// schedulers (by reference, std::unique_ptr or std::shared_ptr), and the
// tensor containers that collectives take (a tensor, a std::vector or a
// std::map of them, each collective applied to every tensor in order).
//
//   static_assert(accel::detail::IsSharedModule<std::shared_ptr<Net>>::value);
//   const torch::nn::Module* m = accel::detail::ModulePointer(model);
//   auto gathered = accel::detail::MapTensors(outputs, gather_one);
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/data/data_loader.h"
#include "accel/optim/scheduler.h"
#include "accel/runtime/base/errors.h"

namespace accel::detail {

template <typename T>
inline constexpr bool kAlwaysFalse = false;

template <typename T>
struct IsDataLoader : std::false_type {};
template <typename D, typename B>
struct IsDataLoader<DataLoader<D, B>> : std::true_type {};

template <typename T>
struct IsSharedModule : std::false_type {};
template <typename M>
struct IsSharedModule<std::shared_ptr<M>>
    : std::is_base_of<torch::nn::Module, M> {};

template <typename T>
struct IsUniquePointer : std::false_type {};
template <typename P>
struct IsUniquePointer<std::unique_ptr<P>> : std::true_type {};

// A std::unique_ptr or std::shared_ptr to a Base (or a class derived from it).
template <typename Base, typename T>
struct PointsTo : std::false_type {};
template <typename Base, typename P>
struct PointsTo<Base, std::unique_ptr<P>> : std::is_base_of<Base, P> {};
template <typename Base, typename P>
struct PointsTo<Base, std::shared_ptr<P>> : std::is_base_of<Base, P> {};

template <typename T>
struct IsScheduler : std::bool_constant<std::is_base_of_v<LRScheduler, T> ||
                                        PointsTo<LRScheduler, T>::value> {};

template <typename T>
using IsOptimizerPointer = PointsTo<torch::optim::Optimizer, T>;

template <typename M>
inline constexpr bool kIsModel =
    std::is_base_of_v<torch::detail::ModuleHolderIndicator, M> ||
    IsSharedModule<M>::value;

// The module behind any form of model.
template <typename M>
const torch::nn::Module* ModulePointer(const M& model) {
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, M>) {
    return model.ptr().get();
  } else if constexpr (IsSharedModule<M>::value) {
    return model.get();
  } else {
    static_assert(std::is_base_of_v<torch::nn::Module, M>,
                  "accel: expected a model (a ModuleHolder, a "
                  "std::shared_ptr<Module> or a Module)");
    return &model;
  }
}

// A prepared scheduler's shared handle: borrowed when the program keeps
// owning it (a reference or a std::unique_ptr lvalue), shared otherwise.
template <typename S>
std::shared_ptr<LRScheduler> SharedScheduler(S&& scheduler) {
  using U = std::decay_t<S>;
  std::shared_ptr<LRScheduler> shared;
  if constexpr (std::is_base_of_v<LRScheduler, U>) {
    static_assert(std::is_lvalue_reference_v<S>,
                  "accel: prepare() takes a scheduler object by reference, "
                  "or by std::unique_ptr / std::shared_ptr");
    shared = std::shared_ptr<LRScheduler>(&scheduler, [](LRScheduler*) {});
  } else if constexpr (std::is_lvalue_reference_v<S> &&
                       IsUniquePointer<U>::value) {
    shared = std::shared_ptr<LRScheduler>(scheduler.get(), [](LRScheduler*) {});
  } else {
    shared = std::shared_ptr<LRScheduler>(std::forward<S>(scheduler));
  }
  if (shared == nullptr) throw UsageError("prepare: the scheduler is null");
  return shared;
}

// `fn` wrapped to run only `here` (Accelerate's on_main_process & co.).
template <typename Fn>
auto OnlyOn(bool here, Fn fn) {
  return [here, fn = std::move(fn)](auto&&... args) {
    if (here) fn(std::forward<decltype(args)>(args)...);
  };
}

// The tensor containers collectives take.
template <typename T>
struct IsTensors : std::is_same<T, torch::Tensor> {};
template <>
struct IsTensors<std::vector<torch::Tensor>> : std::true_type {};
template <>
struct IsTensors<std::map<std::string, torch::Tensor>> : std::true_type {};

template <typename T>
constexpr void RequireTensors() {
  static_assert(IsTensors<T>::value,
                "accel: collectives take a torch::Tensor, a "
                "std::vector<torch::Tensor> or a std::map<std::string, "
                "torch::Tensor>");
}

// `fn` applied to each tensor, in the container's order (a std::map's key
// order), which every rank shares.
template <typename Fn>
torch::Tensor MapTensors(const torch::Tensor& tensor, Fn&& fn) {
  return fn(tensor);
}
template <typename Fn>
std::vector<torch::Tensor> MapTensors(const std::vector<torch::Tensor>& tensors,
                                      Fn&& fn) {
  std::vector<torch::Tensor> result;
  result.reserve(tensors.size());
  for (const auto& t : tensors) result.push_back(fn(t));
  return result;
}
template <typename Fn>
std::map<std::string, torch::Tensor> MapTensors(
    const std::map<std::string, torch::Tensor>& tensors, Fn&& fn) {
  std::map<std::string, torch::Tensor> result;
  for (const auto& [key, t] : tensors) result[key] = fn(t);
  return result;
}

// A braced list's tensors, each through `fn`.
template <size_t N, typename Fn>
std::array<torch::Tensor, N> MapTensorArray(const torch::Tensor (&tensors)[N],
                                            Fn&& fn) {
  std::array<torch::Tensor, N> result;
  for (size_t i = 0; i < N; ++i) result[i] = fn(tensors[i]);
  return result;
}

}  // namespace accel::detail
