// ZeRO stage 3 (FSDP's FULL_SHARD) units: the layers whose parameters are
// gathered just before they run and freed just after. LibTorch modules have
// no forward hooks, so a unit's forward runs through accel: a Sequential's
// child is wrapped in a ShardedUnit in its place (nothing to change in the
// model), and a layer that a hand-written forward calls is called through
// accel::forward (one line per call). The layer itself stays registered
// where it was, so parameter names, state dicts and checkpoints are those
// of the unwrapped model.
//
//   struct GptImpl : torch::nn::Module {
//     torch::Tensor forward(torch::Tensor tokens, torch::Tensor mask) {
//       torch::Tensor x = embed(tokens);
//       for (Block& block : blocks)
//         x = accel::forward(block, x, mask);   // was: block->forward(x, mask)
//       return head(x);
//     }
//     std::vector<Block> blocks;   // registered in a ModuleList "blocks"
//   };
//   accel::fully_shard(block);   // optional: exactly these are the units
//
// accel::forward(layer, args...) calls layer->forward(args...) with any
// arguments and returns what it returns (a tensor, or a vector, tuple or
// pair of tensors). Outside ZeRO stage 3, or for a layer that is no unit,
// it is exactly that call.
//
// Which layers become units (Accelerate's auto_wrap_policy, FSDP2's
// fully_shard), at prepare:
//   - the modules marked with accel::fully_shard, when any is;
//   - else, with a layer type (--fsdp_transformer_layer_cls_to_wrap),
//     every module of that class (Module::name(), with or without the
//     "Impl" suffix and namespace) anywhere in the model;
//   - else the children of each outermost Sequential and the entries of
//     each outermost ModuleList.
// A unit's own submodules are not searched again, modules without
// trainable parameters (activations, dropout) stay as they are, and the
// units are numbered in the order the model registers them, which should
// be the order its forward runs them (the next unit's gather is started
// before a unit runs, the previous one's in backward).
//
// Between uses a unit's parameters hold no values; reading them (calling a
// unit's forward directly instead of through accel::forward, or a layer
// outside its model) ends the process with a message saying so
// (released_memory.h) instead of reading freed memory.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/memory/activation_checkpoint.h"

namespace accel {

// What a unit asks of the sharded optimizer (zero.h) around its forward,
// and before its backward (the gradient arriving at its output).
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  virtual void BeforeForward(size_t unit) = 0;
  virtual void AfterForward(size_t unit) = 0;
  virtual void BeforeBackward(size_t unit) = 0;
  // What the unit's floating-point tensor arguments are cast to before its
  // forward (mixed precision's cast_forward_inputs), or nothing.
  virtual std::optional<c10::ScalarType> InputDtype(size_t /*unit*/) const {
    return std::nullopt;
  }
};

// A unit: a module of the model and its name in it ("blocks.3").
struct ShardedUnit {
  std::shared_ptr<torch::nn::Module> module;
  std::string path;
};

struct FullyShardOptions {
  // Whenever the module runs through accel::forward (or its Sequential),
  // its activations are recomputed in backward instead of kept
  // (accel::checkpoint, activation_checkpoint.h), at any ZeRO stage:
  // Accelerate's fsdp_activation_checkpointing, per unit.
  bool activation_checkpointing = false;
  // FSDP2's reshard_after_forward, under ZeRO stage 3: false keeps the
  // unit's parameters gathered from its forward until its gradients are
  // in (no second all-gather in backward, at the cost of the whole unit's
  // parameters meanwhile: ZeRO-2 for this unit). A forward without grad
  // mode, or one that activation checkpointing runs, reshards anyway.
  bool reshard_after_forward = true;
};

// Marks `module` as a unit for ZeRO stage 3 (FSDP2's fully_shard): once
// any module of a model is marked, the marked ones (the outermost, where
// marks nest) are its units. Call before prepare; marking again replaces
// the options.
void fully_shard(const std::shared_ptr<torch::nn::Module>& module,
                 const FullyShardOptions& options = {});
template <typename ModuleType>
void fully_shard(const torch::nn::ModuleHolder<ModuleType>& module,
                 const FullyShardOptions& options = {}) {
  fully_shard(module.ptr(), options);
}

// Picks the units (see above) and puts a ShardedUnit in place of each
// Sequential child among them; returns them in registration order, empty
// when the model has none.
std::vector<ShardedUnit> WrapUnits(torch::nn::Module& model,
                                   const std::string& layer_type);

