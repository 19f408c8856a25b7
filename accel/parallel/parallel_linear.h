// Tensor-parallel linear layers and torch's parallelize_module: a model
// written with accel::ParallelLinear (a torch::nn::Linear until
// parallelized: the same options, parameters, initialisation and forward)
// is split over a tensor-parallel group by a plan that names its layers.
//
//   // In the model: torch::nn::Linear fc_{nullptr}; becomes
//   accel::ParallelLinear fc_{nullptr};   // fc_ = register_module("fc",
//                                         //   accel::ParallelLinear(64, 256));
//   // After building it, before prepare (every rank of the group alike):
//   accel::parallelize_module(*model, mesh->group("tp"),
//       {{"blocks.*.attention.qkv", accel::ColwiseParallel{.fused = 3}},
//        {"blocks.*.attention.proj", accel::RowwiseParallel{}},
//        {"blocks.*.fc", accel::ColwiseParallel{}},
//        {"blocks.*.fc_proj", accel::RowwiseParallel{}}});
//
// Megatron-LM's scheme: a column-parallel layer keeps its rank's share of
// the output features (each of `fused` equal blocks split alike, for a
// fused q|k|v projection) and takes the whole input (its gradient summed
// over the group: f); a row-parallel layer keeps its rank's share of the
// input features, takes the matching share of the input, and sums its
// outputs over the group (g), adding its whole bias after. Between a
// column- and a row-parallel layer each rank holds a share of the hidden
// features (of the attention heads), and nothing travels. With
// sequence_parallel the input of a column-parallel layer is split along the
// sequence (dim 1) and gathered, and a row-parallel layer's output is
// reduce-scattered back to this rank's part of the sequence (its bias's
// gradient summed over the group in backward, so that it is the whole
// sequence's on every rank).
//
// Differences from torch's parallelize_module, on purpose: LibTorch modules
// have no forward hooks, so the layers to split must be ParallelLinear (a
// torch::nn::Linear named by the plan is a UsageError saying so); the
// parameters stay plain tensors holding this rank's share (no DTensor).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "accel/core/tensor_split.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// A parameter a parallelized layer split, and how: this rank holds share
// `rank` of it (accel/core/tensor_split.h).
struct SplitParameter {
  torch::Tensor tensor;
  TensorSplit split;
  int rank = 0;
};

// torch's ColwiseParallel: the output features are split.
struct ColwiseParallel {
  // The weight's rows are this many equal blocks, each split alike (3 for
  // a fused q|k|v projection).
  int64_t fused = 1;
  // The input is split along dim 1 (the sequence), gathered here.
  bool sequence_parallel = false;
};

// torch's RowwiseParallel: the input features are split.
struct RowwiseParallel {
  // The output is reduce-scattered along dim 1 (the sequence) rather than
  // all-reduced.
  bool sequence_parallel = false;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel>;

class ParallelLinearImpl : public torch::nn::Module {
 public:
  ParallelLinearImpl(int64_t in_features, int64_t out_features)
      : ParallelLinearImpl(
            torch::nn::LinearOptions(in_features, out_features)) {}
  explicit ParallelLinearImpl(const torch::nn::LinearOptions& options);

  torch::Tensor forward(const torch::Tensor& input);

  // Keeps this rank's share of the parameters and computes as `style`
  // says over `group` (parallelize_module calls it). UsageError when the
  // features do not split evenly, or when it is split already.
  void Parallelize(Communicator& group, const ParallelStyle& style);
  // Parallelize's checks alone.
  void CheckParallelizable(const Communicator& group,
                           const ParallelStyle& style) const;
  // Whether Parallelize split it (over a group of more than one rank).
  bool parallel() const { return group_ != nullptr; }
  // Whether it is split column-wise (its bias split too), once parallel.
  bool column_parallel() const {
    return parallel() && std::holds_alternative<ColwiseParallel>(style_);
  }
  // The parameters it split (none until parallel): a column-parallel
  // layer's weight and bias along dim 0, a row-parallel layer's weight
  // along dim 1 (its bias stays whole).
  std::vector<SplitParameter> SplitParameters() const;

  torch::nn::LinearOptions options;
  torch::Tensor weight;
  torch::Tensor bias;  // Undefined without one.

 private:
  Communicator* group_ = nullptr;
  ParallelStyle style_;
};
TORCH_MODULE(ParallelLinear);

// torch's parallelize_module: each plan entry's pattern is matched against
// the names of `model`'s modules (named_modules: "blocks.0.fc"), "*"
// standing for one name between dots; every matched module must be a
// ParallelLinear and is split over `group` as the entry's style says.
// Every rank of the group calls it alike, before prepare() (the optimizer
// must be built over the split parameters). Returns how many layers were
// split. UsageError for a pattern that matches no module, a module matched
// by two entries, or one that is not a ParallelLinear. A group of one rank
// changes nothing.
int parallelize_module(
    torch::nn::Module& model, Communicator& group,
    const std::vector<std::pair<std::string, ParallelStyle>>& plan);

// Every parameter `model`'s parallelized layers split, in modules() order.
std::vector<SplitParameter> TensorParallelSplits(
    const torch::nn::Module& model);

// The parameters that `model`'s parallelized layers split (each rank holds
// a different share of them; the others are the same on every rank of the
// group), as TensorImpl addresses.
std::vector<const void*> TensorParallelParameters(
    const torch::nn::Module& model);

}  // namespace accel
