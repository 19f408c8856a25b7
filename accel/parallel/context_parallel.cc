#include "accel/parallel/context_parallel.h"

#include <torch/autograd.h>

#include <string>
#include <vector>

#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/errors.h"

namespace accel::cp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t Dim(const torch::Tensor& x, int64_t dim) {
  return dim < 0 ? dim + x.dim() : dim;
}

void RequireDivisible(const torch::Tensor& x, int64_t dim,
                      const Communicator& group, const char* api) {
  if (dim < 0 || dim >= x.dim() || x.size(dim) % group.size() != 0) {
    throw UsageError(std::string(api) + ": dimension " + std::to_string(dim) +
                     " of a tensor of shape " + c10::str(x.sizes()) +
                     " does not split evenly over the " +
                     std::to_string(group.size()) + " ranks of " +
                     (group.group_name().empty()
                          ? std::string("the job")
                          : "group '" + group.group_name() + "'"));
  }
}

// Block r of `x` along `scatter` goes to rank r; the blocks received are
// concatenated along `gather` in rank order.
torch::Tensor AllToAll(const torch::Tensor& x, Communicator& group,
                       int64_t scatter, int64_t gather, const char* api) {
  RequireDivisible(x, scatter, group, api);
  const int size = group.size();
  // [size, ...block]: block r contiguous, in rank order.
  const torch::Tensor blocks =
      torch::stack(x.chunk(size, scatter)).contiguous();
  torch::Tensor received = torch::empty_like(blocks);
  if (blocks.numel() > 0) {
    CollectiveOptions options;
    options.api = api;
    group.all_to_all(blocks.data_ptr(), received.data_ptr(),
                     static_cast<size_t>(blocks.numel() / size),
                     ToDType(blocks.scalar_type()), options);
  }
  return torch::cat(received.unbind(0), gather);
}

struct Exchange : torch::autograd::Function<Exchange> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               int64_t group, int64_t scatter, int64_t gather) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["scatter"] = scatter;
    ctx->saved_data["gather"] = gather;
    return AllToAll(
        x, *reinterpret_cast<Communicator*>(static_cast<intptr_t>(group)),
        scatter, gather, "context parallel forward");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& group = *reinterpret_cast<Communicator*>(
        static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    const torch::Tensor grad = AllToAll(
        grads[0].contiguous(), group, ctx->saved_data["gather"].toInt(),
        ctx->saved_data["scatter"].toInt(), "context parallel backward");
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor Apply(const torch::Tensor& x, Communicator& group,
                    int64_t scatter, int64_t gather, const char* api) {
  scatter = Dim(x, scatter);
  gather = Dim(x, gather);
  if (scatter == gather) {
    throw UsageError(std::string(api) +
                     ": the sequence and head dimensions are the same (" +
                     std::to_string(scatter) + ")");
  }
  RequireDivisible(x, scatter, group, api);
  if (group.size() == 1) return x;
  // The group outlives the graph (the mesh owns it): its address travels
  // through autograd's saved data.
  return Exchange::apply(
      x, static_cast<int64_t>(reinterpret_cast<intptr_t>(&group)), scatter,
      gather);
}

}  // namespace

torch::Tensor SequenceToHeads(const torch::Tensor& x, Communicator& group,
                              int64_t sequence_dim, int64_t head_dim) {
  return Apply(x, group, head_dim, sequence_dim, "cp::SequenceToHeads");
}

torch::Tensor HeadsToSequence(const torch::Tensor& x, Communicator& group,
                              int64_t sequence_dim, int64_t head_dim) {
  return Apply(x, group, sequence_dim, head_dim, "cp::HeadsToSequence");
}

torch::Tensor ShardSequence(const torch::Tensor& x, const Communicator& group,
                            int64_t dim) {
  dim = Dim(x, dim);
  RequireDivisible(x, dim, group, "cp::ShardSequence");
  const int64_t part = x.size(dim) / group.size();
  return x.narrow(dim, part * group.rank(), part).contiguous();
}

}  // namespace accel::cp
