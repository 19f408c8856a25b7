// Activation checkpointing, which LibTorch's C++ API lacks
// (torch.utils.checkpoint, its reentrant kind): trades compute for memory by
// keeping only a block's inputs in forward and recomputing its activations
// in backward, so that what a deep model keeps for backward grows with its
// blocks' inputs rather than with every intermediate tensor.
//
//   for (auto& block : blocks) {   // std::vector<Block>
//     hidden = accel::checkpoint(
//         [b = block.ptr()](const torch::Tensor& h) { return b->forward(h); },
//         hidden);
//   }
//   loss = criterion(head->forward(hidden), target);
//   loss.backward();  // re-runs each block, parameters get their .grad
//
// Forward runs fn(args...) without grad and keeps its tensor arguments.
// Backward re-runs fn with grad on detached copies of them and
// back-propagates the incoming gradients through that recomputed graph
// (torch::autograd::backward inside the checkpoint's backward), so the
// parameters fn uses accumulate their .grad and their gradient hooks fire as
// without checkpointing; the tensor arguments that require grad then get
// theirs. The recompute sees the RNG state (dropout draws the same masks)
// and CPU/CUDA autocast settings that forward saw.
//
// Arguments: each top-level torch::Tensor argument is an input of the
// checkpoint (those requiring grad get gradients); every other argument
// (numbers, modules, tensors inside a vector or an optional) is copied, kept
// until backward and passed again as is, so tensors hidden in them get no
// gradient. fn is copied and kept until backward too: what it captures by
// reference must outlive backward.
//
// fn returns a torch::Tensor, a std::vector<torch::Tensor> or a std::tuple of
// torch::Tensor; each must be defined, and integral outputs get no gradient.
//
// Without checkpointing: with grad mode off (torch::NoGradGuard, inference
// mode) fn just runs. When no tensor argument requires grad, fn also just
// runs with grad on, so that the parameters inside it get their gradients
// (torch's reentrant checkpoint would give them none, with only a warning);
// no memory is saved then, and a warning says so once (TORCH_WARN_ONCE) if
// fn built a graph. Checkpoint from the first block whose input requires
// grad.
//
// Limits (as torch's reentrant checkpoint): backward through it works with
// tensor.backward() / torch::autograd::backward() but not with
// torch::autograd::grad() or backward's `inputs` (an error says so), nor with
// create_graph (no double backward). A second backward through the same
// call needs retain_graph = true on the first, else an error says so.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel {

struct ActivationCheckpointOptions {
  // Restore in the recompute the RNG state forward began with: the CPU's
  // default generator and that of each CUDA device an input is on (as
  // torch's, other devices' generators are not saved), so that dropout draws
  // the same masks and the gradients are those of the forward that ran.
  // false saves copying the states when fn draws no random numbers.
  bool preserve_rng_state = true;
};

// True while the calling thread re-runs a checkpointed fn in backward (not
// during its first run in forward, nor while the gradients then flow through
// the recomputed graph). ZeRO stage 3 keeps a unit's parameters gathered
// after a forward that is a recompute, since its backward follows at once.
bool InActivationRecompute();

template <typename Fn, typename... Args>
auto checkpoint(const ActivationCheckpointOptions& options, Fn&& fn,
                Args&&... args);

template <typename Fn, typename... Args,
          std::enable_if_t<
              !std::is_same_v<std::decay_t<Fn>, ActivationCheckpointOptions>,
              int> = 0>
auto checkpoint(Fn&& fn, Args&&... args) {
  return checkpoint(ActivationCheckpointOptions{}, std::forward<Fn>(fn),
                    std::forward<Args>(args)...);
}

