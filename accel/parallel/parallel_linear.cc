#include "accel/parallel/parallel_linear.h"

#include <torch/nn/functional/linear.h>

#include <map>
#include <string>
#include <vector>

#include "accel/core/tensor_split.h"
#include "accel/parallel/tensor_parallel.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// Whether `name` ("blocks.0.fc") matches `pattern` ("blocks.*.fc"): "*"
// stands for one whole name between dots.
bool Matches(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0;
  while (p < pattern.size() && n <= name.size()) {
    if (pattern[p] == '*') {
      const size_t dot = name.find('.', n);
      n = dot == std::string::npos ? name.size() : dot;
      ++p;
      continue;
    }
    if (n == name.size() || pattern[p] != name[n]) return false;
    ++p;
    ++n;
  }
  return p == pattern.size() && n == name.size();
}

void RequireSplit(const std::string& what, int64_t features, int64_t blocks,
                  int size) {
  if (features % (blocks * size) != 0) {
    throw UsageError("parallelize_module: " + what + " (" +
                     std::to_string(features) +
                     (blocks > 1 ? " in " + std::to_string(blocks) + " blocks"
                                 : std::string()) +
                     ") does not split evenly over " + std::to_string(size) +
                     " tensor-parallel ranks");
  }
}

}  // namespace

ParallelLinearImpl::ParallelLinearImpl(const torch::nn::LinearOptions& options)
    : options(options) {
  // torch::nn::Linear's initialisation, random numbers and all: a model
  // that swaps its Linears for these starts from the same weights.
  torch::nn::Linear linear(options);
  weight = register_parameter("weight", linear->weight);
  if (options.bias()) bias = register_parameter("bias", linear->bias);
}

torch::Tensor ParallelLinearImpl::forward(const torch::Tensor& input) {
  namespace F = torch::nn::functional;
  if (group_ == nullptr) return F::linear(input, weight, bias);
  if (const auto* column = std::get_if<ColwiseParallel>(&style_)) {
    const torch::Tensor whole = column->sequence_parallel
                                    ? tp::GatherSequence(input, *group_, 1)
                                    : tp::CopyToRegion(input, *group_);
    return F::linear(whole, weight, bias);
  }
  const auto& row = std::get<RowwiseParallel>(style_);
  const torch::Tensor partial = F::linear(input, weight);
  torch::Tensor output = row.sequence_parallel
                             ? tp::ReduceScatterSequence(partial, *group_, 1)
                             : tp::ReduceFromRegion(partial, *group_);
  if (!bias.defined()) return output;
  // Under sequence parallelism each rank adds the bias to its part of the
  // sequence only: its gradient is that part's, summed over the group in
  // backward to the whole sequence's (as one process has it).
  return output +
         (row.sequence_parallel ? tp::CopyToRegion(bias, *group_) : bias);
}

void ParallelLinearImpl::CheckParallelizable(const Communicator& group,
                                             const ParallelStyle& style) const {
  if (group_ != nullptr) {
    throw UsageError("parallelize_module: a layer is parallelized already");
  }
  if (const auto* column = std::get_if<ColwiseParallel>(&style)) {
    if (column->fused < 1) {
      throw UsageError(
          "parallelize_module: ColwiseParallel's fused must be at least 1, "
          "found " +
          std::to_string(column->fused));
    }
    RequireSplit("a column-parallel layer's out_features",
                 options.out_features(), column->fused, group.size());
  } else {
    RequireSplit("a row-parallel layer's in_features", options.in_features(), 1,
                 group.size());
  }
}

void ParallelLinearImpl::Parallelize(Communicator& group,
                                     const ParallelStyle& style) {
  CheckParallelizable(group, style);
  const int size = group.size();
  const int rank = group.rank();
  torch::NoGradGuard no_grad;
  if (const auto* column = std::get_if<ColwiseParallel>(&style)) {
    const TensorSplit rows{.dim = 0, .fused = column->fused, .size = size};
    weight.set_data(ShareOf(weight, rows, rank));
    if (bias.defined()) bias.set_data(ShareOf(bias, rows, rank));
  } else {
    weight.set_data(ShareOf(weight, {.dim = 1, .size = size}, rank));
  }
  style_ = style;
  if (size > 1) group_ = &group;
}

int parallelize_module(
    torch::nn::Module& model, Communicator& group,
    const std::vector<std::pair<std::string, ParallelStyle>>& plan) {
  std::map<std::string, std::string> claimed;  // Module name -> pattern.
  std::vector<std::pair<ParallelLinearImpl*, const ParallelStyle*>> split;
  const auto names = model.named_modules().items();
  for (const auto& [pattern, style] : plan) {
    int matched = 0;
    for (const auto& item : names) {
      if (!Matches(pattern, item.key())) continue;
      ++matched;
      const auto [at, added] = claimed.emplace(item.key(), pattern);
      if (!added) {
        throw UsageError("parallelize_module: '" + item.key() +
                         "' is matched by both '" + at->second + "' and '" +
                         pattern + "'");
      }
      auto* linear = dynamic_cast<ParallelLinearImpl*>(item.value().get());
      if (linear == nullptr) {
        throw UsageError(
            "parallelize_module: '" + item.key() + "' (matched by '" + pattern +
            "') is a " + item.value()->name() +
            ", not an accel::ParallelLinear; LibTorch modules have no "
            "forward hooks to add the communication to, so build the "
            "layers to split as accel::ParallelLinear (a Linear until "
            "split)");
      }
      linear->CheckParallelizable(group, style);
      split.emplace_back(linear, &style);
    }
    if (matched == 0) {
      throw UsageError("parallelize_module: '" + pattern +
                       "' matches no module of the model (names look like '" +
                       (names.size() > 1 ? names[1].key() : std::string("fc")) +
                       "')");
    }
  }
  // Every check above before any layer changes.
  for (const auto& [linear, style] : split) linear->Parallelize(group, *style);
  return static_cast<int>(split.size());
}

std::vector<SplitParameter> ParallelLinearImpl::SplitParameters() const {
  if (group_ == nullptr) return {};
  const int size = group_->size(), rank = group_->rank();
  if (const auto* column = std::get_if<ColwiseParallel>(&style_)) {
    const TensorSplit rows{.dim = 0, .fused = column->fused, .size = size};
    std::vector<SplitParameter> split{{weight, rows, rank}};
    if (bias.defined()) split.push_back({bias, rows, rank});
    return split;
  }
  // A row-parallel layer's bias is whole on every rank.
  return {{weight, {.dim = 1, .size = size}, rank}};
}

std::vector<SplitParameter> TensorParallelSplits(
    const torch::nn::Module& model) {
  std::vector<SplitParameter> split;
  for (const auto& module : model.modules()) {
    const auto* linear = dynamic_cast<const ParallelLinearImpl*>(module.get());
    if (linear == nullptr) continue;
    for (SplitParameter& parameter : linear->SplitParameters()) {
      split.push_back(std::move(parameter));
    }
  }
  return split;
}

std::vector<const void*> TensorParallelParameters(
    const torch::nn::Module& model) {
  std::vector<const void*> keys;
  for (const SplitParameter& parameter : TensorParallelSplits(model)) {
    keys.push_back(parameter.tensor.unsafeGetTensorImpl());
  }
  return keys;
}

}  // namespace accel