// From now on, the unit's forward gathers through `runner` as unit
// `index` (until the runner is gone).
void AttachUnit(const ShardedUnit& unit, std::weak_ptr<UnitRunner> runner,
                size_t index);
// Whether the unit is attached to a runner that is still there.
bool IsAttached(const ShardedUnit& unit);

// What a Sequential runs in place of a unit.
class ShardedUnitImpl : public torch::nn::Module {
 public:
  explicit ShardedUnitImpl(torch::nn::AnyModule layer);
  torch::Tensor forward(torch::Tensor input);
  // The layer it runs as a unit.
  const torch::nn::AnyModule& layer() const { return layer_; }

 private:
  torch::nn::AnyModule layer_;
};

namespace unit_internal {

// One call of a unit's forward: gathers its parameters (when the module is
// an attached unit), hooks its outputs so that their gradients gather them
// again for backward, and frees them at Finish (or when an exception
// leaves the call).
class UnitCall {
 public:
  explicit UnitCall(const torch::nn::Module& module);
  ~UnitCall();
  UnitCall(const UnitCall&) = delete;
  UnitCall& operator=(const UnitCall&) = delete;

  void HookOutput(const torch::Tensor& output);
  void Finish();
  // UnitRunner::InputDtype of this unit.
  std::optional<c10::ScalarType> input_dtype() const;

 private:
  std::shared_ptr<UnitRunner> runner_;  // Null: no unit, nothing to do.
  size_t index_ = 0;
  bool recomputing_ = false;
  bool reshard_ = true;  // AfterForward frees the unit (reshard_after_forward).
};

// Whether fully_shard asked for the module's activations to be recomputed
// (and grad mode is on, so that there is a backward to recompute them for).
bool RecomputesActivations(const torch::nn::Module& module);

// call_forward(args...), the forward of `unit`, with its parameters
// gathered around it (when it is an attached unit).
template <typename Output, typename CallForward, typename... Args>
Output CallUnit(const torch::nn::Module& unit, const CallForward& call_forward,
                Args&&... args);
// CallUnit, inside accel::checkpoint when fully_shard asked for it.
template <typename Output, typename CallForward, typename... Args>
Output RunUnit(const torch::nn::Module& unit, const CallForward& call_forward,
               Args&&... args);

template <typename T>
struct IsTensors : std::false_type {};
template <>
struct IsTensors<torch::Tensor> : std::true_type {};
template <typename T>
struct IsTensors<std::vector<T>> : IsTensors<T> {};
template <typename A, typename B>
struct IsTensors<std::pair<A, B>>
    : std::bool_constant<IsTensors<A>::value && IsTensors<B>::value> {};
template <typename... T>
struct IsTensors<std::tuple<T...>>
    : std::bool_constant<(IsTensors<T>::value && ...)> {};

inline void HookOutputs(UnitCall& call, const torch::Tensor& output) {
  call.HookOutput(output);
}
template <typename T>
void HookOutputs(UnitCall& call, const std::vector<T>& outputs) {
  for (const T& output : outputs) HookOutputs(call, output);
}
template <typename A, typename B>
void HookOutputs(UnitCall& call, const std::pair<A, B>& outputs) {
  HookOutputs(call, outputs.first);
  HookOutputs(call, outputs.second);
}
template <typename... T>
void HookOutputs(UnitCall& call, const std::tuple<T...>& outputs) {
  std::apply([&](const auto&... each) { (HookOutputs(call, each), ...); },
             outputs);
}

// The module of a holder (Block, const or not), a std::shared_ptr<BlockImpl>
// or a BlockImpl&: a holder captured by a lambda's copy is const, but its
// module is not.
template <typename Layer>
auto& ModuleOf(Layer& layer) {
  using Bare = std::remove_const_t<Layer>;
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, Bare>) {
    return *layer.ptr();
  } else if constexpr (std::is_base_of_v<torch::nn::Module, Bare>) {
    return layer;
  } else {
    return *layer;
  }
}

// An argument of a unit's forward: a floating-point tensor passed by value
// or const reference goes to `dtype` (when there is one); anything else as
// it is. (accel::forward passes a named tensor as a copy of its handle when
// the layer takes one: see TensorCopy.)
template <typename T>
decltype(auto) CastInput(const std::optional<c10::ScalarType>& dtype, T&& arg) {
  using Bare = std::remove_reference_t<T>;
  constexpr bool kMutableReference =
      std::is_lvalue_reference_v<T> && !std::is_const_v<Bare>;
  if constexpr (std::is_same_v<std::remove_const_t<Bare>, torch::Tensor> &&
                !kMutableReference) {
    if (dtype && arg.defined() && arg.is_floating_point() &&
        arg.scalar_type() != *dtype) {
      return torch::Tensor(arg.to(*dtype));
    }
    return torch::Tensor(std::forward<T>(arg));
  } else {
    return std::forward<T>(arg);
  }
}