namespace activation_checkpoint_internal {

// fn with its non-tensor arguments bound: takes the tensor arguments in
// order, returns the outputs flattened.
using Recompute =
    std::function<std::vector<torch::Tensor>(std::vector<torch::Tensor>&)>;

// The type-erased checkpoint (activation_checkpoint.cc).
std::vector<torch::Tensor> Run(const ActivationCheckpointOptions& options,
                               Recompute recompute,
                               std::vector<torch::Tensor> inputs);

template <typename T>
inline constexpr bool kIsTensor =
    std::is_same_v<std::decay_t<T>, torch::Tensor>;

// What stands in a tensor argument's place among the kept arguments: the
// tensor itself is kept by autograd (so that a freed graph frees it).
struct TensorSlot {};

template <typename T>
using Kept = std::conditional_t<kIsTensor<T>, TensorSlot, std::decay_t<T>>;

template <typename T>
Kept<T> Keep(T&& arg) {
  if constexpr (kIsTensor<T>) {
    return TensorSlot{};
  } else {
    return std::forward<T>(arg);
  }
}

// For each argument, its index among the tensor arguments.
template <typename... Args>
constexpr std::array<size_t, sizeof...(Args)> TensorIndices() {
  constexpr bool kTensor[] = {kIsTensor<Args>..., false};
  std::array<size_t, sizeof...(Args)> indices{};
  size_t next = 0;
  for (size_t i = 0; i < sizeof...(Args); ++i) {
    indices[i] = next;
    next += kTensor[i] ? 1 : 0;
  }
  return indices;
}

template <typename R>
struct Outputs {
  static_assert(sizeof(R) == 0,
                "accel::checkpoint: fn must return torch::Tensor, "
                "std::vector<torch::Tensor> or std::tuple of torch::Tensor");
};

template <>
struct Outputs<torch::Tensor> {
  static std::vector<torch::Tensor> Flatten(torch::Tensor output) {
    return {std::move(output)};
  }
  static torch::Tensor Unflatten(std::vector<torch::Tensor> outputs) {
    return std::move(outputs[0]);
  }
};

template <>
struct Outputs<std::vector<torch::Tensor>> {
  static std::vector<torch::Tensor> Flatten(
      std::vector<torch::Tensor> outputs) {
    return outputs;
  }
  static std::vector<torch::Tensor> Unflatten(
      std::vector<torch::Tensor> outputs) {
    return outputs;
  }
};

template <typename... T>
struct Outputs<std::tuple<T...>> {
  static_assert((std::is_same_v<T, torch::Tensor> && ...),
                "accel::checkpoint: a tuple fn returns must hold only "
                "torch::Tensor");
  static std::vector<torch::Tensor> Flatten(std::tuple<T...> outputs) {
    return std::apply(
        [](auto&&... tensors) {
          return std::vector<torch::Tensor>{std::move(tensors)...};
        },
        std::move(outputs));
  }
  static std::tuple<T...> Unflatten(std::vector<torch::Tensor> outputs) {
    return UnflattenAt(std::move(outputs), std::index_sequence_for<T...>{});
  }
  template <size_t... I>
  static std::tuple<T...> UnflattenAt(std::vector<torch::Tensor> outputs,
                                      std::index_sequence<I...>) {
    return std::tuple<T...>(std::move(outputs[I])...);
  }
};

// Calls fn with argument I taken from `tensors` when it is a tensor, else
// from the kept ones.
template <typename... Args, typename Fn, typename KeptArgs, size_t... I>
decltype(auto) Invoke(Fn& fn, KeptArgs& kept,
                      std::vector<torch::Tensor>& tensors,
                      std::index_sequence<I...>) {
  constexpr std::array<size_t, sizeof...(Args)> kIndex =
      TensorIndices<Args...>();
  auto pick = [&](auto position) -> decltype(auto) {
    constexpr size_t kAt = decltype(position)::value;
    using Arg = std::tuple_element_t<kAt, std::tuple<Args...>>;
    if constexpr (kIsTensor<Arg>) {
      return (tensors[kIndex[kAt]]);
    } else {
      return (std::get<kAt>(kept));
    }
  };
  return std::invoke(fn, pick(std::integral_constant<size_t, I>{})...);
}

}  // namespace activation_checkpoint_internal

template <typename Fn, typename... Args>
auto checkpoint(const ActivationCheckpointOptions& options, Fn&& fn,
                Args&&... args) {
  namespace internal = activation_checkpoint_internal;
  using KeptArgs = std::tuple<internal::Kept<Args>...>;
  using Result = std::decay_t<decltype(internal::Invoke<Args...>(
      std::declval<std::decay_t<Fn>&>(), std::declval<KeptArgs&>(),
      std::declval<std::vector<torch::Tensor>&>(),
      std::index_sequence_for<Args...>{}))>;
  std::vector<torch::Tensor> inputs;
  inputs.reserve(sizeof...(Args));
  (
      [&](const auto& arg) {
        if constexpr (internal::kIsTensor<decltype(arg)>) {
          inputs.push_back(arg);
        }
      }(args),
      ...);
  internal::Recompute recompute =
      [fn = std::decay_t<Fn>(std::forward<Fn>(fn)),
       kept = KeptArgs(internal::Keep(std::forward<Args>(args))...)](
          std::vector<torch::Tensor>& tensors) mutable {
        return internal::Outputs<Result>::Flatten(internal::Invoke<Args...>(
            fn, kept, tensors, std::index_sequence_for<Args...>{}));
      };
  return internal::Outputs<Result>::Unflatten(
      internal::Run(options, std::move(recompute), std::move(inputs)));
}

}  // namespace accel