// How accel::forward passes an argument on: a tensor as a handle of its
// own (so that CastInput may cast it), anything else as it came.
template <typename T>
using TensorCopy = std::conditional_t<
    std::is_same_v<std::remove_cv_t<std::remove_reference_t<T>>, torch::Tensor>,
    torch::Tensor, T&&>;
template <typename T>
TensorCopy<T> PassOn(T&& arg) {
  return std::forward<T>(arg);
}
// Whether Module's forward takes the arguments so passed: not when it
// takes a tensor by non-const reference (it may mean to change the
// caller's handle, which then must be the caller's own).
template <typename Void, typename Module, typename... Args>
struct TakesTensorCopies : std::false_type {};
template <typename Module, typename... Args>
struct TakesTensorCopies<std::void_t<decltype(std::declval<Module&>().forward(
                             std::declval<TensorCopy<Args>>()...))>,
                         Module, Args...> : std::true_type {};

// What accel::checkpoint returns: a tensor, a vector or a tuple of them.
template <typename T>
inline constexpr bool kCheckpointable = false;
template <>
inline constexpr bool kCheckpointable<torch::Tensor> = true;
template <>
inline constexpr bool kCheckpointable<std::vector<torch::Tensor>> = true;
template <typename... T>
inline constexpr bool kCheckpointable<std::tuple<T...>> =
    (std::is_same_v<T, torch::Tensor> && ...);

// UsageError: the module returns what accel::checkpoint cannot.
[[noreturn]] void RefuseCheckpointOfPair(const torch::nn::Module& module);

}  // namespace unit_internal

// layer->forward(args...), with the layer's parameters gathered around it
// when it is a ZeRO stage-3 unit (see above). `layer`: a module holder
// (Block), a std::shared_ptr<BlockImpl>, or a BlockImpl&.
template <typename Layer, typename... Args>
auto forward(Layer& layer, Args&&... args) {
  auto& module = unit_internal::ModuleOf(layer);
  using Output =
      std::decay_t<decltype(module.forward(std::forward<Args>(args)...))>;
  static_assert(unit_internal::IsTensors<Output>::value,
                "accel::forward: a layer's forward must return a "
                "torch::Tensor, or a std::vector, std::pair or std::tuple of "
                "them, so that its backward can gather the unit's parameters "
                "again");
  // Copied into accel::checkpoint (kept until backward): holds the module
  // by reference only.
  const auto call_forward = [&module](auto&&... inputs) -> Output {
    return module.forward(std::forward<decltype(inputs)>(inputs)...);
  };
  using Module = std::remove_reference_t<decltype(module)>;
  if constexpr (unit_internal::TakesTensorCopies<void, Module,
                                                 Args...>::value) {
    // A named tensor (x, mask) comes as a non-const reference; a copy of
    // its handle lets cast_forward_inputs cast it as FSDP2 does.
    return unit_internal::RunUnit<Output>(
        module, call_forward,
        unit_internal::PassOn<Args>(std::forward<Args>(args))...);
  } else {
    return unit_internal::RunUnit<Output>(module, call_forward,
                                          std::forward<Args>(args)...);
  }
}

template <typename Output, typename CallForward, typename... Args>
Output unit_internal::CallUnit(const torch::nn::Module& unit,
                               const CallForward& call_forward,
                               Args&&... args) {
  UnitCall call(unit);
  const std::optional<c10::ScalarType> dtype = call.input_dtype();
  Output output = call_forward(CastInput(dtype, std::forward<Args>(args))...);
  HookOutputs(call, output);
  call.Finish();
  return output;
}

template <typename Output, typename CallForward, typename... Args>
Output unit_internal::RunUnit(const torch::nn::Module& unit,
                              const CallForward& call_forward, Args&&... args) {
  if (RecomputesActivations(unit)) {
    if constexpr (kCheckpointable<Output>) {
      return checkpoint(
          [&unit, call_forward](auto&&... inputs) {
            return CallUnit<Output>(unit, call_forward,
                                    std::forward<decltype(inputs)>(inputs)...);
          },
          std::forward<Args>(args)...);
    } else {
      RefuseCheckpointOfPair(unit);
    }
  }
  return CallUnit<Output>(unit, call_forward, std::forward<Args>(args)...);
}

}  // namespace accel
